"""d3LLM's multi-block decoding (arXiv 2601.07568): several blocks in flight over a full-attention canvas, an entropy
threshold across all of them.

Restated from its authors' code (hao-ai-lab/d3LLM ``d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py``,
``generate_multi_block`` and ``get_transfer_index_entropy``). The answer is cut into blocks of ``block_size``; the
blocks are the selector's memory, kept in ``plan.memory`` (the row's own state). At each step, from the masks left in
each block (``progress`` = the share of a block decoded; the prompt counts as a decoded block):

1. a block whose previous block's progress reached ``decoded_token_threshold`` is *fully activated* (the first block
   is, after the prompt);
2. a new block is added after the last one when the last one's progress reached ``block_add_threshold`` or it has no
   mask left (at most one per step);
3. the decode window ends with the last block that is fully activated or still has masks;
4. of the masked positions in the window, the one of lowest entropy (float64, ``-sum p log(p + 1e-12)``) is chosen,
   and every other whose entropy is <= ``threshold``;
5. if the first fully activated block that still has masks got nothing, its lowest-entropy mask is chosen too.

The model sees the whole canvas at every step (the authors' ``model(x)``: every block, added or not, with full
attention), so the decoder runs this selector on one serial block over the answer with one-token slots and no cache
(the ``d3llm`` preset). With several serial blocks each is decoded this way in turn. An answer length that is not
a multiple of ``block_size`` gets a shorter last block (the authors' loop leaves such a tail masked until its
10,000-step guard).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from refusion.decoding.types import Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.selectors.blocks import BlocksInFlight
from refusion.validators import non_negative_number, positive_int, probability


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """d3LLM's entropy of each row of ``logits``: ``-sum(p * log(p + 1e-12))`` with ``p`` the float64 softmax."""
    p = torch.softmax(logits.to(torch.float64), dim=-1)
    return -torch.sum(p * torch.log(p + 1e-12), dim=-1)


@attrs.frozen
class MultiBlockEntropy(SlotSelector):
    """d3LLM's multi-block rule (see the module docstring): blocks of ``block_size`` added as the last one passes
    ``block_add_threshold`` of progress, fully activated as the one before passes ``decoded_token_threshold``;
    the lowest-entropy mask of the window and every mask of entropy <= ``threshold`` (nats) chosen, plus the
    first active block's best when it got nothing. Defaults: the authors' ``generate_multi_block``'s."""

    name = "d3llm"

    threshold: float = attrs.field(default=0.5, validator=non_negative_number)
    block_size: int = attrs.field(default=32, validator=positive_int)
    block_add_threshold: float = attrs.field(default=0.5, validator=probability)
    decoded_token_threshold: float = attrs.field(default=0.5, validator=probability)

    def select(self, plan: Plan) -> Sequence[int]:
        blocks = BlocksInFlight.of(plan, self.name, self.block_size, added=1)
        state, block_of, masks, progress = blocks.state, blocks.block_of, blocks.masks, blocks.progress
        last = state["added"]
        if last < blocks.count and (progress(last) >= self.block_add_threshold or masks[last] == 0):
            state["added"] = last = last + 1
        active = [k for k in range(1, last + 1) if progress(k - 1) >= self.decoded_token_threshold]
        window = max([k for k in range(1, last + 1) if k in active or masks[k] > 0], default=0)
        inside = block_of <= window
        scores = entropy(plan.first_logits)
        # the authors rank the whole canvas row (+inf outside the window) with torch.topk: this row keeps the
        # window's masks in canvas order (only exact float64 ties in the lowest entropy could be ordered otherwise)
        row = torch.where(inside, scores, torch.inf)
        order = torch.topk(row, int(inside.sum()), largest=False).indices
        chosen = torch.zeros(len(block_of), dtype=torch.bool)
        if len(order):
            chosen[order[0]] = True
            chosen[order[1:]] = scores[order[1:]] <= self.threshold
        first = next((k for k in active if masks[k] > 0), None)
        if first is not None and not bool(chosen[block_of == first].any()):
            in_block = torch.where(block_of == first, scores, torch.inf)
            chosen[int(in_block.argmin())] = True
        if not bool(chosen.any()):  # not reached with one-token slots (the window always holds a mask); a guard
            chosen[int(scores.argmin())] = True
        return chosen.nonzero().flatten().tolist()


@hookimpl
def register_selectors(register):
    register(MultiBlockEntropy)
