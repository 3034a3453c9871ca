"""Random selection (LLaDA's ``random`` remasking)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.validators import positive_int


@attrs.frozen
class RandomSlots(SlotSelector):
    """``k`` slots chosen uniformly at random (LLaDA, arXiv 2502.09992, "random remasking").

    Draws from the prompt's generator (``plan.generator``, seeded by the
    decoder's ``seed``), so a prompt decodes the same alone or in a batch, and
    the same on every run with the same seed.
    """

    name = "random"
    reads_scores = False

    k: int = attrs.field(default=1, validator=positive_int)

    def select(self, plan: Plan) -> Sequence[int]:
        generator = plan.generator if plan.generator is not None else torch.Generator().manual_seed(0)
        return torch.randperm(len(plan), generator=generator)[: self.k].tolist()


@hookimpl
def register_selectors(register):
    register(RandomSlots)
