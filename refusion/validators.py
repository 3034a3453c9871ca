"""Checks of parameters in the house style: every failure is a :class:`~refusion.errors.ConfigError` naming the
parameter (in backticks), the value and what is allowed.

Two forms of the same rules:

* plain checks for any code that takes a value from a user (``check_integer("max_rows", value, 1)``), which
  return the value or raise;
* attrs validators for a part's parameters (``attrs.field(validator=probability)``).

Every check that takes a number refuses ``bool`` (``True`` is not ``1`` here), NaN and infinities.
:func:`finite_fields` runs the float check on any attrs instance; the registry runs it on every part it builds,
so a plugin's float parameter can never hold NaN even if its own validator forgets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from refusion.errors import ConfigError, bad_value


def shown(value: Any, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters; an integer too long to print is described by its size."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4300 digits
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    return text if len(text) <= width else text[: width - 3] + "..."


def is_integer(value: Any) -> bool:
    """True for an int (bool is not an integer here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for a finite int or float (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _bound(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _range(low: float | None, high: float | None, low_open: bool = False) -> str:
    """``>= 1``, ``in [0, 1]``, ``in (0, 1]`` or ``<= 9``: the allowed range in words."""
    if high is None:
        return f"{'>' if low_open else '>='} {_bound(low)}" if low is not None else ""
    if low is None:
        return f"<= {_bound(high)}"
    return f"in {'(' if low_open else '['}{_bound(low)}, {_bound(high)}]"


def check_integer(param: str, value: Any, low: int | None = None, high: int | None = None, why: str = "") -> int:
    """``value`` if it is an integer (not a bool) in ``[low, high]`` (either bound may be ``None``); else a
    :class:`ConfigError` naming ``param``. ``why`` says what the value counts (``"examples per task"``)."""
    if not is_integer(value) or (low is not None and value < low) or (high is not None and value > high):
        bound = _range(low, high)
        note = f" ({why})" if why else ""
        raise ConfigError(
            f"`{param}` must be an integer{' ' + bound if bound else ''}{note}; got {shown(value)}.", param=param
        )
    return value


def check_number(
    param: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    why: str = "",
) -> float:
    """``value`` as a float if it is a finite int or float in ``[low, high]`` (``(low, high]`` with ``low_open``;
    either bound may be ``None``); else a :class:`ConfigError` naming ``param``."""
    ok = (
        is_number(value)
        and (low is None or (value > low if low_open else value >= low))
        and (high is None or value <= high)
    )
    if not ok:
        bound = _range(low, high, low_open)
        note = f" ({why})" if why else ""
        raise ConfigError(
            f"`{param}` must be a finite number{' ' + bound if bound else ''}{note}; got {shown(value)}.", param=param
        )
    return float(value)


def check_boolean(param: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False``; else a :class:`ConfigError` naming ``param``."""
    if not isinstance(value, bool):
        raise bad_value(param, value, "True or False")
    return value


def positive_int(instance: Any, attribute: Any, value: Any) -> None:
    """An integer >= 1."""
    if not is_integer(value) or value < 1:
        raise bad_value(attribute.name, value, "an integer >= 1")


def non_negative_int(instance: Any, attribute: Any, value: Any) -> None:
    """An integer >= 0."""
    if not is_integer(value) or value < 0:
        raise bad_value(attribute.name, value, "an integer >= 0")


def int_in(low: int, high: int, why: str = "") -> Callable[[Any, Any, Any], None]:
    """A validator for an integer in ``[low, high]``; ``why`` names the limit (``"refusion.limits.MAX_STEPS"``)."""

    def check(instance: Any, attribute: Any, value: Any) -> None:
        check_integer(attribute.name, value, low, high, why)

    return check


def probability(instance: Any, attribute: Any, value: Any) -> None:
    """A finite number in [0, 1]."""
    if not is_number(value) or not 0.0 <= float(value) <= 1.0:
        raise bad_value(attribute.name, value, "a number in [0, 1]")


def positive_number(instance: Any, attribute: Any, value: Any) -> None:
    """A finite number > 0."""
    if not is_number(value) or not value > 0:
        raise bad_value(attribute.name, value, "a finite number > 0")


def non_negative_number(instance: Any, attribute: Any, value: Any) -> None:
    """A finite number >= 0."""
    if not is_number(value) or not value >= 0:
        raise bad_value(attribute.name, value, "a finite number >= 0")


def number_in(low: float, high: float, *, low_open: bool = False) -> Callable[[Any, Any, Any], None]:
    """A validator for a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``)."""

    def check(instance: Any, attribute: Any, value: Any) -> None:
        ok = is_number(value) and (low < value if low_open else low <= value) and value <= high
        if not ok:
            raise bad_value(attribute.name, value, f"a number in {'(' if low_open else '['}{low}, {high}]")

    return check


def optional(validator: Callable[[Any, Any, Any], None]) -> Callable[[Any, Any, Any], None]:
    """``None`` or whatever ``validator`` accepts."""

    def check(instance: Any, attribute: Any, value: Any) -> None:
        if value is not None:
            validator(instance, attribute, value)

    return check


def finite_fields(instance: Any, where: str = "") -> None:
    """Refuse an attrs instance any of whose float fields is NaN or infinite (naming the field)."""
    if not attrs.has(type(instance)):
        return
    for field in attrs.fields(type(instance)):
        value = getattr(instance, field.name, None)
        if isinstance(value, float) and not math.isfinite(value):
            raise bad_value(f"{where}{field.name}", value, "a finite number (NaN and infinities are refused)")


def one_of(allowed: tuple) -> Any:
    """A validator accepting only the values in ``allowed``."""

    def check(instance: Any, attribute: Any, value: Any) -> None:
        if isinstance(value, bool) or value not in allowed:
            raise bad_value(attribute.name, value, "one of " + ", ".join(map(repr, allowed)))

    return check


def boolean(instance: Any, attribute: Any, value: Any) -> None:
    """A validator accepting only ``True`` and ``False``."""
    check_boolean(attribute.name, value)


def open_unit_interval(instance: Any, attribute: Any, value: Any) -> None:
    """A finite number strictly between 0 and 1."""
    if not is_number(value) or not 0 < float(value) < 1:
        raise bad_value(attribute.name, value, "a number in (0, 1)")
