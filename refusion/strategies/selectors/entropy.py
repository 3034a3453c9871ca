"""Lowest-entropy selection (Dream's ``entropy`` alg; Ye et al., arXiv 2508.15487)."""

from __future__ import annotations

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.selectors.scored import TopKByScore


@attrs.frozen
class LowestEntropy(TopKByScore):
    """The ``k`` slots whose first-token distribution has the lowest entropy."""

    name = "entropy"

    def score(self, plan: Plan) -> torch.Tensor:
        return -plan.first_entropy


@hookimpl
def register_selectors(register):
    register(LowestEntropy)
