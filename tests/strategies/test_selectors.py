"""Each selector's rule on hand-made plans."""

import math

import pytest
import torch

from refusion.decoding.types import Plan, Slot
from refusion.errors import ConfigError
from refusion.strategies.selectors.entropy import LowestEntropy
from refusion.strategies.selectors.leftmost import Leftmost
from refusion.strategies.selectors.margin import TopKMargin
from refusion.strategies.selectors.threshold import ConfidenceThreshold
from refusion.strategies.selectors.topk import TopKConfidence


def plan_from(first_token_probs, slot_size=2, vocab=4):
    """A plan whose slot i has first-token distribution first_token_probs[i] (other rows uniform)."""
    k = len(first_token_probs)
    slots = tuple(Slot(i, i * slot_size, slot_size, 0) for i in range(k))
    logits = torch.zeros(k * slot_size, vocab, dtype=torch.float64)
    for i, probs in enumerate(first_token_probs):
        logits[i * slot_size] = torch.log(torch.tensor(probs, dtype=torch.float64))
    return Plan.from_logits(slots, torch.arange(k * slot_size) + 10, logits)


PLAN = plan_from(
    [
        [0.50, 0.30, 0.10, 0.10],  # conf .50 margin .20 entropy high
        [0.95, 0.03, 0.01, 0.01],  # conf .95
        [0.60, 0.39, 0.005, 0.005],  # conf .60 margin .21, low entropy-ish
        [0.92, 0.06, 0.01, 0.01],  # conf .92
        [0.45, 0.05, 0.05, 0.45],  # conf .45 margin 0
    ]
)


def test_threshold_selects_every_slot_above_it():
    assert sorted(ConfidenceThreshold(slot_threshold=0.9).select(PLAN)) == [1, 3]
    assert sorted(ConfidenceThreshold(slot_threshold=0.55).select(PLAN)) == [1, 2, 3]


def test_threshold_is_strict_and_falls_back_to_the_most_confident():
    assert list(ConfidenceThreshold(slot_threshold=0.95).select(PLAN)) == [1]  # 0.95 is not > 0.95; top-1 fallback
    assert list(ConfidenceThreshold(slot_threshold=0.99).select(PLAN)) == [1]


def test_leftmost_takes_the_first_remaining_slot():
    assert list(Leftmost().select(PLAN)) == [0]


def test_topk_confidence():
    assert TopKConfidence(k=2).select(PLAN) == [1, 3]
    assert TopKConfidence(k=10).select(PLAN) == [1, 3, 2, 0, 4]


def test_margin_prefers_the_largest_top2_gap():
    margins = PLAN.first_margin.tolist()
    assert margins[4] == pytest.approx(0.0)
    assert TopKMargin(k=1).select(PLAN) == [1]
    assert TopKMargin(k=3).select(PLAN) == [1, 3, 2]


def test_entropy_prefers_the_most_peaked_distribution():
    entropy = PLAN.first_entropy.tolist()
    expected = -sum(p * math.log(p) for p in [0.95, 0.03, 0.01, 0.01])
    assert entropy[1] == pytest.approx(expected)
    assert LowestEntropy(k=2).select(PLAN) == [1, 3]


def test_ties_go_to_the_leftmost_slot():
    tied = plan_from([[0.7, 0.1, 0.1, 0.1]] * 3)
    assert TopKConfidence(k=2).select(tied) == [0, 1]


@pytest.mark.parametrize("bad", [-0.1, 1.5, "high", None])
def test_threshold_validation(bad):
    with pytest.raises(ConfigError, match="`slot_threshold` must be a number in \\[0, 1\\]"):
        ConfidenceThreshold(slot_threshold=bad)


@pytest.mark.parametrize("cls", [TopKConfidence, TopKMargin, LowestEntropy])
def test_k_validation(cls):
    with pytest.raises(ConfigError, match="`k` must be an integer >= 1; got 0"):
        cls(k=0)
