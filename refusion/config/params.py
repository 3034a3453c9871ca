"""Parameters written as text (command line, lm-eval ``model_args``): ``"0.5"`` -> 0.5, ``"k=2"`` -> ("k", 2)."""

from __future__ import annotations

from typing import Any


def parse_value(text: str) -> Any:
    """``"0.5"`` -> 0.5, ``"3"`` -> 3, ``"true"`` -> True, ``"none"`` -> None, else the string itself."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_param(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, parse_value(value))``; raises ValueError without a ``=`` or a key."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key, parse_value(value)
