"""Fast-dLLM's block decoder for Dream (NVlabs/Fast-dLLM, ``dream/model/generation_utils_block.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.dream_steps import dream_scores
from refusion.strategies.selectors.scored import top_k
from refusion.validators import one_of, open_unit_interval, positive_int, probability

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
    last step); steps that would unmask nothing are skipped. Ties go to the
    lowest position. The ``fast-dllm-dream`` preset uses it with one-token
    slots, a model with ``logit_shift=1`` and Fast-dLLM's prefix or dual cache.
    """

    name = "dream-blocks"

    alg: str = attrs.field(default="confidence_threshold", validator=one_of(ALGS))
    threshold: float = attrs.field(default=0.9, validator=probability)
    steps: int = attrs.field(default=128, validator=positive_int)
    eps: float = attrs.field(default=1e-3, validator=open_unit_interval)

    def select(self, plan: Plan) -> Sequence[int]:
        key = (self.name, plan.slots[0].block)
        step = plan.memory.get(key, 0)
        if step == 0:
            plan.memory[key] = 1
            return [0]
        if self.alg == "confidence_threshold":
            plan.memory[key] = step + 1
            kept = (plan.first_confidence >= self.threshold).nonzero().flatten().tolist()
            return kept or top_k(plan.first_confidence, 1)
        per_block = max(1, self.steps // plan.num_blocks)
        timesteps = torch.linspace(1, self.eps, per_block + 1)
        n = len(plan)
        count = 0
        while not count:
            last = step >= per_block - 1
            count = n if last else int(torch.tensor(float(n)) * (1 - timesteps[step + 1] / timesteps[step]))
            step += 1
        plan.memory[key] = step
        return top_k(dream_scores(plan, "entropy"), count)


@hookimpl
def register_selectors(register):
    register(DreamBlocks)
