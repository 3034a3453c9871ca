"""D2F's pipelined block decoding (Discrete Diffusion Forcing, arXiv 2508.09192): several blocks in flight, each
decided by a confidence threshold, blocks added and fully activated as the ones before them fill.

Restated from its authors' code (zhijie-group/Discrete-Diffusion-Forcing ``D2F-eval/eval_llada.py``,
``_generate_block_single`` and ``_update_block_completion_states``). The answer is cut into blocks of
``block_size``; the blocks added so far are the selector's memory (``plan.memory``, the row's own state). At each
step, from the masks left in each block (``progress`` = the share of a block decoded; the prompt is block 0, always
decoded):

1. a block is added after the last one when the last one's progress reached ``block_add_threshold`` (at most one
   per step);
2. a block whose previous block's progress reached ``decoded_token_threshold`` is *fully activated* (the first one
   always is, after the prompt); the others added are *semi-activated*;
3. in every added block, the masks whose draft probability is above ``skip_threshold`` (strictly) are chosen; a
   fully activated block that got none gets its most confident mask.

The model attends block-causally (a block sees itself and the blocks before it, the prompt being one), and a
finished block's keys/values are cached once every block before it is finished: the reorderer ``block-causal``
(the ``d2f`` preset).
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


@attrs.frozen
class PipelinedBlocks(SlotSelector):
    """D2F's rule (see the module docstring): blocks of ``block_size`` added as the last passes
    ``block_add_threshold`` of progress, fully activated as the one before passes ``decoded_token_threshold``; in
    every added block the masks of draft probability > ``skip_threshold``, and a fully activated block's most
    confident when it got none. Defaults: the authors' LLaDA HumanEval settings."""

    name = "d2f"

    block_size: int = attrs.field(default=32, validator=positive_int)
    block_add_threshold: float = attrs.field(default=0.1, validator=probability)
    decoded_token_threshold: float = attrs.field(default=0.95, validator=probability)
    skip_threshold: float = attrs.field(default=0.9, validator=non_negative_number)

    def select(self, plan: Plan) -> Sequence[int]:
        blocks = BlocksInFlight.of(plan, self.name, self.block_size, added=0)
        state, block_of, masks, progress = blocks.state, blocks.block_of, blocks.masks, blocks.progress
        if state["added"] < blocks.count and progress(state["added"]) >= self.block_add_threshold:
            state["added"] += 1
        confidence = plan.first_confidence
        chosen = (confidence > self.skip_threshold) & (block_of <= state["added"])
        for k in range(1, state["added"] + 1):
            inside = block_of == k
            if masks[k] and progress(k - 1) >= self.decoded_token_threshold and not bool(chosen[inside].any()):
                in_block = inside.nonzero().flatten()  # the authors' torch.topk over the block's masks, in order
                chosen[in_block[torch.topk(confidence[in_block], 1).indices]] = True
        if not bool(chosen.any()):  # not reached while a mask is left (block 1 is fully activated); a guard
            chosen[int(torch.argmax(torch.where(block_of <= max(state["added"], 1), confidence, -1.0)))] = True
        return chosen.nonzero().flatten().tolist()


@hookimpl
def register_selectors(register):
    register(PipelinedBlocks)
