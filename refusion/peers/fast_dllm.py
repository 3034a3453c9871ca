"""Fast-dLLM's decoders (NVlabs/Fast-dLLM): LLaDA's ``generate`` with and without caches, and its Dream block
decoder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, refuse, taken
from refusion.peers.dream import translate_sampling


def llada_translator(function: str):
    """The translator of one of Fast-dLLM's LLaDA functions (``generate``, ``..._with_prefix_cache``,
    ``..._dual_cache``).

    ``threshold`` (a number) is the ``threshold`` selector's ``slot_threshold``
    (>=); ``threshold=None`` decodes LLaDA's fixed number of tokens per step
    (``llada-steps``, with ``steps`` and ``remasking``); ``factor`` is the
    ``factor`` selector with Fast-dLLM's rule (it wins over ``threshold``, as in
    Fast-dLLM). ``steps`` is unused unless ``threshold=None``, as in Fast-dLLM.
    """

    def translate(args: Mapping[str, Any], model: Any) -> PeerCall:
        check_mask_id(function, "mask_id", args.get("mask_id"), model)
        if args.get("step_callback") is not None:
            raise refuse(
                function,
                "step_callback",
                args["step_callback"],
                "refusion reports every step in its trace "
                "(`trace=`) and a Generator's progress events instead of calling back.",
            )
        params = taken(args, "block_length", "temperature")
        remasking = args.get("remasking", "low_confidence")
        if args.get("factor") is not None:
            selector = "factor"
            params.update(factor=args["factor"], rule="fast-dllm")
        elif "threshold" in args and args["threshold"] is None:
            selector = "llada-steps"
            params.update(taken(args, "steps", "remasking"))
        else:
            selector = "threshold"
            params.update({"slot_threshold": args["threshold"]} if "threshold" in args else {})
        if selector != "llada-steps" and remasking != "low_confidence":
            raise refuse(
                function,
                "remasking",
                remasking,
                "with a `threshold` or `factor` Fast-dLLM compares random "
                "numbers with the thresholds; refusion offers `remasking='random'` with `threshold=None` only.",
            )
        return PeerCall(parts={"selector": selector}, params=params)

    return translate


LLADA_ARGUMENTS = (
    "steps",
    "block_length",
    "temperature",
    "remasking",
    "mask_id",
    "threshold",
    "factor",
    "step_callback",
)

GENERATE = PeerFunction(
    "fast_dllm.generate",
    "fast-dllm",
    "NVlabs/Fast-dLLM llada/generate.py: generate",
    LLADA_ARGUMENTS,
    llada_translator("Fast-dLLM's generate"),
)
PREFIX_CACHE = PeerFunction(
    "fast_dllm.generate_with_prefix_cache",
    "fast-dllm-prefix",
    "NVlabs/Fast-dLLM llada/generate.py: generate_with_prefix_cache",
    LLADA_ARGUMENTS,
    llada_translator("Fast-dLLM's generate_with_prefix_cache"),
)
DUAL_CACHE = PeerFunction(
    "fast_dllm.generate_with_dual_cache",
    "fast-dllm-dual",
    "NVlabs/Fast-dLLM llada/generate.py: generate_with_dual_cache",
    LLADA_ARGUMENTS,
    llada_translator("Fast-dLLM's generate_with_dual_cache"),
)

DREAM_NAME = "Fast-dLLM's Dream block decoder"


def translate_dream_blocks(args: Mapping[str, Any], model: Any) -> PeerCall:
    """Fast-dLLM's ``diffusion_generate`` for Dream (``generation_utils_block.py``).

    ``block_length`` keeps its name; ``dual_cache`` picks the ``dual-cache``
    reorderer (else ``prefix-cache``: the decoder always caches); ``alg``
    ``"confidence_threshold"`` unmasks by ``threshold``, any other ``alg`` by
    entropy over ``steps`` (Fast-dLLM's other path scores every ``alg`` by
    entropy); sampling as Dream's.
    """
    call = translate_sampling(DREAM_NAME, args, model)
    params = dict(call.params)
    params.update(taken(args, "block_length", "steps", "eps", "threshold"))
    if "alg" in args:
        params["alg"] = "confidence_threshold" if args["alg"] == "confidence_threshold" else "entropy"
    if args.get("use_cache") is False:
        raise refuse(
            DREAM_NAME,
            "use_cache",
            False,
            "Fast-dLLM's block decoder always uses its cache; use the "
            "'dream' preset for Dream's own decoder without one.",
        )
    parts = {"reorderer": "dual-cache" if args.get("dual_cache") else "prefix-cache"}
    params["prefix_at_block"] = True  # Fast-dLLM caches exactly the positions before the block
    params["ties"] = "serial-block" if args.get("dual_cache") else "suffix"  # the row its topk ranks
    return PeerCall(parts=parts, params=params, gen_length=call.gen_length)


DREAM_BLOCKS = PeerFunction(
    "fast_dllm.dream_block_generate",
    "fast-dllm-dream",
    "NVlabs/Fast-dLLM dream/model/generation_utils_block.py: diffusion_generate",
    (
        "max_new_tokens",
        "max_length",
        "steps",
        "eps",
        "alg",
        "alg_temp",
        "temperature",
        "top_p",
        "top_k",
        "num_return_sequences",
        "return_dict_in_generate",
        "output_history",
        "mask_token_id",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "attention_mask",
        "threshold",
        "block_length",
        "dual_cache",
        "use_cache",
        "generation_config",
    ),
    translate_dream_blocks,
)

FUNCTIONS = (GENERATE, PREFIX_CACHE, DUAL_CACHE, DREAM_BLOCKS)
