"""Equal confidences: every selector takes the lowest position first; the threshold's inclusive/strict choice."""

import pytest
import torch

from refusion.decoding.types import Plan, Slot
from refusion.strategies.selectors.dream_steps import DreamSteps
from refusion.strategies.selectors.entropy import LowestEntropy
from refusion.strategies.selectors.factor import FactorThreshold
from refusion.strategies.selectors.llada_steps import LLaDASteps
from refusion.strategies.selectors.margin import TopKMargin
from refusion.strategies.selectors.threshold import ConfidenceThreshold
from refusion.strategies.selectors.topk import TopKConfidence


def tied_plan(n=4, vocab=2):
    """``n`` one-token slots whose logits are all equal: every score ties (confidence exactly 1 / vocab)."""
    slots = tuple(Slot(i, i, 1, 0) for i in range(n))
    return Plan.from_logits(slots, torch.arange(n) + 3, torch.zeros(n, vocab, dtype=torch.float64))


@pytest.mark.parametrize(
    "selector, count",
    [
        (TopKConfidence(k=2), 2),
        (TopKMargin(k=2), 2),
        (LowestEntropy(k=3), 3),
        (ConfidenceThreshold(0.9), 1),
        (FactorThreshold(factor=1.0), 1),
        (LLaDASteps(steps=2), 2),
        (DreamSteps(steps=2, eps=0.5), 1),
    ],
)
def test_ties_go_to_the_lowest_position(selector, count):
    assert sorted(selector.select(tied_plan())) == list(range(count))


def test_threshold_inclusive_keeps_a_confidence_equal_to_the_threshold():
    plan = tied_plan()  # every confidence is exactly 0.5
    assert ConfidenceThreshold(0.5, inclusive=True).select(plan) == [0, 1, 2, 3]  # Fast-dLLM: >=
    assert ConfidenceThreshold(0.5).select(plan) == [0]  # ReFusion: > (fallback: the best, lowest position)


def test_bad_schedule_options_name_the_parameter():
    from refusion.errors import ConfigError

    with pytest.raises(ConfigError, match="`remasking` must be one of 'low_confidence', 'random'"):
        LLaDASteps(remasking="lowest")
    with pytest.raises(ConfigError, match="`alg` must be one of 'origin'"):
        DreamSteps(alg="greedy")
    with pytest.raises(ConfigError, match="`inclusive` must be True or False"):
        ConfidenceThreshold(inclusive="yes")


def test_steps_not_divisible_by_the_blocks_go_to_the_earliest_blocks():
    from refusion.strategies.selectors.llada_steps import block_steps

    assert [block_steps(4, 3, b) for b in range(3)] == [2, 1, 1]
    assert [block_steps(6, 3, b) for b in range(3)] == [2, 2, 2]  # LLaDA's steps // blocks
    assert [block_steps(2, 3, b) for b in range(3)] == [1, 1, 1]  # a block always gets a step
