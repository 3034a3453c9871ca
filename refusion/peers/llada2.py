"""LLaDA 2.0's and 2.1's ``generate`` (inclusionAI, vendored by ZHZisZZ/dllm) as the ``llada2`` and ``llada2.1``
presets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_eos_ids, check_mask_id, refuse, taken

NAME = "LLaDA 2.1's generate"
NAME_20 = "LLaDA 2.0's generate"
#: LLaDA 2.0's generate arguments besides the model and the prompt (LLaDA 2.1 adds the editing ones)
ARGUMENTS_20 = (
    "temperature",
    "block_length",
    "steps",
    "top_p",
    "top_k",
    "eos_early_stop",
    "minimal_topk",
    "threshold",
    "eos_id",
    "mask_id",
)


def check_counts(args: Mapping[str, Any]) -> None:
    """``steps`` and ``minimal_topk``, when given, are integers >= 1 (``'8'``, ``[1]``, ``0``, ``True`` are
    refused naming them, before anything compares them), ``steps`` within :data:`~refusion.limits.MAX_STEPS`."""
    from refusion.limits import MAX_GEN_LENGTH, MAX_STEPS
    from refusion.validators import check_integer

    if args.get("steps") is not None:
        check_integer("steps", args["steps"], 1, MAX_STEPS, "a schedule's steps: refusion.limits.MAX_STEPS")
    if args.get("minimal_topk") is not None:
        check_integer("minimal_topk", args["minimal_topk"], 1, MAX_GEN_LENGTH, "tokens per step at least")


def model_block(function: str, args: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """``block_length`` must be the model's (and the mask and EOS ids its own); the block as parameters."""
    if model is None:
        return {}
    check_mask_id(function, "mask_id", args.get("mask_id"), model)
    check_eos_ids(function, "eos_id", args.get("eos_id"), model)
    block = model.capabilities.block_length
    if not block:
        raise refuse(function, "model", type(model).__name__, "it decodes block-diffusion models (LLaDA 2.x).")
    if args.get("block_length", block) != block:
        raise refuse(
            function,
            "block_length",
            args["block_length"],
            f"the model attends in blocks of {block}; load it with `block_length={args['block_length']}` "
            "(CLI: --model-block-length) to decode in other blocks.",
        )
    return {"block_length": block}


def translate_generate_20(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``steps`` (per block) and ``threshold`` go to the ``llada2-steps`` selector; ``temperature``, ``top_k``,
    ``top_p`` to the ``block-multinomial`` sampler (its draws over the block, in float32, draw for draw with the
    same seed); ``block_length`` must be the model's; ``gen_length`` is ``refusion.generate``'s own;
    ``minimal_topk`` is accepted (it caps ``steps`` at ``gen_length // minimal_topk``: give ``steps`` no larger);
    ``eos_id`` and ``mask_id`` must be the model's; refused: ``eos_early_stop=True`` (its return in the middle of
    a block), ``steps`` > ``block_length`` (steps due no token: forwards that change nothing)."""
    check_counts(args)
    params = model_block(NAME_20, args, model)
    if args.get("eos_early_stop"):
        raise refuse(
            NAME_20,
            "eos_early_stop",
            True,
            "its return in the middle of a block is not reproduced; without it, decoding stops after the block "
            "that holds an EOS, as here.",
        )
    block = params.get("block_length", args.get("block_length"))
    steps = args.get("steps")
    if steps is not None and block and steps > block:
        raise refuse(NAME_20, "steps", steps, f"more steps than the block's {block} tokens leave steps due no token.")
    params.update(taken(args, "steps", "threshold"))
    params.update(sampling(args))
    return PeerCall(params=params)


GENERATE_20 = PeerFunction(
    name="llada2.generate",
    preset="llada2",
    source="inclusionAI LLaDA2.0 modeling_llada2_moe.py (ZHZisZZ/dllm dllm/pipelines/llada2/models): generate",
    arguments=ARGUMENTS_20,
    translate=translate_generate_20,
)


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``threshold`` (mask-to-token, strict, else the most confident mask) goes to the ``threshold`` selector's
    ``slot_threshold``; ``editing_threshold`` and ``max_post_steps`` to the ``editing`` reviser;
    ``temperature``, ``top_k``, ``top_p`` to the ``block-multinomial`` sampler (one draw over the block per
    forward feeds the mask transfers and the edits, draw for draw); ``block_length`` must be the model's;
    ``gen_length`` is ``refusion.generate``'s own; ``steps`` and ``minimal_topk`` change nothing (LLaDA 2.1
    computes its steps and never reads them); ``eos_id`` and ``mask_id`` must be the model's. Refused:
    ``eos_early_stop=True``, ``num_to_transfer`` other than 1."""
    check_counts(args)
    params = model_block(NAME, args, model)
    if args.get("eos_early_stop"):
        raise refuse(NAME, "eos_early_stop", True, "every block is decoded and the answer cut at the first EOS.")
    if args.get("num_to_transfer", 1) != 1:
        raise refuse(NAME, "num_to_transfer", args["num_to_transfer"], "the `threshold` selector falls back to one.")
    if "threshold" in args:
        params["slot_threshold"] = args["threshold"]
    params.update(taken(args, "editing_threshold", "max_post_steps"))
    params.update(sampling(args))
    return PeerCall(params=params)


def sampling(args: Mapping[str, Any]) -> dict[str, Any]:
    """``temperature`` and the ``top_k``/``top_p`` filters the call sets (``None`` means no filter)."""
    return {k: v for k, v in taken(args, "temperature", "top_k", "top_p").items() if v is not None}


GENERATE = PeerFunction(
    name="llada21.generate",
    preset="llada2.1",
    source="inclusionAI LLaDA2.1 modeling_llada2_moe.py (ZHZisZZ/dllm dllm/pipelines/llada21/models): generate",
    arguments=(*ARGUMENTS_20, "editing_threshold", "max_post_steps", "num_to_transfer"),
    translate=translate_generate,
)

FUNCTIONS = (GENERATE_20, GENERATE)
