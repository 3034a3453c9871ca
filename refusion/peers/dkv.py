"""dKV-Cache's LLaDA decoder (horseee/dKV-Cache ``generation_utils/llada_dkv_cache_decode.py``: ``generate``) as the
``dkv`` preset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, refuse, taken

NAME = "dKV-Cache's generate"


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``steps``, ``block_length``, ``remasking``, ``temperature`` (LLaDA's Gumbel-max) and
    ``cache_reloading_step`` keep their names; ``enable_cache=False`` is reorderer ``no-cache`` (LLaDA's plain
    decode, float64 confidences; the preset caches unless told not to, where the function's default is False);
    ``mask_id`` must be the model's; ``tokenizer`` is taken and unused, as the function leaves it; ``cfg_scale``
    must be 0 (the function raises otherwise)."""
    check_mask_id(NAME, "mask_id", args.get("mask_id"), model)
    if args.get("cfg_scale", 0.0):
        raise refuse(NAME, "cfg_scale", args["cfg_scale"], "the function raises NotImplementedError for it; use 0.")
    parts = {} if args.get("enable_cache", True) else {"reorderer": "no-cache"}
    params = taken(args, "steps", "block_length", "remasking", "temperature")
    if parts == {}:
        params.update(taken(args, "cache_reloading_step"))
    return PeerCall(parts=parts, params=params)


GENERATE = PeerFunction(
    name="dkv.generate",
    preset="dkv",
    source="horseee/dKV-Cache generation_utils/llada_dkv_cache_decode.py: generate",
    arguments=(
        "tokenizer",
        "steps",
        "block_length",
        "temperature",
        "cfg_scale",
        "remasking",
        "mask_id",
        "enable_cache",
        "cache_reloading_step",
    ),
    translate=translate_generate,
    requires={"causal": False, "logit_shift": 0},
)

FUNCTIONS = (GENERATE,)
