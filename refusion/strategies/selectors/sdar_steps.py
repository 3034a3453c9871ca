"""SDAR's per-block schedule and remasking strategies (JetAstra/SDAR, ``block_diffusion_generate``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs

from refusion.decoding.types import Plan
from refusion.limits import block_positions, schedule_steps
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.scored import TIES, ranked
from refusion.validators import one_of, probability

STRATEGIES = ("low_confidence_dynamic", "low_confidence_static", "sequential")


def block_schedule(block_length: int, steps: int) -> list[int]:
    """Tokens per denoising step of one block: SDAR's ``get_num_transfer_tokens(block_length, steps)``.

    ``block_schedule(4, 4) == [1, 1, 1, 1]``, ``block_schedule(8, 3) == [3, 3, 2]``: computed from the
    block's length, not from its masks, so a first block that also holds the prompt's last tokens
    follows the same schedule and simply ends sooner.
    """
    base, extra = divmod(block_length, steps)
    return [base + 1] * extra + [base] * (steps - extra)


@attrs.frozen
class SDARSteps(SlotSelector):
    """SDAR's denoising schedule: ``denoising_steps`` per block of ``block_length`` tokens.

    Step ``i`` of a block unmasks ``block_schedule(block_length, denoising_steps)[i]``
    slots (never more than remain): the most confident ones
    (``remasking_strategy="low_confidence_static"``); every slot with confidence
    above ``confidence_threshold`` when there are at least that many, else the
    most confident ones (``"low_confidence_dynamic"``, SDAR's default); or the
    leftmost ones (``"sequential"``). Confidence is the drawn token's
    probability (SDAR samples; see the ``block-multinomial`` sampler), compared
    with ``confidence_threshold`` in its own dtype. Ties go to the lowest
    position, or as ``torch.topk`` breaks them on SDAR's block row (``ties``
    ``"model-block"``, see :func:`~refusion.strategies.selectors.scored.ranked`).
    Use it with one-token slots in the model's blocks (partitioner
    ``semi-ar``, ``align="absolute"``), as the ``sdar`` preset does. SDAR's ``entropy_bounded``
    strategy is not offered: its published code never sets the tokens it chooses.
    """

    name = "sdar-steps"
    #: decides by the masks left in a block, which only shrink; a denoising canvas re-decides every position
    requires: ClassVar[dict[str, object]] = {"denoiser": False}

    denoising_steps: int = attrs.field(default=4, validator=schedule_steps)
    remasking_strategy: str = attrs.field(default="low_confidence_dynamic", validator=one_of(STRATEGIES))
    confidence_threshold: float = attrs.field(default=0.85, validator=probability)
    block_length: int = attrs.field(default=4, validator=block_positions)
    ties: str = attrs.field(default="lowest", validator=one_of(TIES))

    def select(self, plan: Plan) -> Sequence[int]:
        key = (self.name, plan.slots[0].block)
        step = plan.memory.get(key, 0)
        plan.memory[key] = step + 1
        schedule = block_schedule(self.block_length, self.denoising_steps)
        count = max(1, min(schedule[step] if step < len(schedule) else len(plan), len(plan)))
        if self.remasking_strategy == "sequential":
            return list(range(count))
        scores = plan.first_confidence
        if self.remasking_strategy == "low_confidence_dynamic":
            confident = (scores > self.confidence_threshold).nonzero().flatten().tolist()
            if len(confident) >= count:
                return confident
        return ranked(plan, scores, count, self.ties, self.block_length)


@hookimpl
def register_selectors(register):
    register(SDARSteps)
