"""Left-to-right selection: the first remaining slot only (AR order)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from refusion.decoding.plans import Plans
from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector


@attrs.frozen
class Leftmost(SlotSelector):
    """Always the leftmost still-masked slot. With a lossless infiller this is AR decoding."""

    name = "leftmost"
    reads_scores = False
    leftmost_only = True

    def candidates(self, remaining: int) -> int:
        return 1

    def select(self, plan: Plan) -> Sequence[int]:
        return [0]

    def choose(self, plans: Plans) -> list[Sequence[int]]:
        return [[0] for _ in plans]


@hookimpl
def register_selectors(register):
    register(Leftmost)
