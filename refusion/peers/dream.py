"""Dream's ``diffusion_generate`` (the ``DreamGenerationMixin`` published with Dream-v0) as the ``dream`` preset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, check_no_padding, length_argument, refuse, taken

NAME = "Dream's diffusion_generate"


def translate_sampling(function: str, args: Mapping[str, Any], model: Any) -> PeerCall:
    """What Dream's decoders share: length, sampling, special ids and the output options.

    ``max_new_tokens`` is ``gen_length``; ``temperature``/``top_p``/``top_k``
    configure the categorical sampler (at ``temperature`` 0 Dream takes the
    argmax whatever ``top_p``/``top_k`` say, and so does refusion, but its
    confidences are those of the filtered logits: ``confidence_top_k`` /
    ``confidence_top_p``, 50 / none unless given, as Dream's config defaults);
    ``return_dict_in_generate`` and ``output_history`` only shape Dream's
    output (refusion's result always has its steps); ``pad/bos/eos_token_id``
    are not read by Dream's sampler.
    """
    check_no_padding(function, args.get("attention_mask"))
    check_mask_id(function, "mask_token_id", args.get("mask_token_id"), model)
    if "max_length" in args and "max_new_tokens" not in args:
        raise refuse(
            function,
            "max_length",
            args["max_length"],
            "it counts the prompt; pass `max_new_tokens` "
            "(refusion's `gen_length`), which Dream prefers when both are given.",
        )
    if args.get("generation_config") is not None:
        raise refuse(function, "generation_config", args["generation_config"], "pass its fields as keyword arguments.")
    if args.get("num_return_sequences", 1) != 1:
        raise refuse(
            function,
            "num_return_sequences",
            args["num_return_sequences"],
            "pass the prompt several times in a list, with `seeds=`, for several samples.",
        )
    if args.get("alg_temp") not in (None, 0, 0.0):
        raise refuse(
            function,
            "alg_temp",
            args["alg_temp"],
            "drawing the positions to unmask from a softmax of the "
            "confidences is not implemented; use `alg_temp=None` (the most confident first).",
        )
    params: dict[str, Any] = {}
    temperature = args.get("temperature", 0.0)
    if temperature:
        params.update(temperature=temperature, **taken(args, "top_p", "top_k"))
        params = {k: v for k, v in params.items() if v is not None}
    else:  # Dream filters before its softmax at temperature 0 too: the confidences change, the argmax does not
        params.update({f"confidence_{k}": args[k] for k in ("top_k", "top_p") if k in args})
    return PeerCall(params=params, gen_length=length_argument(args))


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``steps``, ``eps`` and ``alg`` (origin, maskgit_plus, topk_margin, entropy) go to the ``dream-steps``
    selector."""
    for hook in ("generation_tokens_hook_func", "generation_logits_hook_func"):
        if args.get(hook) is not None:
            raise refuse(
                NAME,
                hook,
                args[hook],
                "refusion's parts are its hooks: write a selector or infiller plugin (docs/plugin_hooks.md).",
            )
    if args.get("alg") == "confidence_threshold":
        raise refuse(
            NAME,
            "alg",
            "confidence_threshold",
            "that is Fast-dLLM's addition to Dream's sampler; use the 'fast-dllm-dream' preset.",
        )
    call = translate_sampling(NAME, args, model)
    return PeerCall(params={**call.params, **taken(args, "steps", "eps", "alg")}, gen_length=call.gen_length)


GENERATE = PeerFunction(
    name="dream.diffusion_generate",
    preset="dream",
    source="Dream-org Dream-v0 generation_utils.py (as vendored in NVlabs/Fast-dLLM dream/model): diffusion_generate",
    arguments=(
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
        "generation_config",
        "generation_tokens_hook_func",
        "generation_logits_hook_func",
    ),
    translate=translate_generate,
)

FUNCTIONS = (GENERATE,)
