"""The decoder's own options, declared once.

Each :class:`Option` states a name, its default, the JSON types a decoder
file may give it and the check a :class:`~refusion.decoding.decoder.Decoder`
runs when it is built. ``Decoder``'s fields, ``DecoderSpec``'s fields, the
spec format's field names and its type checks all come from :data:`OPTIONS`
(:func:`decoder_option`, :func:`spec_option`); adding an option is one entry
here plus one annotated line in each of the two classes, and its name in
:data:`refusion.plugins.hookspecs.DECODER_NAMES` (checked on import): a name
belongs to the decoder or to parts, never both, so no part may declare it.

What only one part reads is that part's parameter, not an option here: the
canvas-denoising loop's settings are the ``denoise`` infiller's
(:class:`~refusion.strategies.infillers.denoise.Denoise`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from refusion.errors import ConfigError
from refusion.limits import MAX_CALLS_PER_TOKEN
from refusion.plugins.hookspecs import DECODER_NAMES
from refusion.validators import check_boolean, check_integer, is_integer, is_number


def _engine(value: Any) -> None:
    if value is None:
        return
    from refusion.engines import engine_class

    engine_class(value)


def _seed(value: Any) -> None:
    if not is_integer(value) or not 0 <= value < 2**64:
        raise ConfigError(f"`seed` must be an integer in [0, 2**64); got {value!r}.", param="seed")


def _stop_at_eos(value: Any) -> None:
    if not isinstance(value, bool) and value != "block":
        raise ConfigError(f"`stop_at_eos` must be True, False or 'block'; got {value!r}.", param="stop_at_eos")


def _calls_per_token(value: Any) -> None:
    check_integer("calls_per_token", value, 1, MAX_CALLS_PER_TOKEN, "refusion.limits.MAX_CALLS_PER_TOKEN")


def _cfg_scale(value: Any) -> None:
    if not is_number(value) or not value >= 0:
        raise ConfigError(
            f"`cfg_scale` must be a finite number >= 0 (0 = no guidance); got {value!r}.", param="cfg_scale"
        )


@attrs.frozen
class Option:
    """One decoder option: ``name``, ``default``, the ``types`` a decoder file may hold for it and ``check``
    (raises :class:`~refusion.errors.ConfigError` naming the option for a value out of range)."""

    name: str
    default: Any
    types: tuple[type, ...]
    check: Callable[[Any], object]
    doc: str


OPTIONS: tuple[Option, ...] = (
    Option("engine", None, (str, type(None)), _engine, "what runs the model calls (None: the best for the model)"),
    Option("seed", 0, (int,), _seed, "each prompt's sampling generator seed"),
    Option("stop_at_eos", True, (bool, str), _stop_at_eos, "drop slots after a committed EOS; 'block': finish it"),
    Option("cfg_scale", 0.0, (int, float), _cfg_scale, "LLaDA's classifier-free guidance scale (0: none)"),
    Option(
        "calls_per_token",
        4,
        (int,),
        _calls_per_token,
        "an infiller's model calls per chosen token (plus 8) before it is stopped",
    ),
    Option(
        "batch_invariant",
        False,
        (bool,),
        lambda v: check_boolean("batch_invariant", v),
        "each prompt's tokens identical alone and in any batch, in every dtype",
    ),
)

#: the options by name
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
#: the decoder's own options, besides its parts and sampler (``Decoder`` and ``DecoderSpec`` fields of these names)
DECODER_OPTIONS: tuple[str, ...] = tuple(BY_NAME)

if not set(DECODER_OPTIONS) <= set(DECODER_NAMES):  # one owner per name: no part may declare a decoder option
    raise RuntimeError(
        f"decoder options {sorted(set(DECODER_OPTIONS) - set(DECODER_NAMES))} are missing from "
        "refusion.plugins.hookspecs.DECODER_NAMES (the names no part may declare)"
    )


def decoder_option(name: str) -> Any:
    """The ``Decoder`` field of option ``name``: its default, checked when the decoder is built."""
    option = BY_NAME[name]
    return attrs.field(default=option.default, validator=lambda instance, attribute, value: option.check(value))


def spec_option(name: str, **kwargs: Any) -> Any:
    """The ``DecoderSpec`` field of option ``name``: its default (the spec checks types, the decoder ranges)."""
    return attrs.field(default=BY_NAME[name].default, **kwargs)
