"""The paper's slot selection: first-token confidence above a threshold, top-1 fallback."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.scored import top_k
from refusion.validators import boolean, probability


@attrs.frozen
class ConfidenceThreshold(SlotSelector):
    """Every slot whose first draft token has probability > ``slot_threshold``; else the most confident one.

    ReFusion (arXiv 2512.13586) scores a slot by the confidence of its first
    token and keeps it when strictly above the threshold (the default).
    ``inclusive=True`` keeps a slot whose confidence *equals* the threshold
    too: Fast-dLLM's rule (``confidence >= threshold``), its confidence-threshold
    parallel decoding with one-token slots. Fallback ties go to the lowest position.
    """

    name = "threshold"

    slot_threshold: float = attrs.field(default=0.9, validator=probability)
    inclusive: bool = attrs.field(default=False, validator=boolean)

    def select(self, plan: Plan) -> Sequence[int]:
        scores = plan.first_confidence
        kept = scores >= self.slot_threshold if self.inclusive else scores > self.slot_threshold
        chosen = kept.nonzero().flatten().tolist()
        return chosen or top_k(scores, 1)


@hookimpl
def register_selectors(register):
    register(ConfidenceThreshold)
