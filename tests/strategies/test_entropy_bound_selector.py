"""The entropy-bound selector (EB-sampler): the lowest-entropy slots whose entropies sum to at most the bound
beyond their largest; on masked families' checkpoints as on DiffusionGemma's canvases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import refusion
from refusion.decoding.types import Plan, Slot
from refusion.errors import ConfigError
from refusion.strategies.selectors.entropy_bound import EntropyBound, entropy_bound_choice, token_entropy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "peers"


def plan_of(rows: list[list[float]]) -> Plan:
    logits = torch.tensor(rows).log()
    slots = tuple(Slot(i, i, 1, 0) for i in range(len(rows)))
    return Plan.from_logits(slots, torch.arange(len(rows)), logits)


SHARP, HALF, QUARTER = [1.0, 1e-12, 1e-12, 1e-12], [0.5, 0.5, 1e-12, 1e-12], [0.25] * 4


@pytest.mark.parametrize(
    "bound, chosen",
    [
        (0.5, [0, 2]),  # H = 0, ln 4, ln 2: the sharp row and the half row (0 + ln 2 - ln 2 = 0 <= 0.5)
        (0.7, [0, 1, 2]),  # + the quarter row: 0 + ln 2 + ln 4 - ln 4 = 0.69 <= 0.7
        (0.69, [0, 2]),  # ... but not under 0.69
    ],
)
def test_it_takes_the_lowest_entropies_while_their_sum_beyond_the_largest_fits(bound, chosen):
    plan = plan_of([SHARP, QUARTER, HALF])
    assert sorted(EntropyBound(entropy_bound=bound).select(plan)) == chosen
    assert token_entropy(plan.first_logits).tolist() == pytest.approx([0.0, math.log(4), math.log(2)], abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 5.0, allow_nan=False, width=32), min_size=1, max_size=24),
    st.floats(1e-3, 10.0, allow_nan=False),
)
def test_the_choice_is_the_longest_entropy_ordered_prefix_within_the_bound(entropies, bound):
    h = torch.tensor(entropies, dtype=torch.float32)
    chosen = entropy_bound_choice(h, bound)
    ordered, order = torch.sort(h)
    k = int(chosen.sum())
    assert k >= 1  # the lowest is always taken
    assert set(order[:k].tolist()) == set(chosen.nonzero().flatten().tolist())
    within = torch.cumsum(ordered, 0) - ordered <= bound
    assert bool(within[:k].all()) and (k == len(entropies) or not bool(within[k]))


def test_a_bound_must_be_positive():
    with pytest.raises(ConfigError, match="entropy_bound"):
        EntropyBound(entropy_bound=0)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_it_decodes_the_masked_families_checkpoints(family):
    model = refusion.load_model(str(FIXTURES / family))
    ids = [4, *range(40, 52)]
    tight = refusion.generate(ids, model, selector="entropy-bound", entropy_bound=1e-6, gen_length=16, record=True)
    loose = refusion.generate(ids, model, selector="entropy-bound", entropy_bound=5.0, gen_length=16, record=True)
    for result in (tight, loose):
        assert (result.commit_step[: len(result.tokens)] >= 0).all()  # every answer position decided
        assert all(r.selected for r in result.iterations)
    assert loose.num_iterations < tight.num_iterations  # a looser bound decides more per forward
