"""LLaDA's step schedule: ``steps`` spread evenly over the blocks and over each block's masks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.limits import schedule_steps
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.scored import TIES, note_block, ranked
from refusion.validators import one_of

REMASKING = ("low_confidence", "random")


def even_schedule(masks: int, steps: int) -> list[int]:
    """Tokens per step when ``masks`` masks are unmasked in ``steps`` steps as evenly as possible, larger first.

    LLaDA's ``get_num_transfer_tokens``: ``even_schedule(16, 7) == [3, 3, 2, 2, 2, 2, 2]``;
    with more steps than masks the last steps unmask nothing.
    """
    base, extra = divmod(masks, steps)
    return [base + 1] * extra + [base] * (steps - extra)


def block_steps(steps: int, blocks: int, block: int) -> int:
    """Steps of serial block ``block`` (0-based) when ``steps`` are spread over ``blocks``: LLaDA's
    ``steps // blocks`` when divisible, else the remainder to the earliest blocks; at least 1."""
    return max(1, even_schedule(steps, blocks)[min(block, blocks - 1)])


def next_count(plan: Plan, name: str, counts) -> int:
    """The next non-zero entry of a per-block schedule, tracked in ``plan.memory``; all remaining when it ends.

    ``counts(masks)`` gives the schedule of a block that starts with
    ``masks`` masked slots (the plan of a block's first iteration has them
    all). Steps that would unmask nothing are skipped (they change nothing).
    """
    key = (name, plan.slots[0].block)
    state = plan.memory.get(key)
    if state is None:
        state = plan.memory[key] = [0, counts(len(plan))]
    step, schedule = state
    while step < len(schedule) and schedule[step] == 0:
        step += 1
    count = schedule[step] if step < len(schedule) else len(plan)
    state[0] = step + 1
    return max(1, min(count, len(plan)))


def canvas_uniform(plan: Plan) -> torch.Tensor:
    """LLaDA's random remasking scores: ``rand(canvas_length)`` from the prompt's generator, at the plan's slots."""
    generator = plan.generator if plan.generator is not None else torch.Generator().manual_seed(0)
    firsts = plan.positions[plan.first_rows]
    length = plan.canvas_length or int(plan.positions.max()) + 1
    return torch.rand(length, generator=generator)[firsts.cpu()]


@attrs.frozen
class LLaDASteps(SlotSelector):
    """LLaDA's sampler schedule (Nie et al., arXiv 2502.09992, ``generate.py``).

    ``steps`` (over the whole generation) gives each serial block
    ``steps // blocks`` steps, as LLaDA does when ``steps`` is divisible by
    the number of blocks (LLaDA refuses other counts; here the remainder goes
    to the earliest blocks, one step each, and a block always has a step); a block's masks are
    spread over them as evenly as possible, earlier steps taking one more
    (:func:`even_schedule`: block 16 over 7 steps unmasks 3,3,2,2,2,2,2).
    Each step unmasks the most confident slots (``remasking="low_confidence"``)
    or those with the highest uniform score drawn for every canvas position
    (``"random"``, LLaDA's ``rand`` over the whole sequence, from the prompt's
    generator). Ties go to the lowest position, or as ``torch.topk`` breaks
    them on the row the peer ranks (``ties``, see
    :func:`~refusion.strategies.selectors.scored.ranked`; LLaDA's and
    Fast-dLLM's ``"canvas"``).
    """

    name = "llada-steps"
    #: decides by the masks left in a block, which only shrink; a denoising canvas re-decides every position
    requires: ClassVar[dict[str, object]] = {"denoiser": False}

    steps: int = attrs.field(default=128, validator=schedule_steps)
    remasking: str = attrs.field(default="low_confidence", validator=one_of(REMASKING))
    ties: str = attrs.field(default="lowest", validator=one_of(TIES))

    def select(self, plan: Plan) -> Sequence[int]:
        note_block(plan)
        per_block = block_steps(self.steps, plan.num_blocks, plan.slots[0].block)
        count = next_count(plan, self.name, lambda masks: even_schedule(masks, per_block))
        scores = plan.first_confidence if self.remasking == "low_confidence" else canvas_uniform(plan)
        return ranked(plan, scores, count, self.ties)


@hookimpl
def register_selectors(register):
    register(LLaDASteps)
