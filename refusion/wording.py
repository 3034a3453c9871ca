"""Counts in words for what refusion prints: ``1 iteration``, ``2 iterations``."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in the number ``n`` takes: ``counted(1, "iteration") == "1 iteration"``,
    ``counted(0, "iteration") == "0 iterations"``; ``plural`` for a noun that does not take an ``s``."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
