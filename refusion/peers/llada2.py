"""LLaDA 2.1's ``generate`` (inclusionAI LLaDA2.1, vendored by ZHZisZZ/dllm) as the ``llada2.1`` preset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_eos_ids, check_mask_id, refuse, taken

NAME = "LLaDA 2.1's generate"


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``threshold`` (mask-to-token, strict, else the most confident mask) goes to the ``threshold`` selector's
    ``slot_threshold``; ``editing_threshold`` and ``max_post_steps`` to the ``editing`` reviser; ``block_length``
    must be the model's; ``gen_length`` is ``refusion.generate``'s own; ``steps`` and ``minimal_topk`` change
    nothing (LLaDA 2.1 computes its steps and never reads them); ``eos_id`` and ``mask_id`` must be the model's.
    Refused: ``temperature`` > 0, ``top_k``, ``top_p`` (sampled editing is not reproduced yet),
    ``eos_early_stop=True``, ``num_to_transfer`` other than 1."""
    params: dict[str, Any] = {}
    if model is not None:
        check_mask_id(NAME, "mask_id", args.get("mask_id"), model)
        check_eos_ids(NAME, "eos_id", args.get("eos_id"), model)
        block = model.capabilities.block_length
        if not block:
            raise refuse(NAME, "model", type(model).__name__, "it decodes block-diffusion models (LLaDA 2.x).")
        if args.get("block_length", block) != block:
            raise refuse(
                NAME,
                "block_length",
                args["block_length"],
                f"the model attends in blocks of {block}; load it with `block_length={args['block_length']}` "
                "(CLI: --model-block-length) to decode in other blocks.",
            )
        params["block_length"] = block
    if args.get("temperature", 0.0):
        raise refuse(NAME, "temperature", args["temperature"], "sampled editing is not reproduced yet; use 0.")
    for arg in ("top_k", "top_p"):
        if args.get(arg) is not None:
            raise refuse(NAME, arg, args[arg], "it applies to sampling only, which is not reproduced yet.")
    if args.get("eos_early_stop"):
        raise refuse(NAME, "eos_early_stop", True, "every block is decoded and the answer cut at the first EOS.")
    if args.get("num_to_transfer", 1) != 1:
        raise refuse(NAME, "num_to_transfer", args["num_to_transfer"], "the `threshold` selector falls back to one.")
    if "threshold" in args:
        params["slot_threshold"] = args["threshold"]
    params.update(taken(args, "editing_threshold", "max_post_steps"))
    return PeerCall(params=params)


GENERATE = PeerFunction(
    name="llada21.generate",
    preset="llada2.1",
    source="inclusionAI LLaDA2.1 modeling_llada2_moe.py (ZHZisZZ/dllm dllm/pipelines/llada21/models): generate",
    arguments=(
        "temperature",
        "block_length",
        "steps",
        "top_p",
        "top_k",
        "eos_early_stop",
        "minimal_topk",
        "threshold",
        "editing_threshold",
        "max_post_steps",
        "eos_id",
        "mask_id",
        "num_to_transfer",
    ),
    translate=translate_generate,
)

FUNCTIONS = (GENERATE,)
