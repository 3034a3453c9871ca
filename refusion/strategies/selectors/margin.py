"""Top-k margin selection (Dream's ``topk_margin``; Kim et al., arXiv 2502.06768)."""

from __future__ import annotations

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.selectors.scored import TopKByScore


@attrs.frozen
class TopKMargin(TopKByScore):
    """The ``k`` slots with the largest gap between the top-2 probabilities of their first token."""

    name = "margin"

    def score(self, plan: Plan) -> torch.Tensor:
        return plan.first_margin


@hookimpl
def register_selectors(register):
    register(TopKMargin)
