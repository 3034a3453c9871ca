"""``wino``: WINO's narrow-out rule (Feng-Hong/WINO-DLLM ``LLaDA/decoding.py`` ``decoding_wino``).

Each step's forward also runs a leave-one-out row for every position of the
open block (``verifies``): a mask at that position that sees everything but
the token there. A token accepted in an earlier step of the block whose
leave-one-out probability falls below ``threshold_back`` is masked again, but
only in a step that accepted more than one token; when at least as many
qualify as the previous step accepted (30 at a block's start), only the
``previous - 1`` least likely are. Pair it with the ``wino`` selector (wide in).
"""

from __future__ import annotations

import attrs
import torch

from refusion.plugins import hookimpl
from refusion.strategies.base import Reviser, Revision, RevisionView
from refusion.validators import probability

#: WINO's ``last_accept`` at the start of every block
FIRST_LAST_ACCEPT = 30


@attrs.frozen
class WinoReviser(Reviser):
    """Re-mask earlier-accepted tokens whose leave-one-out probability is below ``threshold_back`` (strictly)."""

    name = "wino"
    #: leave-one-out rows need a bidirectional canvas whose logits predict their own position (LLaDA)
    requires = {"causal": False, "logit_shift": 0, "block_length": 0}
    verifies = True
    #: WINO's narrow-out bounds what it masks again by what its wide-in selector accepted, token by token
    pairs_with = "wino"
    token_slots = True

    threshold_back: float = attrs.field(default=0.9, validator=probability)

    def revise(self, view: RevisionView) -> Revision | None:
        memory = view.memory
        last = memory.get("last_accept", FIRST_LAST_ACCEPT)
        accepted = int(view.accepted_now.sum())
        memory["last_accept"] = accepted
        if accepted <= 1 or view.verified is None:
            return None
        earlier = ~view.accepted_now
        low = earlier & (view.verified < self.threshold_back)
        count = int(low.sum())
        if count == 0:
            return None
        if count < last:
            return Revision(remask=view.offsets[low].tolist())
        # WINO takes topk(k=last-1, largest=False) over its canvas-long vector (+inf elsewhere)
        scores = torch.where(low, view.verified, torch.full_like(view.verified, float("inf")))
        chosen = torch.topk(scores, last - 1, largest=False).indices
        return Revision(remask=view.offsets[chosen].tolist())


@hookimpl
def register_revisers(register):
    register(WinoReviser)
