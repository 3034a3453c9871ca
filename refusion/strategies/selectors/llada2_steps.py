"""LLaDA 2.0's transfer rule (inclusionAI LLaDA2.0 ``generate``): a per-block step schedule with a threshold."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs

from refusion.decoding.types import Plan
from refusion.limits import block_positions, schedule_steps
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.llada_steps import even_schedule
from refusion.strategies.selectors.scored import TIES, ranked
from refusion.validators import one_of, probability


@attrs.frozen
class LLaDA2Steps(SlotSelector):
    """Each block of ``block_length`` gets ``steps`` steps; step ``s`` is due ``schedule[s]`` tokens (the block
    spread over the steps, earlier steps one more: :func:`~refusion.strategies.selectors.llada_steps.even_schedule`
    of the block's length, whatever part of it the prompt holds). It takes every mask whose confidence is above
    ``threshold`` (strictly) when there are at least that many, else the ``schedule[s]`` most confident
    (``ties`` as ``torch.topk`` over the model block, ``"model-block"``, as LLaDA 2.0; by position when the
    slots are not inside one model block of ``block_length``). Past the schedule, all that remain."""

    name = "llada2-steps"
    #: decides by the masks left in a block, which only shrink; a denoising canvas re-decides every position
    requires: ClassVar[dict[str, object]] = {"denoiser": False}

    steps: int = attrs.field(default=32, validator=schedule_steps)
    threshold: float = attrs.field(default=0.95, validator=probability)
    block_length: int = attrs.field(default=32, validator=block_positions)
    ties: str = attrs.field(default="model-block", validator=one_of(TIES))

    def select(self, plan: Plan) -> Sequence[int]:
        key = (self.name, plan.slots[0].block)
        step = plan.memory.get(key, 0)
        plan.memory[key] = step + 1
        schedule = even_schedule(self.block_length, self.steps)
        due = schedule[step] if step < len(schedule) else len(plan)
        confidence = plan.first_confidence
        above = (confidence > self.threshold).nonzero().flatten().tolist()
        if above and len(above) >= due:
            return above
        ties = self.ties
        if ties == "model-block":  # LLaDA 2.0 ranks its model block; a plan outside one ranks by position
            firsts = plan.positions[plan.first_rows]
            start = int(firsts[0]) - int(firsts[0]) % self.block_length
            ties = ties if int(firsts.max()) < start + self.block_length else "lowest"
        return ranked(plan, confidence, max(1, min(due, len(plan))), ties, self.block_length)


@hookimpl
def register_selectors(register):
    register(LLaDA2Steps)
