"""d3LLM's multi-block decoder (hao-ai-lab/d3LLM ``d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py``:
``generate_multi_block``) as the ``d3llm`` preset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, length_argument, refuse, taken

NAME = "d3LLM's generate_multi_block"


def translate_generate_multi_block(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``threshold``, ``block_size``, ``block_add_threshold``, ``decoded_token_threshold`` keep their names (the
    ``d3llm`` selector's); ``max_new_tokens`` is ``gen_length``; ``mask_id`` must be the model's; ``steps`` is
    taken and unused, as the function leaves it; ``threshold=None`` is the function's 999 (no entropy bar); a
    ``block_add_threshold`` or ``decoded_token_threshold`` above 1 is 1 (progress never passes it); ``remasking``
    must be ``low_confidence``, ``temperature`` 0 and ``early_stop`` False unless ``eos_token_id`` is None (the
    function then ignores it). A ``max_new_tokens`` that is not a multiple of ``block_size``: the function leaves
    the tail masked (until its 10,000-step guard); refusion decodes a shorter last block."""
    check_mask_id(NAME, "mask_id", args.get("mask_id"), model)
    if args.get("remasking", "low_confidence") != "low_confidence":
        raise refuse(
            NAME,
            "remasking",
            args["remasking"],
            "'random' ranks by entropies drawn from torch's global generator over the whole canvas; use "
            "'low_confidence'.",
        )
    if args.get("temperature", 0.0):
        raise refuse(
            NAME,
            "temperature",
            args["temperature"],
            "with noise the function decodes the Gumbel argmax but forces a block's progress with the plain argmax "
            "of the same position, two tokens a drafting selector cannot tell apart; use 0.",
        )
    if args.get("early_stop") and args.get("eos_token_id") is not None:
        raise refuse(
            NAME,
            "early_stop",
            True,
            "it writes the EOS id into every position after the first EOS at each step, which changes the canvas "
            "the model reads; refusion's parts choose positions and never write tokens. Use False (the answer is "
            "cut at its first EOS afterwards).",
        )
    params = taken(args, "threshold", "block_size", "block_add_threshold", "decoded_token_threshold")
    if "threshold" in params and params["threshold"] is None:  # the function's own stand-in: no entropy bar
        params["threshold"] = 999.0
    for name in ("block_add_threshold", "decoded_token_threshold"):  # progress never passes 1: the same as 1
        if isinstance(params.get(name), (int, float)) and not isinstance(params[name], bool) and params[name] > 1:
            params[name] = 1.0
    return PeerCall(params=params, gen_length=length_argument(args))


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

FUNCTIONS = (GENERATE_MULTI_BLOCK,)
