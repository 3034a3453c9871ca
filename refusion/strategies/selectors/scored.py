"""Shared rule of the score-based selectors: take the ``k`` best-scoring slots."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import attrs
import torch

from refusion.decoding.plans import Plans, rows_to_lists, top_k_rows
from refusion.decoding.types import Plan
from refusion.strategies.base import SlotSelector
from refusion.validators import positive_int


@attrs.frozen
class TopKByScore(SlotSelector):
    """Select the ``k`` slots with the highest :meth:`score` (fewer if fewer remain).

    Ties go to the leftmost slot, so the rule is deterministic.
    """

    k: int = attrs.field(default=1, validator=positive_int)

    @abstractmethod
    def score(self, plan: Plan) -> torch.Tensor:
        """One score per slot of ``plan``, shape ``(k,)``; higher is picked first."""

    def select(self, plan: Plan) -> Sequence[int]:
        return top_k(self.score(plan), self.k)

    def choose(self, plans: Plans) -> list[Sequence[int]]:
        return rows_to_lists(top_k_rows(plans.stack(self.score, float("-inf")), self.k, plans.valid))


def top_k(scores: torch.Tensor, k: int) -> list[int]:
    """Indices of the ``k`` largest ``scores``, ties broken towards lower indices."""
    k = min(k, scores.shape[0])
    order = torch.sort(scores.double(), descending=True, stable=True).indices
    return order[:k].tolist()


#: how a selector breaks ties between equal scores (:func:`ranked`): towards the lowest position, or as
#: ``torch.topk`` breaks them on the row a peer ranks (which it does not do by position)
TIES = (
    "lowest",
    "slots",
    "canvas",
    "suffix",
    "serial-block",
    "canvas-then-suffix",
    "canvas-then-serial-block",
    "model-block",
)


def note_block(plan: Plan) -> None:
    """Remember the current serial block's bounds (absolute positions) and count its steps, in ``plan.memory``.

    Call it at every :meth:`select` of a selector that ranks with :func:`ranked`: the first plan of a block
    holds all of its slots, so its bounds are the block's.
    """
    key = ("ties", plan.slots[0].block)
    seen = plan.memory.get(key)
    if seen is None:
        start = int(plan.positions[plan.offsets[0]])
        stop = int(plan.positions[plan.offsets[-1] - 1]) + 1
        plan.memory[key] = seen = [start, stop, 0]
    seen[2] += 1


def ranked(
    plan: Plan, scores: torch.Tensor, k: int, ties: str = "lowest", block_length: int = 0, among: int | None = None
) -> list[int]:
    """Indices of the ``k`` highest ``scores`` (one per slot of ``plan``), ties broken as ``ties`` says.

    ``"lowest"``: towards the lowest position (:func:`top_k`). The others
    call ``torch.topk`` (whose choice among equal values depends on where
    they sit in the row) on the row a peer ranks, built with ``scores`` at
    the slots' first positions and ``-inf`` elsewhere, in ``scores``' dtype:
    ``"slots"`` the plan's slots in order (ReFusion's slot confidences);
    ``"canvas"`` prompt plus answer (LLaDA, Dream, Fast-dLLM without cache);
    ``"suffix"`` / ``"serial-block"`` from the serial block's start to the
    answer's end / to the block's end (Fast-dLLM's prefix / dual cache);
    ``"canvas-then-..."`` the canvas at a block's first step (Fast-dLLM's
    full forward there), then the suffix or block; ``"model-block"`` the
    model's block of ``block_length`` that holds the slots (SDAR). Layouts
    that need the serial block read it from :func:`note_block`. ``among``:
    the ``k`` asked of ``torch.topk`` when the peer asks for more than it
    keeps (Fast-dLLM's and Dream's thresholds rank every mask and keep the
    first), since the order of equal values depends on it.
    """
    k = min(k, len(scores))
    width = max(k, min(among or k, len(scores)))
    if ties == "lowest":
        return top_k(scores, k)
    if ties == "slots":
        return torch.topk(scores, width).indices[:k].tolist()
    firsts = plan.positions[plan.first_rows].cpu()
    if ties == "model-block":
        start = int(firsts[0]) - int(firsts[0]) % block_length
        length = block_length
    else:
        bounds = plan.memory.get(("ties", plan.slots[0].block))
        layout = ties
        if ties.startswith("canvas-then-"):
            layout = "canvas" if bounds is None or bounds[2] <= 1 else ties[len("canvas-then-") :]
        if layout == "canvas":
            start, length = 0, plan.canvas_length or int(firsts.max()) + 1
        else:
            if bounds is None:
                raise RuntimeError(f"ties {ties!r} need the serial block's bounds: call note_block(plan) first")
            start = bounds[0]
            length = (bounds[1] if layout == "serial-block" else plan.canvas_length or bounds[1]) - start
    row = torch.full((length,), float("-inf"), dtype=scores.dtype)
    row[firsts - start] = scores.cpu()
    slot_at = {int(p) - start: i for i, p in enumerate(firsts.tolist())}
    return [slot_at[int(j)] for j in torch.topk(row, width).indices[:k]]
