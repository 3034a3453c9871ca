"""Fast-dLLM v2's sub-block rule (selector ``fast-dllm-v2``), one rule per example, on hand-made plans."""

import torch

from refusion.decoding.types import Plan, Slot
from refusion.strategies.selectors.fast_dllm_v2 import FastDLLMv2SubBlocks


def plan_at(positions, probs, vocab=8):
    """One-token slots at absolute ``positions`` whose draft (token 0) has probability ``probs[i]``."""
    logits = torch.zeros((len(positions), vocab), dtype=torch.float64)
    for i, p in enumerate(probs):
        logits[i, 0] = torch.log(torch.tensor(p, dtype=torch.float64))
        logits[i, 1:] = torch.log(torch.tensor((1 - p) / (vocab - 1), dtype=torch.float64))
    slots = tuple(Slot(i, pos, 1, 0) for i, pos in enumerate(positions))
    return Plan.from_logits(slots, torch.tensor(positions), logits)


def test_a_blocks_first_position_still_masked_is_taken_alone():
    rule = FastDLLMv2SubBlocks(threshold=0.5, small_block_size=4, block_length=8)
    assert rule.select(plan_at([16, 17, 18], [0.1, 0.99, 0.99])) == [0]


def test_masks_above_the_threshold_in_the_first_sub_block_with_masks_are_taken():
    rule = FastDLLMv2SubBlocks(threshold=0.5, small_block_size=4, block_length=8)
    # sub-block [16, 20) holds 17, 19; sub-block [20, 24) holds 20, 21: only the first counts
    assert rule.select(plan_at([17, 19, 20, 21], [0.6, 0.9, 0.99, 0.99])) == [0, 1]


def test_without_one_above_the_threshold_the_most_probable_of_the_sub_block_is_taken():
    rule = FastDLLMv2SubBlocks(threshold=0.9, small_block_size=4, block_length=8)
    assert rule.select(plan_at([21, 22, 23], [0.3, 0.6, 0.6])) == [1]  # ties: the lowest position, as torch.argmax
    assert rule.select(plan_at([19, 20], [0.2, 0.99])) == [0]  # 20 is in the next sub-block


def test_the_threshold_is_strict():
    rule = FastDLLMv2SubBlocks(threshold=0.5, small_block_size=8, block_length=8)
    plan = plan_at([9, 10], [0.5, 0.5], vocab=2)  # two equal logits: probability 0.5 exactly
    assert plan.first_confidence.tolist() == [0.5, 0.5]
    assert rule.select(plan) == [0]  # the most probable only: 0.5 is not > 0.5


def test_a_sub_block_that_does_not_divide_the_block_leaves_a_shorter_last_one():
    rule = FastDLLMv2SubBlocks(threshold=0.5, small_block_size=3, block_length=8)
    # sub-blocks of [8, 16): [8, 11) [11, 14) [14, 16)
    assert rule.select(plan_at([14, 15], [0.2, 0.9])) == [1]
    assert rule.select(plan_at([13, 14, 15], [0.2, 0.9, 0.9])) == [0]
