"""The paper's slot selection: first-token confidence above a threshold, top-1 fallback."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from refusion.decoding.plans import Plans, rows_to_lists, top_k_rows
from refusion.decoding.types import Plan
from refusion.errors import ConfigError
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.scored import TIES, note_block, ranked
from refusion.validators import boolean, non_negative_int, one_of, probability


@attrs.frozen
class ConfidenceThreshold(SlotSelector):
    """Every slot whose first draft token has probability > ``slot_threshold``; else the most confident one.

    ReFusion (arXiv 2512.13586) scores a slot by the confidence of its first
    token and keeps it when strictly above the threshold (the default).
    ``inclusive=True`` keeps a slot whose confidence *equals* the threshold
    too: Fast-dLLM's rule (``confidence >= threshold``), its confidence-threshold
    parallel decoding with one-token slots. Fallback ties go to the lowest
    position, or as ``torch.topk`` breaks them on the row the peer ranks
    (``ties``: ReFusion ``"slots"``, Fast-dLLM ``"canvas"`` or, with its
    caches, ``"canvas-then-suffix"`` / ``"canvas-then-serial-block"``,
    LLaDA 2.1 ``"model-block"``: its ``torch.topk`` over the model's block
    of ``block_length`` that holds the slots, by position when they are not
    inside one; see :func:`~refusion.strategies.selectors.scored.ranked`).
    The comparison is made in the confidences' dtype, as torch makes it.
    """

    name = "threshold"

    slot_threshold: float = attrs.field(default=0.9, validator=probability)
    inclusive: bool = attrs.field(default=False, validator=boolean)
    ties: str = attrs.field(default="lowest", validator=one_of(TIES))
    #: the model's block (``ties="model-block"`` ranks it); 0: none
    block_length: int = attrs.field(default=0, validator=non_negative_int)

    def __attrs_post_init__(self) -> None:
        if self.ties == "model-block" and not self.block_length:
            raise ConfigError(
                "`ties`='model-block' ranks the model's block of `block_length` tokens: give `block_length` "
                "(the model's block, e.g. 32 for LLaDA 2.x), or choose other `ties`.",
                param="block_length",
            )

    def select(self, plan: Plan) -> Sequence[int]:
        note_block(plan)
        scores = plan.first_confidence
        kept = scores >= self.slot_threshold if self.inclusive else scores > self.slot_threshold
        chosen = kept.nonzero().flatten().tolist()
        if chosen:
            return chosen
        ties = self.ties
        if ties == "model-block":  # LLaDA 2.1 ranks its model block; a plan outside one ranks by position
            firsts = plan.positions[plan.first_rows]
            start = int(firsts[0]) - int(firsts[0]) % self.block_length
            ties = ties if int(firsts.max()) < start + self.block_length else "lowest"
        return ranked(
            plan, scores, 1, ties, self.block_length, among=1 if ties in ("slots", "model-block") else len(plan)
        )

    def choose(self, plans: Plans) -> list[Sequence[int]]:
        if self.ties not in ("lowest", "slots"):  # the other peers' torch.topk rows need each plan's layout
            return super().choose(plans)
        scores = plans.first_confidence  # -inf where a row has no slot
        kept = scores >= self.slot_threshold if self.inclusive else scores > self.slot_threshold
        if self.ties == "lowest":
            kept |= top_k_rows(scores, 1, plans.valid) & ~kept.any(-1, keepdim=True)
        else:  # ReFusion's fallback: torch.topk over the row's own slot confidences
            for i in (~kept.any(-1)).nonzero().flatten().tolist():
                kept[i, torch.topk(scores[i, : int(plans.lengths[i])], 1).indices] = True
        return rows_to_lists(kept)


@hookimpl
def register_selectors(register):
    register(ConfidenceThreshold)
