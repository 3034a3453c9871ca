"""Dream's timestep schedule and its ``alg`` choices (Ye et al., arXiv 2508.15487, ``diffusion_generate``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs
import torch

from refusion.decoding.sampling import PRECISIONS, filtered, probabilities
from refusion.decoding.types import Plan
from refusion.limits import schedule_steps
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.scored import TIES, note_block, ranked
from refusion.validators import one_of, open_unit_interval, optional, positive_int, probability

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


def dream_scores(
    plan: Plan, alg: str, precision: str = "float32", top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Dream's confidence per slot: top probability, top-2 margin, or negative entropy ``sum p log(p + 1e-10)``.

    With ``precision`` ``"float32"`` the margin and entropy come from the
    plan's float32 probabilities; otherwise they are computed as Dream's
    ``sample_tokens`` computes them, from ``softmax`` in ``precision``
    (``"logits"``: the logits' dtype, every step rounded there) of the logits
    filtered by ``top_k`` / ``top_p`` (:func:`~refusion.decoding.sampling.filtered`).
    The top probability is the draft's confidence (the sampler's).
    """
    if alg == "maskgit_plus":
        return plan.first_confidence
    if precision == "float32" and top_k is None and top_p is None:
        if alg == "topk_margin":
            return plan.first_margin
        p = plan.first_probs
        return (p * torch.log(p + 1e-10)).sum(-1)
    p = probabilities(filtered(plan.first_logits, top_k, top_p), precision)
    if alg == "topk_margin":
        top = torch.sort(p, dim=-1, descending=True).values
        return top[:, 0] - top[:, 1]
    return torch.sum(p * torch.log(p + 1e-10), dim=-1)


@attrs.frozen
class DreamSteps(SlotSelector):
    """Dream's sampler: ``steps`` over the timesteps ``linspace(1, eps, steps + 1)`` (float32, as Dream).

    At step ``i`` (times ``t > s``) with ``n`` slots still masked:
    ``alg="origin"`` unmasks each slot independently with probability
    ``1 - s / t`` (one uniform per masked slot from the prompt's generator;
    all of them at the last step); the other ``alg`` s unmask the
    ``int(n * (1 - s / t))`` best slots (all at the last step) by top
    probability (``maskgit_plus``), top-2 margin (``topk_margin``) or
    negative entropy (``entropy``), computed in ``precision``
    (:func:`dream_scores`). Steps that unmask nothing are skipped (their
    uniforms are still drawn for ``origin``). Ties go to the lowest position,
    or as ``torch.topk`` breaks them on the row Dream ranks (``ties``
    ``"canvas"``). Use it with one serial block over the whole answer, as
    Dream (the ``dream`` preset), and a model with ``logit_shift=1``.
    """

    name = "dream-steps"
    #: decides by the masks left in a block, which only shrink; a denoising canvas re-decides every position
    requires: ClassVar[dict[str, object]] = {"denoiser": False}

    steps: int = attrs.field(default=128, validator=schedule_steps)
    eps: float = attrs.field(default=1e-3, validator=open_unit_interval)
    alg: str = attrs.field(default="maskgit_plus", validator=one_of(ALGS))
    precision: str = attrs.field(default="float32", validator=one_of(PRECISIONS))
    confidence_top_k: int | None = attrs.field(default=None, validator=optional(positive_int))
    confidence_top_p: float | None = attrs.field(default=None, validator=optional(probability))
    ties: str = attrs.field(default="lowest", validator=one_of(TIES))

    def select(self, plan: Plan) -> Sequence[int]:
        note_block(plan)
        key = (self.name, plan.slots[0].block)
        step = plan.memory.get(key, 0)
        timesteps = torch.linspace(1, self.eps, self.steps + 1)
        n = len(plan)
        chosen: Sequence[int] = ()
        while not len(chosen):
            last = step >= self.steps - 1
            t, s = (timesteps[step], timesteps[step + 1]) if not last else (1.0, 1.0)  # unused when last
            step += 1
            if self.alg == "origin":
                generator = plan.generator if plan.generator is not None else torch.Generator().manual_seed(0)
                u = torch.rand(n, generator=generator)
                chosen = list(range(n)) if last else (u < 1 - s / t).nonzero().flatten().tolist()
            else:
                count = n if last else int(torch.tensor(float(n)) * (1 - s / t))
                if count:  # a step due no token changes nothing: its scores are not computed
                    scores = dream_scores(plan, self.alg, self.precision, self.confidence_top_k, self.confidence_top_p)
                    chosen = ranked(plan, scores, count, self.ties)
        plan.memory[key] = step
        return chosen


@hookimpl
def register_selectors(register):
    register(DreamSteps)
