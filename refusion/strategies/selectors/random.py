"""Random selection (LLaDA's ``random`` remasking)."""

from __future__ import annotations

from typing import Sequence

import attrs
import torch

from refusion.plugins import hookimpl
from refusion.state import Plan
from refusion.strategies.base import SlotSelector
from refusion.validators import positive_int


@attrs.frozen
class RandomSlots(SlotSelector):
    """``k`` slots chosen uniformly at random (LLaDA, arXiv 2502.09992, "random remasking").

    The draw depends only on ``seed`` and the plan's positions, so a sequence
    decodes the same alone or in a batch, and the same on every run.
    """

    name = "random"

    k: int = attrs.field(default=1, validator=positive_int)
    seed: int = 0

    def select(self, plan: Plan) -> Sequence[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(plan.positions[0]) * 7919 + len(plan))
        return torch.randperm(len(plan), generator=g)[: self.k].tolist()


@hookimpl
def register_selectors(register):
    register(RandomSlots)
