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
    after the block that holds an EOS) is ``stop_at_eos="block"``; ``mask_id`` must be the model's and ``eos_id``
    one of its EOS ids; ``remasking`` must be ``low_confidence`` (the decoder's only rule); ``temperature`` 0."""
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
    remasking = args.get("remasking", "low_confidence")
    if remasking != "low_confidence":
        raise refuse(NAME, "remasking", remasking, "the decoder ranks by confidence only ('low_confidence').")
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
    ),
    translate=translate_credit,
    requires={"causal": False, "logit_shift": 0},
)

FUNCTIONS = (CREDIT,)
