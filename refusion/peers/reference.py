"""ReFusion's reference decoder ``generate_refusion`` (ML-GSAI/ReFusion ``generate.py``) as the ``paper`` presets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, refuse, taken

NAME = "ReFusion's generate_refusion"


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``slot_size``, ``serial_num_blocks``, ``slot_threshold``, ``token_threshold`` and ``temperature`` keep their
    names; ``tokenizer`` only supplies the EOS id (the model's); ``model_path`` is unused by the reference."""
    check_mask_id(NAME, "mask_id", args.get("mask_id"), model)
    tokenizer = args.get("tokenizer")
    eos = getattr(tokenizer, "eos_token_id", None)
    if tokenizer is not None and eos not in model.eos_token_ids:
        raise refuse(
            NAME,
            "tokenizer",
            f"a tokenizer with eos_token_id {eos}",
            f"the reference reads only its EOS id; "
            f"the model's are {sorted(model.eos_token_ids)} (load it with `eos_token_id=` to change them).",
        )
    return PeerCall(
        params=taken(args, "slot_size", "serial_num_blocks", "slot_threshold", "token_threshold", "temperature")
    )


GENERATE = PeerFunction(
    name="refusion.generate_refusion",
    preset="paper",
    source="ML-GSAI/ReFusion generate.py: generate_refusion",
    arguments=(
        "tokenizer",
        "temperature",
        "mask_id",
        "slot_size",
        "model_path",
        "serial_num_blocks",
        "slot_threshold",
        "token_threshold",
    ),
    translate=translate_generate,
)

FUNCTIONS = (GENERATE,)
