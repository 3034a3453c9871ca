"""Fast-dLLM v2's ``generate`` (its checkpoints' ``Fast_dLLM_QwenForCausalLM.generate``) as the ``fast-dllm-v2`` preset.

The authors' call, as their model card writes it: ``model.generate(input_ids, tokenizer=tokenizer,
max_new_tokens=512, small_block_size=8, threshold=0.9)``. What the call sets on the model itself (``mask_id``: the
canvas's filler; ``stop_token``: where the answer stops; ``block_size``: the attention mask's blocks) gives the model
the call runs on, as for LLaDA 2.x (:func:`refusion.peers.llada2.model_for_call`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers import llada2
from refusion.peers.base import PeerCall, PeerFunction, length_argument, refuse, taken
from refusion.validators import check_integer

NAME = "Fast-dLLM v2's generate"


def _as_llada2(args: Mapping[str, Any]) -> dict[str, Any]:
    """The call's model-level arguments under LLaDA 2.x's names (the same roles)."""
    renamed = {"mask_id": args.get("mask_id"), "eos_id": args.get("stop_token"), "block_length": args.get("block_size")}
    return {k: v for k, v in renamed.items() if v is not None}


def model_for_call(args: Mapping[str, Any], model: Any) -> Any:
    """The model as the call's ``mask_id``, ``stop_token`` and ``block_size`` make it."""
    return llada2.model_for_call(_as_llada2(args), model)


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``threshold`` and ``small_block_size`` go to the ``fast-dllm-v2`` selector, ``block_size`` is the model's
    block (:func:`refusion.generate` gives the call's to the model first); ``max_new_tokens`` is the answer's
    length, honoured exactly (the authors' answer ends on their block grid plus the token their last block's
    forward predicts: ``max_new_tokens - r + 1`` tokens when the prompt ends ``r`` tokens into a block, and
    ``max_new_tokens + 1`` when ``r`` is 0; refusion's tokens are theirs over the common length); the answer
    stops after the block that holds ``stop_token`` and is cut after it (the authors stop as soon as every position
    before it is decided: the tokens are the same); ``use_block_cache=True``: the ``sub-block-cache`` reorderer
    (their two-level cache). Refused: ``temperature`` > 0 (their top-p draws are not ported), ``steps`` (a cap on
    forwards that leaves masks in the answer), ``stopping_criteria`` (their code ignores it)."""
    params = llada2.model_block(NAME, _as_llada2(args), model)
    params.pop("block_length", None)
    if model is not None:
        params["block_length"] = model.capabilities.block_length
        if not model.capabilities.logit_shift:
            raise refuse(
                NAME,
                "model",
                type(model).__name__,
                "it decodes token-shifted block-diffusion models (Fast-dLLM v2 checkpoints: their logits at a "
                "position predict the next one).",
            )
    if args.get("temperature"):
        raise refuse(
            NAME, "temperature", args["temperature"], "its top-p draws are not ported; decode greedily (temperature=0)."
        )
    parts = {"reorderer": "sub-block-cache"} if args.get("use_block_cache") else {}
    for arg, why in (
        ("steps", "a cap on forwards that leaves masks in the authors' answer"),
        ("stopping_criteria", "the authors' generate ignores it"),
    ):
        if args.get(arg) is not None:
            raise refuse(NAME, arg, args[arg], why)
    if args.get("small_block_size") is not None:
        small = check_integer("small_block_size", args["small_block_size"], 1)
        block = params.get("block_length") or args.get("block_size")
        if block and block % small:
            raise refuse(
                NAME,
                "small_block_size",
                small,
                f"it must divide the block ({block}): the function decodes block_size // small_block_size whole "
                "sub-blocks and never the positions after them (it loops forever).",
            )
    params.update(taken(args, "threshold", "small_block_size"))
    return PeerCall(parts=parts, params=params, gen_length=length_argument(args))


GENERATE = PeerFunction(
    name="fast_dllm_v2.generate",
    preset="fast-dllm-v2",
    source="Efficient-Large-Model/Fast_dLLM_v2_7B modeling.py: Fast_dLLM_QwenForCausalLM.generate",
    arguments=(
        "max_new_tokens",
        "mask_id",
        "threshold",
        "small_block_size",
        "block_size",
        "stop_token",
        "stopping_criteria",
        "top_p",
        "temperature",
        "use_block_cache",
        "steps",
    ),
    translate=translate_generate,
    requires={"causal": False},
    model_for=model_for_call,
)

FUNCTIONS = (GENERATE,)
