"""CreditDecoding (arXiv 2510.06133): a threshold rule on logits fused with the credit the block's positions earned.

A selector with memory. Restated from its authors' code (inclusionAI/dInfer
``python/dinfer/decoding/parallel_strategy.py``, ``CreditThresholdParallelDecoder``): each serial block keeps a
credit matrix ``C`` (positions x vocabulary, float32, zeros when the block opens). At every step of the block:

1. from the block's second step on, ``C *= decay_beta``;
2. each still-masked position adds ``p_top ** boost_gamma`` to its credit for its current top-1 token (``p_top``
   the softmax probability of that token under this step's logits, in float32);
3. the drafts are drawn from ``logits + credit_alpha * log(C + 1)`` (so the current step's credit counts already);
4. the chosen positions are the masked ones whose draft confidence under the fused logits is
   ``>= min(max confidence - 1e-5, threshold)``: every one above ``threshold``, and always the most confident
   one and those within 1e-5 of it (``ThresholdParallelDecoder``'s rule).

The matrix is this row's state, kept in ``plan.memory`` (it lives and dies with the row's sequence; a block's
matrix is dropped when the next block opens). The authors keep every block's matrix until no mask is left, and
when their early stop fills the answer with EOS first, into their decoder's next call: a later prompt of the same
shape then starts from that credit. refusion starts every request fresh. The matrix costs block length x vocabulary
x 4 bytes per row while its block is open, as the authors' does (16 MiB for a 32-token block of LLaDA-8B's 126,464
ids).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.validators import non_negative_number, probability

#: the authors' band under the best confidence that is always accepted
BAND = 1e-5


@attrs.frozen
class Credit(SlotSelector):
    """CreditDecoding's selector: drafts from logits fused with each position's accumulated, decaying credit
    (``credit_alpha`` its weight, ``boost_gamma`` the exponent of the top-1 probability added per step,
    ``decay_beta`` the decay per step), then every masked position whose fused confidence is >= ``threshold``,
    the most confident one always (see the module docstring). One-token slots (``slot_size=1``), as its authors
    decode; the defaults are theirs (``threshold`` as their LLaDA benchmarks' 0.9)."""

    name = "credit"
    rescores = True

    threshold: float = attrs.field(default=0.9, validator=probability)
    credit_alpha: float = attrs.field(default=0.7, validator=non_negative_number)
    boost_gamma: float = attrs.field(default=0.2, validator=non_negative_number)
    decay_beta: float = attrs.field(default=0.8, validator=probability)

    def rescore(self, plan: Plan, logits: torch.Tensor) -> torch.Tensor:
        start, credit = self._credit(plan, logits)
        rows = plan.positions.to(logits.device) - start
        top, token = torch.softmax(logits.to(torch.float32), dim=-1).max(dim=-1)
        credit.index_put_((rows, token), top.pow(self.boost_gamma), accumulate=True)
        return logits + self.credit_alpha * torch.log(credit[rows] + 1)

    def _credit(self, plan: Plan, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        """This block's first position and credit matrix, decayed for this step (made at the block's first plan,
        which holds all of its positions)."""
        block = plan.slots[0].block
        kept = plan.memory.get(self.name)
        if kept is None or kept[0] != block:
            start = int(plan.positions.min())
            width = int(plan.positions.max()) + 1 - start
            kept = plan.memory[self.name] = (block, start, torch.zeros(width, logits.shape[-1], device=logits.device))
        else:
            kept[2].mul_(self.decay_beta)
        return kept[1], kept[2]

    def select(self, plan: Plan) -> Sequence[int]:
        confidence = plan.first_confidence  # float32, or float64 with precision="float64" (dInfer's use_float64)
        bar = (confidence.max() - BAND).clamp(-1000.0, self.threshold)  # in that dtype, as the authors compute it
        return (confidence >= bar).nonzero().flatten().tolist()


@hookimpl
def register_selectors(register):
    register(Credit)
