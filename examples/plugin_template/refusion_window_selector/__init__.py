"""An example refusion plugin: the ``window`` slot selector.

It behaves like the paper's confidence threshold, but only among the first
``width`` still-masked slots of the block, so decoding never runs far ahead of
the leftmost gap (a locality constraint in the spirit of semi-AR decoding).
Copy this package to start your own plugin.
"""

from __future__ import annotations

import attrs

from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.validators import positive_int, probability


@attrs.frozen
class WindowThreshold(SlotSelector):
    """Slots among the first ``width`` remaining whose first-token confidence exceeds ``threshold``; else the best."""

    name = "window"

    width: int = attrs.field(default=2, validator=positive_int)
    threshold: float = attrs.field(default=0.9, validator=probability)

    def select(self, plan):
        scores = plan.first_confidence[: self.width]
        chosen = (scores > self.threshold).nonzero().flatten().tolist()
        return chosen or [int(scores.argmax())]


@hookimpl
def register_selectors(register):
    register(WindowThreshold)
