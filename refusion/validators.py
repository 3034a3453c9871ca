"""attrs validators that raise :class:`~refusion.errors.ConfigError` in the house style."""

from __future__ import annotations

from typing import Any

from refusion.errors import bad_value


def positive_int(instance: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_value(attribute.name, value, "an integer >= 1")


def probability(instance: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise bad_value(attribute.name, value, "a number in [0, 1]")
