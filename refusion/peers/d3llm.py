"""d3LLM's multi-block decoders (hao-ai-lab/d3LLM ``d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py``:
``generate_multi_block`` as the ``d3llm`` preset, ``generate_multi_block_kv_cache`` as ``d3llm-kv``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, length_argument, refuse, taken

NAME = "d3LLM's generate_multi_block"
KV_NAME = "d3LLM's generate_multi_block_kv_cache"
#: ``generate_multi_block_kv_cache``'s own defaults for its cache: never cached, never refreshed (the ``d3llm`` decode)
KV_DEFAULTS = {"cache_delay_iter": 10000, "refresh_interval": 10000}


def translate_generate_multi_block(args: Mapping[str, Any], model: Any, name: str = NAME) -> PeerCall:
    """``threshold``, ``block_size``, ``block_add_threshold``, ``decoded_token_threshold`` keep their names (the
    ``d3llm`` selector's); ``max_new_tokens`` is ``gen_length``; ``mask_id`` must be the model's; ``steps`` is
    taken and unused, as the function leaves it; ``threshold=None`` is the function's 999 (no entropy bar); a
    ``block_add_threshold`` or ``decoded_token_threshold`` above 1 is 1 (progress never passes it); ``remasking``
    must be ``low_confidence``, ``temperature`` 0 and ``early_stop`` False unless ``eos_token_id`` is None (the
    function then ignores it). A ``max_new_tokens`` that is not a multiple of ``block_size``: the function leaves
    the tail masked (until its 10,000-step guard); refusion decodes a shorter last block."""
    check_mask_id(name, "mask_id", args.get("mask_id"), model)
    if args.get("remasking", "low_confidence") != "low_confidence":
        raise refuse(
            name,
            "remasking",
            args["remasking"],
            "'random' ranks by entropies drawn from torch's global generator over the whole canvas; use "
            "'low_confidence'.",
        )
    if args.get("temperature", 0.0):
        raise refuse(
            name,
            "temperature",
            args["temperature"],
            "with noise the function decodes the Gumbel argmax but forces a block's progress with the plain argmax "
            "of the same position, two tokens a drafting selector cannot tell apart; use 0.",
        )
    if args.get("early_stop") and args.get("eos_token_id") is not None:
        raise refuse(
            name,
            "early_stop",
            True,
            "it writes the EOS id into every position after the first EOS at each step, which changes the canvas "
            "the model reads; refusion's parts choose positions and never write tokens. Use False (the answer is "
            "cut at its first EOS afterwards).",
        )
    params = taken(args, "threshold", "block_size", "block_add_threshold", "decoded_token_threshold")
    if "threshold" in params and params["threshold"] is None:  # the function's own stand-in: no entropy bar
        params["threshold"] = 999.0
    for key in ("block_add_threshold", "decoded_token_threshold"):  # progress never passes 1: the same as 1
        if isinstance(params.get(key), (int, float)) and not isinstance(params[key], bool) and params[key] > 1:
            params[key] = 1.0
    return PeerCall(params=params, gen_length=length_argument(args))


def translate_generate_multi_block_kv_cache(args: Mapping[str, Any], model: Any) -> PeerCall:
    """As :func:`translate_generate_multi_block`, and ``cache_delay_iter`` / ``refresh_interval`` keep their names
    (the ``periodic`` reorderer's), with the function's defaults (10,000: nothing cached, the plain multi-block
    decode) where the call leaves them out; ``lazy_cache_refresh_num`` is taken and unused, as the function leaves
    it."""
    call = translate_generate_multi_block(args, model, KV_NAME)
    cache = {name: args.get(name, default) for name, default in KV_DEFAULTS.items()}
    return PeerCall(params={**call.params, **cache}, gen_length=call.gen_length)


GENERATE_MULTI_BLOCK = PeerFunction(
    name="d3llm.generate_multi_block",
    preset="d3llm",
    source="hao-ai-lab/d3LLM d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py: generate_multi_block",
    arguments=(
        "steps",
        "max_new_tokens",
        "block_size",
        "temperature",
        "remasking",
        "mask_id",
        "threshold",
        "block_add_threshold",
        "decoded_token_threshold",
        "eos_token_id",
        "early_stop",
    ),
    translate=translate_generate_multi_block,
    requires={"causal": False, "logit_shift": 0},
)

GENERATE_MULTI_BLOCK_KV_CACHE = PeerFunction(
    name="d3llm.generate_multi_block_kv_cache",
    preset="d3llm-kv",
    source="hao-ai-lab/d3LLM d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py: generate_multi_block_kv_cache",
    arguments=(*GENERATE_MULTI_BLOCK.arguments, "cache_delay_iter", "refresh_interval", "lazy_cache_refresh_num"),
    translate=translate_generate_multi_block_kv_cache,
    requires={"causal": False, "kv_cache": True, "logit_shift": 0},
)

FUNCTIONS = (GENERATE_MULTI_BLOCK, GENERATE_MULTI_BLOCK_KV_CACHE)
