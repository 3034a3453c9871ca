"""``wino``: WINO's wide-in rule (Feng-Hong/WINO-DLLM ``LLaDA/decoding.py`` ``decoding_wino``).

Every masked position of the block whose draft probability is strictly above
``threshold`` is accepted, at most ``min(max(0.7 n, 5), 20)`` of them (``n``:
the block's masked positions; the most probable, as ``torch.topk`` picks them
on WINO's canvas-long vector); if none is, the most probable one. With one-token
slots in blocks (``semi-ar``), the ``draft`` infiller and the ``wino`` reviser,
it is WINO's decoder (the ``wino`` preset).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.validators import probability


def max_accept(masked: int) -> int:
    """WINO's cap on the positions one step accepts: ``min(max(int(0.7 n), 5), 20)`` (exact in integers)."""
    return min(max(7 * masked // 10, 5), 20)


@attrs.frozen
class WinoSelector(SlotSelector):
    """Slots whose first draft token's probability is > ``threshold``, capped as WINO caps them; else the best."""

    name = "wino"
    #: decides by the masks left in a block, which only shrink; a denoising canvas re-decides every position
    requires: ClassVar[dict[str, object]] = {"denoiser": False}

    threshold: float = attrs.field(default=0.6, validator=probability)

    def select(self, plan: Plan) -> Sequence[int]:
        scores = plan.first_confidence
        starts = plan.positions[plan.first_rows]
        # WINO ranks a vector over its whole input (prompt, region, verification block), -inf off the masks
        length = int(plan.canvas_length or int(starts.max()) + 1)
        full = torch.full((length,), float("-inf"), dtype=scores.dtype)
        full[starts] = scores
        above = full > self.threshold
        cap = max_accept(len(scores))
        if int(above.sum()) > cap:
            picked = torch.topk(full, cap).indices
        elif bool(above.any()):
            picked = above.nonzero().squeeze(-1)
        else:
            picked = full.argmax().reshape(1)
        index = {int(p): i for i, p in enumerate(starts.tolist())}
        return sorted(index[int(p)] for p in picked)


@hookimpl
def register_selectors(register):
    register(WinoSelector)
