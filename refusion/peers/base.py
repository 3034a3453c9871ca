"""What a peer preset knows: the peer's function, its arguments, and how each becomes refusion's.

A :class:`PeerFunction` describes one published decoding function (LLaDA's
``generate``, Fast-dLLM's ``generate_with_dual_cache``, SDAR's
``block_diffusion_generate``, ...): every argument it takes besides the model
and the prompt, and a ``translate`` callable that turns the arguments of a
call into a :class:`PeerCall` (part names, part and decoder parameters,
generation length) or refuses an argument with a :class:`ConfigError` naming
it and saying why. Presets named after a peer carry the function's name
(``Preset.peer``), so ``refusion.generate(..., preset="fast-dllm-dual",
threshold=None, steps=16)`` takes the peer's own call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from refusion.errors import ConfigError


@attrs.frozen
class PeerCall:
    """A peer call in refusion's terms: part names replacing the preset's, parameters, and ``gen_length`` (or None)."""

    parts: Mapping[str, str] = attrs.field(factory=dict)
    params: Mapping[str, Any] = attrs.field(factory=dict)
    gen_length: int | None = None


@attrs.frozen
class PeerFunction:
    """One published decoding function: ``name`` (``"fast_dllm.generate"``), the ``preset`` that runs it,
    where it is published (``source``), every argument it takes besides the model and the prompt, and
    ``translate(args, model) -> PeerCall`` for the arguments given; ``requires``: the
    :class:`~refusion.models.base.ModelCapabilities` values its models have."""

    name: str
    preset: str
    source: str
    arguments: tuple[str, ...]
    translate: Callable[[Mapping[str, Any], Any], PeerCall] = attrs.field(repr=False)
    #: model capabilities the function's models have (``{"denoiser": True}``: DiffusionGemma's only)
    requires: Mapping[str, Any] = attrs.field(factory=dict)
    #: ``model_for(args, model) -> model``: the model the call runs on, for arguments the authors' code applies to
    #: the model itself (LLaDA 2.x's ``mask_id``, ``eos_id``, and ``block_length``, from which it builds the
    #: attention mask); :func:`refusion.generate` decodes on it. ``None``: the model as loaded.
    model_for: Callable[[Mapping[str, Any], Any], Any] | None = attrs.field(default=None, repr=False)

    def model(self, args: Mapping[str, Any], model: Any) -> Any:
        """The model a call with ``args`` runs on (see :attr:`model_for`); ``model`` itself when none applies."""
        if self.model_for is None or model is None:
            return model
        return self.model_for(args, model)


def refuse(function: str, arg: str, value: Any, why: str) -> ConfigError:
    """The error for a peer argument refusion does not take: names the function, the argument and why."""
    return ConfigError(f"`{arg}`={value!r} of {function} is not supported: {why}", param=arg)


def check_mask_id(function: str, arg: str, value: Any, model: Any) -> None:
    """A peer's mask-id argument must be the model's mask token (refusion reads it from the checkpoint)."""
    if value is not None and value != model.mask_token_id:
        raise refuse(
            function,
            arg,
            value,
            f"the model's mask token is {model.mask_token_id} (from its checkpoint); "
            "load the model with `mask_token_id=` to use another.",
        )


def check_eos_ids(function: str, arg: str, value: Any, model: Any) -> set[int] | None:
    """A peer's EOS argument (an id or ids) must be the model's EOS ids; returns them as a set (``None`` if not
    given)."""
    if value is None:
        return None
    given = {int(value)} if isinstance(value, int) else {int(v) for v in value}
    if given != set(model.eos_token_ids):
        raise refuse(
            function,
            arg,
            value,
            f"refusion stops at the model's EOS ids {sorted(model.eos_token_ids)}; load the model with "
            f"`eos_token_id={sorted(given)}` to stop at others.",
        )
    return given


def check_no_padding(function: str, value: Any) -> None:
    """A peer's ``attention_mask`` may only say "no padding": refusion batches prompts of any lengths unpadded."""
    import torch

    if value is None:
        return
    if not isinstance(value, torch.Tensor) or not bool((value == 1).all()):
        raise refuse(
            function,
            "attention_mask",
            "a padding mask",
            "refusion decodes a list of prompts of different "
            "lengths without padding; pass the prompts unpadded (a mask of ones is accepted).",
        )


def length_argument(args: Mapping[str, Any], name: str = "max_new_tokens") -> int | None:
    """The call's generation-length argument ``name`` (``None`` when not given), checked under its own name: an
    integer in ``[1, MAX_GEN_LENGTH]`` (a peer's ``max_new_tokens`` of 0 is refused as ``max_new_tokens``, not
    as refusion's ``gen_length``)."""
    from refusion.limits import MAX_GEN_LENGTH
    from refusion.validators import check_integer

    value = args.get(name)
    return None if value is None else check_integer(name, value, 1, MAX_GEN_LENGTH, "tokens to generate")


def taken(args: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The arguments among ``names`` that the call gives, under the same names."""
    return {name: args[name] for name in names if name in args}
