"""Factor-based parallel decoding (Fast-dLLM)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.scored import TIES, note_block, ranked
from refusion.validators import one_of, positive_number

RULES = ("paper", "fast-dllm")


@attrs.frozen
class FactorThreshold(SlotSelector):
    """Fast-dLLM's factor-based parallel decoding (Wu et al., arXiv 2505.22618): the n-th most confident slot
    needs confidence above ``1 - factor / (n + 1)``.

    ``c_n`` is the ``n``-th highest first-token confidence. ``rule="paper"``
    (default) takes the ``n`` most confident slots for the largest ``n`` with
    ``(n + 1) * (1 - c_n) < factor``. ``rule="fast-dllm"`` is Fast-dLLM's
    code (``get_transfer_index_dynamic``): ranks are taken in order up to the
    first whose confidence is below its threshold (>= passes); when only the
    last rank fails it is taken too. At least one slot is always chosen; ties
    go to the lowest position, or as ``torch.topk`` breaks them on the row
    the peer ranks (``ties``, see :func:`~refusion.strategies.selectors.scored.ranked`).
    """

    name = "factor"

    factor: float = attrs.field(default=1.0, validator=positive_number)
    rule: str = attrs.field(default="paper", validator=one_of(RULES))
    ties: str = attrs.field(default="lowest", validator=one_of(TIES))

    def select(self, plan: Plan) -> Sequence[int]:
        note_block(plan)
        conf = plan.first_confidence.double()
        order = torch.sort(conf, descending=True, stable=True).indices
        best_first = conf[order]
        n = torch.arange(1, len(best_first) + 1, dtype=torch.float64)
        if self.rule == "paper":
            ok = ((n + 1) * (1 - best_first) < self.factor).nonzero().flatten()
            count = int(ok.max()) + 1 if len(ok) else 1
        else:
            failed = (best_first < 1 - self.factor / (n + 1)).nonzero().flatten().tolist()
            first = next((i for i in failed if i > 0), None)  # rank 0 always passes
            count = len(best_first) if first is None or first == len(best_first) - 1 else first
        return (
            order[:count].tolist() if self.ties == "lowest" else ranked(plan, plan.first_confidence, count, self.ties)
        )


@hookimpl
def register_selectors(register):
    register(FactorThreshold)
