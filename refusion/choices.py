"""attrs validators for options that take one of a few values, in the house style (ConfigError)."""

from __future__ import annotations

from typing import Any

from refusion.errors import bad_value


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
