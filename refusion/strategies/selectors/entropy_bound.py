"""The entropy-bound rule (EB-sampler; Ben-Hamu et al., arXiv 2505.24857), DiffusionGemma's acceptance rule.

Sort the slots by the entropy of their first token's distribution, lowest
first, and take the longest prefix whose entropies sum to at most
``entropy_bound`` beyond its largest one: ``sum(H_1..H_k) - H_k <=
entropy_bound``. The left side bounds the mutual information among the chosen
tokens, so they are approximately independent and may be decided together.
The lowest-entropy slot is always chosen (its left side is 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.dtypes import reduction_dtype
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.validators import positive_number


def entropy_bound_choice(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """Indices chosen by the entropy-bound rule from per-row ``entropy`` ``(..., n)``: a boolean mask of the
    same shape (``True`` = chosen). Ties in entropy are ordered as ``torch.sort`` orders them (as
    transformers' ``EntropyBoundSampler.accept_canvas``)."""
    ordered, order = torch.sort(entropy, dim=-1, descending=False)
    chosen = torch.cumsum(ordered, dim=-1) - ordered <= bound
    return torch.scatter(torch.zeros_like(chosen), -1, order, chosen)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row of ``logits`` as ``torch.distributions.Categorical(logits=...).entropy()``
    computes it (DiffusionGemma's arithmetic), in the logits' reduction dtype."""
    return torch.distributions.Categorical(logits=logits.to(reduction_dtype(logits.dtype))).entropy()


@attrs.frozen
class EntropyBound(SlotSelector):
    """The slots whose first tokens pass the entropy-bound rule: lowest entropy first, while the sum of the
    chosen entropies minus the largest stays <= ``entropy_bound`` (nats; default 0.1, transformers'
    DiffusionGemma default). One token per slot (``slot_size=1``) gives the EB-sampler of arXiv 2505.24857
    on masked models (LLaDA, Dream, SDAR) and DiffusionGemma's acceptance on its canvases."""

    name = "entropy-bound"

    entropy_bound: float = attrs.field(default=0.1, validator=positive_number)

    def select(self, plan: Plan) -> Sequence[int]:
        chosen = entropy_bound_choice(token_entropy(plan.first_logits), self.entropy_bound)
        return chosen.nonzero().flatten().tolist()


@hookimpl
def register_selectors(register):
    register(EntropyBound)
