"""Shared rule of the score-based selectors: take the ``k`` best-scoring slots."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.strategies.base import SlotSelector
from refusion.validators import positive_int


@attrs.frozen
class TopKByScore(SlotSelector):
    """Select the ``k`` slots with the highest :meth:`score` (fewer if fewer remain).

    Ties go to the leftmost slot, so the rule is deterministic.
    """

    k: int = attrs.field(default=1, validator=positive_int)

    @abstractmethod
    def score(self, plan: Plan) -> torch.Tensor:
        """One score per slot of ``plan``, shape ``(k,)``; higher is picked first."""

    def select(self, plan: Plan) -> Sequence[int]:
        return top_k(self.score(plan), self.k)


def top_k(scores: torch.Tensor, k: int) -> list[int]:
    """Indices of the ``k`` largest ``scores``, ties broken towards lower indices."""
    k = min(k, scores.shape[0])
    order = torch.sort(scores.double(), descending=True, stable=True).indices
    return order[:k].tolist()
