"""Top-k confidence selection (LLaDA's low-confidence remasking, applied to slots)."""

from __future__ import annotations

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.selectors.scored import TopKByScore


@attrs.frozen
class TopKConfidence(TopKByScore):
    """The ``k`` slots whose first draft token is most probable (LLaDA, arXiv 2502.09992)."""

    name = "topk"

    def score(self, plan: Plan) -> torch.Tensor:
        return plan.first_confidence


@hookimpl
def register_selectors(register):
    register(TopKConfidence)
