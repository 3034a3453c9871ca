"""attrs validators that raise :class:`~refusion.errors.ConfigError` in the house style.

Use them on a part's parameters (``attrs.field(validator=probability)``): each
names the parameter and the allowed values, and every validator that takes a
float refuses NaN and infinities. :func:`finite_fields` is the same check run
on any attrs instance; the registry runs it on every part it builds, so a
plugin's float parameter can never hold NaN even if its own validator forgets.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs

from refusion.errors import bad_value


def is_number(value: Any) -> bool:
    """True for a finite int or float (bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def positive_int(instance: Any, attribute: Any, value: Any) -> None:
    """An integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_value(attribute.name, value, "an integer >= 1")


def non_negative_int(instance: Any, attribute: Any, value: Any) -> None:
    """An integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_value(attribute.name, value, "an integer >= 0")


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
    if not isinstance(value, bool):
        raise bad_value(attribute.name, value, "True or False")


def open_unit_interval(instance: Any, attribute: Any, value: Any) -> None:
    """A finite number strictly between 0 and 1."""
    if not is_number(value) or not 0 < float(value) < 1:
        raise bad_value(attribute.name, value, "a number in (0, 1)")
