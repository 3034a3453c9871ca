"""dInfer's CreditDecoding (inclusionAI/dInfer ``python/dinfer/decoding/parallel_strategy.py``:
``CreditThresholdParallelDecoder`` on ``BlockWiseDiffusionLLM``) as the ``credit`` preset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, refuse, taken

NAME = "dInfer's CreditThresholdParallelDecoder"


def translate_credit(args: Mapping[str, Any], model: Any) -> PeerCall:
    """The decoder's ``threshold``, ``credit_alpha``, ``boost_gamma``, ``decay_beta`` and the block runner's
    ``block_length`` keep their names; ``use_float64`` computes the confidences in float64; ``early_stop`` (stop
    after the block that holds an EOS) is ``stop_at_eos="block"``; the iterator's ``start_block_align`` is the
    partitioner's ``align="absolute"``; ``mask_id`` must be the model's and ``eos_id`` one of its EOS ids;
    ``remasking``, ``maximum_unroll`` and ``expected_tpf`` are taken and change no token (the decoder never reads
    the first; the others only add forwards on a finished block); ``temperature`` must be 0, ``use_shift`` False
    and ``cache_factory`` None. ``early_stop``, ``use_float64`` aside, and ``start_block_align`` are mapped, not
    covered by the goldens."""
    check_mask_id(NAME, "mask_id", args.get("mask_id"), model)
    eos = args.get("eos_id")
    if eos is not None and eos not in model.eos_token_ids:
        raise refuse(
            NAME,
            "eos_id",
            eos,
            f"refusion stops at the model's EOS ids {sorted(model.eos_token_ids)}; dInfer's one id (read by its "
            f"early stop only) must be one of them: load the model with `eos_token_id={eos}` to stop at it.",
        )
    if args.get("use_shift"):
        raise refuse(
            NAME,
            "use_shift",
            True,
            "its shifted iteration is for models whose logits predict the next position; the preset decodes "
            "LLaDA-style models (logit shift 0) and no golden covers the shifted one. Use False.",
        )
    if args.get("cache_factory") is not None:
        raise refuse(
            NAME,
            "cache_factory",
            "a KV-cache factory",
            "the goldens cover dInfer's block runner without a cache; refusion's approximate caches are its "
            "reorderers (prefix-cache, dual-cache, dkv). Pass None.",
        )
    temperature = args.get("temperature", 0.0)
    if temperature:
        raise refuse(
            NAME,
            "temperature",
            temperature,
            "dInfer draws its Gumbel noise from torch's global generator over each block's logits, as many times "
            "as its block runner unrolls; no seed of refusion's per-prompt generator gives those draws. Use 0 (its "
            "benchmarks' setting), or refusion's own `temperature` with the `credit` selector in another preset.",
        )
    params: dict[str, Any] = taken(args, "threshold", "credit_alpha", "boost_gamma", "decay_beta", "block_length")
    if args.get("use_float64"):
        params["precision"] = "float64"
    if "early_stop" in args:
        params["stop_at_eos"] = "block" if args["early_stop"] else False
    if args.get("start_block_align"):
        params["align"] = "absolute"
    return PeerCall(params=params)


CREDIT = PeerFunction(
    name="dinfer.credit",
    preset="credit",
    source="inclusionAI/dInfer python/dinfer/decoding/parallel_strategy.py: CreditThresholdParallelDecoder, "
    "generate_uniform.py: BlockWiseDiffusionLLM",
    arguments=(
        "temperature",
        "threshold",
        "remasking",
        "mask_id",
        "eos_id",
        "use_float64",
        "credit_alpha",
        "boost_gamma",
        "decay_beta",
        "block_length",
        "early_stop",
        "maximum_unroll",
        "expected_tpf",
        "use_shift",
        "cache_factory",
        "start_block_align",
    ),
    translate=translate_credit,
    requires={"causal": False, "logit_shift": 0},
)

FUNCTIONS = (CREDIT,)
