"""SDAR's ``block_diffusion_generate`` (JetAstra/SDAR ``generate.py``) as the ``sdar`` preset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_eos_ids, check_mask_id, refuse, taken

NAME = "SDAR's block_diffusion_generate"


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``denoising_steps``, ``remasking_strategy`` and ``confidence_threshold`` go to ``sdar-steps``;
    ``temperature``/``top_k``/``top_p`` to the ``block-multinomial`` sampler (SDAR's multinomial draws);
    ``stopping_criteria_idx`` (the model's EOS ids) stops after the block that holds one."""
    check_mask_id(NAME, "mask_id", args.get("mask_id"), model)
    block = model.capabilities.block_length
    if not block:
        raise refuse(
            NAME,
            "model",
            type(model).__name__,
            "SDAR decodes block-diffusion models; load an SDAR checkpoint (or pass `adapter='hf-block'`).",
        )
    if args.get("block_length", block) != block:
        raise refuse(
            NAME,
            "block_length",
            args["block_length"],
            f"the model attends in blocks of {block}; load it "
            f"with `block_length={args['block_length']}` (CLI: --model-block-length) to decode in other blocks.",
        )
    if args.get("remasking_strategy") == "entropy_bounded" or args.get("eb_threshold") is not None:
        arg = "remasking_strategy" if args.get("remasking_strategy") == "entropy_bounded" else "eb_threshold"
        raise refuse(
            NAME,
            arg,
            args[arg],
            "SDAR's published entropy_bounded strategy never sets the tokens it "
            "chooses (its `transfer_index` is unset) and sums the entropy over the wrong axis.",
        )
    params: dict[str, Any] = {"block_length": block}
    params.update(
        taken(args, "denoising_steps", "remasking_strategy", "confidence_threshold", "temperature", "top_k", "top_p")
    )
    if check_eos_ids(NAME, "stopping_criteria_idx", args.get("stopping_criteria_idx"), model) is not None:
        params["stop_at_eos"] = "block"
    return PeerCall(params=params)


GENERATE = PeerFunction(
    name="sdar.block_diffusion_generate",
    preset="sdar",
    source="JetAstra/SDAR generate.py: block_diffusion_generate",
    arguments=(
        "mask_id",
        "block_length",
        "denoising_steps",
        "temperature",
        "top_k",
        "top_p",
        "remasking_strategy",
        "confidence_threshold",
        "eb_threshold",
        "stopping_criteria_idx",
    ),
    translate=translate_generate,
)

FUNCTIONS = (GENERATE,)
