"""Fast-dLLM's block decoder for Dream (NVlabs/Fast-dLLM, ``dream/model/generation_utils_block.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs
import torch

from refusion.decoding.sampling import PRECISIONS
from refusion.decoding.types import Plan
from refusion.limits import schedule_steps
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.dream_steps import dream_scores
from refusion.strategies.selectors.scored import TIES, note_block, ranked
from refusion.validators import one_of, open_unit_interval, optional, positive_int, probability

ALGS = ("confidence_threshold", "entropy")


@attrs.frozen
class DreamBlocks(SlotSelector):
    """Fast-dLLM's Dream schedule: each block starts by unmasking its first token, then threshold or entropy steps.

    The first step of every serial block unmasks the block's first slot,
    whatever its confidence (Fast-dLLM commits the full forward's draft there
    before its cache is used). Later steps: ``alg="confidence_threshold"``
    unmasks every slot with confidence >= ``threshold``, else the most
    confident one; ``alg="entropy"`` follows Dream's timesteps
    ``linspace(1, eps, steps_per_block + 1)`` from the second one on
    (``steps_per_block = steps // blocks``), unmasking the
    ``int(n * (1 - s / t))`` slots of lowest entropy (all at the block's
    last step); steps that would unmask nothing are skipped. Entropies are
    computed in ``precision`` (:func:`~refusion.strategies.selectors.dream_steps.dream_scores`).
    Ties go to the lowest position, or as ``torch.topk`` breaks them on the
    row Fast-dLLM ranks (``ties``: ``"suffix"`` with its prefix cache,
    ``"serial-block"`` with its dual cache). The ``fast-dllm-dream`` preset
    uses it with one-token slots, a model with ``logit_shift=1`` and
    Fast-dLLM's prefix or dual cache.
    """

    name = "dream-blocks"
    #: decides by the masks left in a block, which only shrink; a denoising canvas re-decides every position
    requires: ClassVar[dict[str, object]] = {"denoiser": False}

    alg: str = attrs.field(default="confidence_threshold", validator=one_of(ALGS))
    threshold: float = attrs.field(default=0.9, validator=probability)
    steps: int = attrs.field(default=128, validator=schedule_steps)
    eps: float = attrs.field(default=1e-3, validator=open_unit_interval)
    precision: str = attrs.field(default="float32", validator=one_of(PRECISIONS))
    confidence_top_k: int | None = attrs.field(default=None, validator=optional(positive_int))
    confidence_top_p: float | None = attrs.field(default=None, validator=optional(probability))
    ties: str = attrs.field(default="lowest", validator=one_of(TIES))

    def select(self, plan: Plan) -> Sequence[int]:
        note_block(plan)
        key = (self.name, plan.slots[0].block)
        step = plan.memory.get(key, 0)
        if step == 0:
            plan.memory[key] = 1
            return [0]
        if self.alg == "confidence_threshold":
            plan.memory[key] = step + 1
            kept = (plan.first_confidence >= self.threshold).nonzero().flatten().tolist()
            return kept or ranked(plan, plan.first_confidence, 1, self.ties, among=len(plan))
        per_block = max(1, self.steps // plan.num_blocks)
        timesteps = torch.linspace(1, self.eps, per_block + 1)
        n = len(plan)
        count = 0
        while not count:
            last = step >= per_block - 1
            count = n if last else int(torch.tensor(float(n)) * (1 - timesteps[step + 1] / timesteps[step]))
            step += 1
        plan.memory[key] = step
        entropy = dream_scores(plan, "entropy", self.precision, self.confidence_top_k, self.confidence_top_p)
        return ranked(plan, entropy, count, self.ties)


@hookimpl
def register_selectors(register):
    register(DreamBlocks)
