"""D2F's pipelined block decoders (zhijie-group/Discrete-Diffusion-Forcing ``D2F-eval/eval_llada.py`` and
``eval_dream.py``: ``_generate_block_single``, the method each evaluation calls, with the settings it takes from
its constructor) as the ``d2f`` and ``d2f-dream`` presets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_mask_id, length_argument, refuse, taken

NAME = "D2F's _generate_block_single"
DREAM_NAME = "D2F's Dream _generate_block_single"
#: the evaluation class's own defaults for the decoder's settings
DEFAULTS = {"block_size": 4, "block_add_threshold": 0.5, "decoded_token_threshold": 0.9, "skip_threshold": 1.0}


def translate_generate_block(args: Mapping[str, Any], model: Any, name: str = NAME) -> PeerCall:
    """``block_size``, ``block_add_threshold``, ``decoded_token_threshold``, ``skip_threshold`` keep their names
    (the ``d2f`` selector's; ``block_size`` the ``block-causal`` reorderer's too), with the evaluation class's
    defaults where the call leaves them out; ``max_new_tokens`` is ``gen_length`` cut to whole blocks (the function
    adds ``max_new_tokens // block_size`` blocks; fewer than one is refused); ``mask_token_id`` must be the
    model's; ``max_length`` (the attention mask's size) is taken. Refused: ``temperature`` > 0 (the function draws
    from torch's global generator), ``top_p`` / ``top_k`` (they reshape the probabilities the threshold reads),
    another ``sampling_strategy`` than ``default``, and a ``block_add_threshold`` above 1 (no block is ever added:
    an empty answer)."""
    check_mask_id(name, "mask_token_id", args.get("mask_token_id"), model)
    if args.get("temperature", 0.0):
        raise refuse(
            name,
            "temperature",
            args["temperature"],
            "the function samples with torch.distributions.Categorical from torch's global generator, whose draws "
            "no seed of refusion's reproduces; use 0 (the class's default is 0.2: pass temperature=0).",
        )
    for argument in ("top_p", "top_k"):
        if args.get(argument) is not None:
            why = "it reshapes the probabilities the thresholds read; use None."
            raise refuse(name, argument, args[argument], why)
    if args.get("sampling_strategy", "default") != "default":
        raise refuse(
            name,
            "sampling_strategy",
            args["sampling_strategy"],
            "only the default (the draft's probability picks a fully activated block's token) is ported.",
        )
    params = {**DEFAULTS, **taken(args, *DEFAULTS)}
    add = params["block_add_threshold"]
    if isinstance(add, (int, float)) and not isinstance(add, bool) and add > 1:
        raise refuse(name, "block_add_threshold", add, "no block's progress passes 1: no block is ever added.")
    length = length_argument(args)
    if length is not None:
        size = params["block_size"]
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            if length < size:
                raise refuse(name, "max_new_tokens", length, f"it adds whole blocks of {size}: none fits.")
            length -= length % size
    return PeerCall(params=params, gen_length=length)


GENERATE_BLOCK = PeerFunction(
    name="d2f.generate_block",
    preset="d2f",
    source="zhijie-group/Discrete-Diffusion-Forcing D2F-eval/eval_llada.py: _generate_block_single",
    arguments=(
        "max_new_tokens",
        "max_length",
        "block_size",
        "block_add_threshold",
        "decoded_token_threshold",
        "skip_threshold",
        "temperature",
        "top_p",
        "top_k",
        "sampling_strategy",
        "mask_token_id",
    ),
    translate=translate_generate_block,
    requires={"causal": False, "kv_cache": True, "logit_shift": 0},
)


def translate_generate_block_dream(args: Mapping[str, Any], model: Any) -> PeerCall:
    """As :func:`translate_generate_block` (the Dream class keeps the same settings, with the same defaults)."""
    return translate_generate_block(args, model, DREAM_NAME)


GENERATE_BLOCK_DREAM = PeerFunction(
    name="d2f.generate_block_dream",
    preset="d2f-dream",
    source="zhijie-group/Discrete-Diffusion-Forcing D2F-eval/eval_dream.py: _generate_block_single",
    arguments=GENERATE_BLOCK.arguments,
    translate=translate_generate_block_dream,
    requires={"causal": False, "kv_cache": True, "logit_shift": 1},
)

FUNCTIONS = (GENERATE_BLOCK, GENERATE_BLOCK_DREAM)
