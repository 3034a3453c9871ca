"""WINO's ``decoding_wino`` (Feng-Hong/WINO-DLLM ``LLaDA/decoding.py``) as the ``wino`` preset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, taken

NAME = "WINO's decoding_wino"


def translate_decoding_wino(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``block_length``, ``temperature`` (LLaDA's Gumbel-max), ``threshold`` and ``threshold_back`` keep their
    names; ``mask_id`` must be the model's; ``gen_length`` is ``refusion.generate``'s own."""
    check_mask_id(NAME, "mask_id", args.get("mask_id"), model)
    return PeerCall(params=taken(args, "block_length", "temperature", "threshold", "threshold_back"))


DECODING_WINO = PeerFunction(
    name="wino.decoding_wino",
    preset="wino",
    source="Feng-Hong/WINO-DLLM LLaDA/decoding.py: decoding_wino",
    arguments=("block_length", "temperature", "mask_id", "threshold", "threshold_back"),
    translate=translate_decoding_wino,
)

FUNCTIONS = (DECODING_WINO,)
