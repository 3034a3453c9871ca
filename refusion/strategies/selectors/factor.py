"""Factor-based parallel decoding (Fast-dLLM)."""

from __future__ import annotations

from typing import Sequence

import attrs
import torch

from refusion.plugins import hookimpl
from refusion.state import Plan
from refusion.strategies.base import SlotSelector
from refusion.validators import positive_number


@attrs.frozen
class FactorThreshold(SlotSelector):
    """The ``n`` most confident slots, for the largest ``n`` with ``(n + 1) * (1 - c_n) < factor``.

    ``c_n`` is the ``n``-th highest first-token confidence (Fast-dLLM, Wu et al.,
    arXiv 2505.22618, factor-based strategy: the n-th token needs confidence
    above ``1 - factor / (n + 1)``). At least one slot is always chosen.
    """

    name = "factor"

    factor: float = attrs.field(default=1.0, validator=positive_number)

    def select(self, plan: Plan) -> Sequence[int]:
        conf = plan.first_confidence.double()
        order = torch.sort(conf, descending=True, stable=True).indices
        ranked = conf[order]
        n = torch.arange(1, len(ranked) + 1, dtype=torch.float64)
        ok = ((n + 1) * (1 - ranked) < self.factor).nonzero().flatten()
        count = int(ok.max()) + 1 if len(ok) else 1
        return order[:count].tolist()


@hookimpl
def register_selectors(register):
    register(FactorThreshold)
