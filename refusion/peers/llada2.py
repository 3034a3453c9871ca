"""LLaDA 2.0's and 2.1's ``generate`` (inclusionAI, vendored by ZHZisZZ/dllm) as the ``llada2`` and ``llada2.1``
presets.

Every argument of the authors' ``generate`` is taken as written. The ones their code applies to the model
itself (``mask_id``: the canvas's filler; ``eos_id``: where the answer stops; ``block_length``: the attention
mask's blocks) give the model the call runs on (:attr:`~refusion.peers.base.PeerFunction.model_for`:
:func:`refusion.generate` decodes on it); translated against a model that was not given them (a running
:class:`~refusion.batcher.Batcher` or server decodes on the model it loaded), they must be its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.errors import ConfigError
from refusion.peers.base import PeerCall, PeerFunction, check_eos_ids, check_mask_id, refuse, taken
from refusion.validators import check_integer

NAME = "LLaDA 2.1's generate"
NAME_20 = "LLaDA 2.0's generate"
#: the authors' defaults of the arguments refusion reads before the call's own
STEPS, MINIMAL_TOPK = 32, 1
#: LLaDA 2.0's generate arguments besides the model and the prompt (LLaDA 2.1 adds the editing ones)
ARGUMENTS_20 = (
    "temperature",
    "block_length",
    "steps",
    "gen_length",
    "top_p",
    "top_k",
    "eos_early_stop",
    "minimal_topk",
    "threshold",
    "eos_id",
    "mask_id",
)


def model_for_call(args: Mapping[str, Any], model: Any) -> Any:
    """The model as the call's ``mask_id``, ``eos_id`` and ``block_length`` make it: the authors fill the canvas
    with ``mask_id``, stop at ``eos_id`` alone, and build their block-causal mask from ``block_length``."""
    if not model.capabilities.block_length:
        return model  # translate refuses it, naming the model
    if args.get("block_length") is not None and args["block_length"] != model.capabilities.block_length:
        if not hasattr(model, "with_block_length"):
            return model  # translate refuses it, saying why
        model = model.with_block_length(check_integer("block_length", args["block_length"], 1))
    mask, eos = args.get("mask_id"), args.get("eos_id")
    if (mask is not None and mask != model.mask_token_id) or (eos is not None and {eos} != set(model.eos_token_ids)):
        model = model.with_ids(mask_token_id=mask, eos_token_ids=eos)
    return model


def check_counts(args: Mapping[str, Any]) -> None:
    """``steps`` and ``minimal_topk``, when given, are integers >= 1 (``'8'``, ``[1]``, ``0``, ``True`` are
    refused naming them, before anything compares them), ``steps`` within :data:`~refusion.limits.MAX_STEPS`."""
    from refusion.limits import MAX_GEN_LENGTH, MAX_STEPS
    from refusion.validators import check_integer

    if args.get("steps") is not None:
        check_integer("steps", args["steps"], 1, MAX_STEPS, "a schedule's steps: refusion.limits.MAX_STEPS")
    if args.get("minimal_topk") is not None:
        check_integer("minimal_topk", args["minimal_topk"], 1, MAX_GEN_LENGTH, "tokens per step at least")


def model_block(function: str, args: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """``block_length`` must be the model's (and the mask and EOS ids its own): :func:`refusion.generate` gives
    the call's to the model first (:func:`model_for_call`); the block as parameters."""
    if model is None:
        return {k: v for k, v in taken(args, "block_length").items() if v is not None}
    check_mask_id(function, "mask_id", args.get("mask_id"), model)
    check_eos_ids(function, "eos_id", args.get("eos_id"), model)
    block = model.capabilities.block_length
    if not block:
        raise refuse(function, "model", type(model).__name__, "it decodes block-diffusion models (LLaDA 2.x).")
    if args.get("block_length", block) != block:
        raise refuse(
            function,
            "block_length",
            args["block_length"],
            f"the model attends in blocks of {block}. refusion.generate runs the call in the blocks it names; "
            f"a running generator or server decodes in the blocks it loaded: load the model with "
            f"`block_length={args['block_length']}` (CLI: --model-block-length).",
        )
    return {"block_length": block}


def steps_of(args: Mapping[str, Any]) -> int | None:
    """LLaDA 2.0's steps per block: ``min(steps, gen_length // minimal_topk)``, as its ``generate`` computes them
    before anything else (``None`` when ``steps`` is not given and the cap is not known). More steps than the
    block's tokens are taken as they come: every step accepts at least one token (each of the first
    ``block_length`` steps is due one), so the block is decoded before a step due none. Refused: a cap of 0 (the
    authors' schedule divides by it)."""
    minimal = check_integer("minimal_topk", args.get("minimal_topk", MINIMAL_TOPK), 1)
    steps = args.get("steps")
    if steps is not None:
        steps = check_integer("steps", steps, 1)
    gen_length = args.get("gen_length")
    if gen_length is None:
        if minimal != MINIMAL_TOPK:
            raise refuse(
                NAME_20,
                "minimal_topk",
                minimal,
                "it caps the steps at gen_length // minimal_topk: give `gen_length` with it.",
            )
        effective = steps
    else:
        effective = min(STEPS if steps is None else steps, check_integer("gen_length", gen_length, 1) // minimal)
        if effective < 1:
            raise refuse(
                NAME_20,
                "minimal_topk",
                minimal,
                f"gen_length // minimal_topk = {gen_length} // {minimal} = 0 steps per block (the authors' "
                "schedule divides the block by the steps).",
            )
    return effective


def translate_generate_20(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``steps`` per block, capped as the authors cap it (``min(steps, gen_length // minimal_topk)``), and
    ``threshold`` go to the ``llada2-steps`` selector; ``temperature``, ``top_k``, ``top_p`` to the
    ``block-multinomial`` sampler (its draws over the block, in float32, draw for draw with the same seed);
    ``block_length`` to the partitioner and selector; ``gen_length`` is the answer's length (cut there, as the
    authors' ``x[:, :prompt_length + gen_length]``); ``eos_id`` and ``mask_id`` must be the model's
    (:func:`refusion.generate` makes them so, :func:`model_for_call`). ``eos_early_stop``: without it the authors
    stop after the block that holds an EOS, as here; with it they return as soon as the answer up to its first
    EOS is decoded, in the middle of the block: the same tokens (those before the EOS are final), fewer
    forwards."""
    check_counts(args)
    params = model_block(NAME_20, args, model)
    if "eos_early_stop" in args and not isinstance(args["eos_early_stop"], bool):
        raise ConfigError(
            f"`eos_early_stop` must be True or False; got {args['eos_early_stop']!r}.", param="eos_early_stop"
        )
    steps = steps_of(args)
    if steps is not None:
        params["steps"] = steps
    params.update(taken(args, "threshold"))
    params.update(sampling(args))
    return PeerCall(params=params, gen_length=args.get("gen_length"))


GENERATE_20 = PeerFunction(
    name="llada2.generate",
    preset="llada2",
    source="inclusionAI LLaDA2.0 modeling_llada2_moe.py (ZHZisZZ/dllm dllm/pipelines/llada2/models): generate",
    arguments=ARGUMENTS_20,
    translate=translate_generate_20,
    model_for=model_for_call,
)


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``threshold`` (mask-to-token, strict, else the most confident mask, ties as ``torch.topk`` over the model
    block) goes to the ``threshold`` selector's ``slot_threshold``; ``editing_threshold`` and ``max_post_steps``
    to the ``editing`` reviser; ``temperature``, ``top_k``, ``top_p`` to the ``block-multinomial`` sampler (one
    draw over the block per forward feeds the mask transfers and the edits, draw for draw); ``block_length`` to
    the partitioner and selector; ``gen_length`` is the answer's length (cut there); ``eos_early_stop=True``
    stops after the block that holds an EOS (``stop_at_eos="block"``), as the authors' check after each block;
    ``steps`` and ``minimal_topk`` change nothing (LLaDA 2.1 computes its steps and never reads them; they are
    checked); ``eos_id`` and ``mask_id`` must be the model's (:func:`refusion.generate` makes them so).
    Refused: ``num_to_transfer`` other than 1."""
    check_counts(args)
    params = model_block(NAME, args, model)
    early = args.get("eos_early_stop", False)
    if not isinstance(early, bool):
        raise ConfigError(f"`eos_early_stop` must be True or False; got {early!r}.", param="eos_early_stop")
    if early:
        params["stop_at_eos"] = "block"
    check_integer("minimal_topk", args.get("minimal_topk", MINIMAL_TOPK), 1)
    if args.get("steps") is not None:
        check_integer("steps", args["steps"], 1)
    if args.get("num_to_transfer", 1) != 1:
        raise refuse(NAME, "num_to_transfer", args["num_to_transfer"], "the `threshold` selector falls back to one.")
    if "threshold" in args:
        params["slot_threshold"] = args["threshold"]
    params.update(taken(args, "editing_threshold", "max_post_steps"))
    params.update(sampling(args))
    return PeerCall(params=params, gen_length=args.get("gen_length"))


def sampling(args: Mapping[str, Any]) -> dict[str, Any]:
    """``temperature`` and the ``top_k``/``top_p`` filters the call sets (``None`` means no filter)."""
    return {k: v for k, v in taken(args, "temperature", "top_k", "top_p").items() if v is not None}


GENERATE = PeerFunction(
    name="llada21.generate",
    preset="llada2.1",
    source="inclusionAI LLaDA2.1 modeling_llada2_moe.py (ZHZisZZ/dllm dllm/pipelines/llada21/models): generate",
    arguments=(*ARGUMENTS_20, "editing_threshold", "max_post_steps", "num_to_transfer"),
    translate=translate_generate,
    model_for=model_for_call,
)

FUNCTIONS = (GENERATE_20, GENERATE)
