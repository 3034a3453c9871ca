"""A selector with memory: accept a masked position once its draft has stayed the same and confident for a while.

Each position's draft and a running mean of its confidence are kept across the steps of the block in
``plan.memory`` (the row's own state: made with the sequence, dropped with it). A position is chosen when its
running mean reaches ``threshold``; the most confident position always is, so every step decides one at least.
"""

from __future__ import annotations

import attrs

from refusion.parts import SlotSelector, hookimpl


@attrs.frozen
class Steady(SlotSelector):
    name = "steady"
    threshold: float = 0.8
    weight: float = 0.5  # of the newest step in the running mean

    def select(self, plan):
        seen = plan.memory.setdefault(self.name, {})  # position -> (draft token, running mean confidence)
        tokens = plan.tokens[plan.first_rows].tolist()
        chosen = []
        for i, position in enumerate(plan.positions[plan.first_rows].tolist()):
            token, confidence = tokens[i], float(plan.first_confidence[i])
            last, mean = seen.get(position, (token, confidence))
            mean = confidence if last != token else self.weight * confidence + (1 - self.weight) * mean
            seen[position] = (token, mean)
            if mean >= self.threshold:
                chosen.append(i)
        return chosen or [int(plan.first_confidence.argmax())]


@hookimpl
def register_selectors(register):
    register(Steady)
