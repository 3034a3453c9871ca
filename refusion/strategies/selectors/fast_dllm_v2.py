"""Fast-dLLM v2's sub-block threshold decoding (its ``Fast_dLLM_QwenForCausalLM.generate``, NVlabs/Fast-dLLM ``v2``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.scored import note_block
from refusion.validators import positive_int, probability


@attrs.frozen
class FastDLLMv2SubBlocks(SlotSelector):
    """Fast-dLLM v2's rule: the model's block of ``block_length`` is decoded ``small_block_size`` positions at a time.

    Positions are counted in the model's blocks from position 0 (the blocks
    of a Fast-dLLM v2 or SDAR model). Each step:

    - when the block's first position is still masked, it alone is taken:
      the authors pick it by argmax from the finished block before (with a
      token-shifted model its logits are that block's last output) before
      the block's first diffusion step;
    - else, in the first sub-block that still has masks, every mask whose
      draft probability is > ``threshold`` (strictly, in the confidences'
      dtype), and always the most probable one (ties to the lowest position,
      as ``torch.argmax``).

    ``threshold`` 1 (the authors' ``generate`` default) takes one position a
    step. A ``small_block_size`` that does not divide the block leaves a
    shorter last sub-block (the authors' code never decodes those positions;
    their call is refused so, :mod:`refusion.peers.fast_dllm_v2`). The
    ``fast-dllm-v2`` preset uses one-token slots; with longer ones a slot
    counts by its first position.
    """

    name = "fast-dllm-v2"
    #: decides by the masks left in a block, which only shrink; a denoising canvas re-decides every position
    requires: ClassVar[dict[str, object]] = {"denoiser": False}

    threshold: float = attrs.field(default=0.9, validator=probability)
    small_block_size: int = attrs.field(default=8, validator=positive_int)
    #: the model's block (the sub-blocks are counted inside it, from position 0)
    block_length: int = attrs.field(default=32, validator=positive_int)

    def candidates_at(self, positions: Sequence[int]) -> int:
        """The block's first position alone while it is masked, else the masks of the first sub-block with masks:
        only those are drafted (so the sub-block cache can feed that sub-block alone)."""
        offsets = [p % self.block_length for p in positions]
        if offsets[0] == 0:
            return 1
        current = offsets[0] // self.small_block_size
        return sum(1 for o in offsets if o // self.small_block_size == current and o >= offsets[0])

    def select(self, plan: Plan) -> Sequence[int]:
        note_block(plan)
        firsts = plan.positions[plan.first_rows]
        offsets = firsts % self.block_length
        if int(offsets[0]) == 0:  # the block's first position: taken alone, from the block before
            return [0]
        sub = offsets.div(self.small_block_size, rounding_mode="floor")
        among = sub == sub[0]
        scores = plan.first_confidence
        masked = torch.where(among, scores, torch.full_like(scores, -torch.inf))
        kept = masked > self.threshold
        kept[int(masked.argmax())] = True
        return kept.nonzero().flatten().tolist()


@hookimpl
def register_selectors(register):
    register(FastDLLMv2SubBlocks)
