"""LLaDA's ``generate`` (ML-GSAI/LLaDA ``generate.py``) as the ``llada`` preset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, check_no_padding, refuse, taken

NAME = "LLaDA's generate"


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``steps``, ``block_length``, ``remasking``, ``temperature`` (Gumbel-max) and ``cfg_scale`` keep their names."""
    check_no_padding(NAME, args.get("attention_mask"))
    check_mask_id(NAME, "mask_id", args.get("mask_id"), model)
    for flag in ("logits_eos_inf", "confidence_eos_eot_inf"):
        if args.get(flag):
            raise refuse(
                NAME,
                flag,
                args[flag],
                "it hard-codes LLaDA-8B's EOS and end-of-turn ids (126081, 126348); "
                "refusion does not change the model's logits or confidences by token id.",
            )
    return PeerCall(params=taken(args, "steps", "block_length", "remasking", "temperature", "cfg_scale"))


GENERATE = PeerFunction(
    name="llada.generate",
    preset="llada",
    source="ML-GSAI/LLaDA generate.py: generate",
    arguments=(
        "attention_mask",
        "steps",
        "block_length",
        "temperature",
        "cfg_scale",
        "remasking",
        "mask_id",
        "logits_eos_inf",
        "confidence_eos_eot_inf",
    ),
    translate=translate_generate,
)

FUNCTIONS = (GENERATE,)
