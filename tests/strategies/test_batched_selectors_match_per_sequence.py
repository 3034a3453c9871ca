"""A selector's batched ``choose`` gives every row what its per-sequence ``select`` gives that row alone (ties
included), and the decoder calls ``choose`` once per engine step for all the sequences that share a selector."""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

from refusion.decoding.decoder import Decoder
from refusion.decoding.plans import Plans
from refusion.decoding.types import Plan, Slot
from refusion.strategies.selectors.entropy import LowestEntropy
from refusion.strategies.selectors.leftmost import Leftmost
from refusion.strategies.selectors.margin import TopKMargin
from refusion.strategies.selectors.threshold import ConfidenceThreshold
from refusion.strategies.selectors.topk import TopKConfidence
from tests.support.helpers import tiny


def plan(lengths: list[int], logits: torch.Tensor) -> Plan:
    slots, offset = [], 0
    for i, n in enumerate(lengths):
        slots.append(Slot(i, offset, n, 0))
        offset += n
    return Plan.from_logits(tuple(slots), torch.arange(offset) + 3, logits)


@st.composite
def plan_groups(draw):
    rows = draw(st.integers(1, 5))
    vocab = draw(st.integers(2, 6))
    levels = draw(st.integers(1, 4))  # few distinct logit values: many exact ties
    out = []
    for _ in range(rows):
        lengths = draw(st.lists(st.integers(1, 3), min_size=1, max_size=6))
        values = draw(st.lists(st.integers(0, levels), min_size=sum(lengths) * vocab, max_size=sum(lengths) * vocab))
        dtype = draw(st.sampled_from([torch.float32, torch.float64]))
        logits = torch.tensor(values, dtype=dtype).reshape(sum(lengths), vocab) * 1.5
        out.append(plan(lengths, logits))
    return out


SELECTORS = [
    ConfidenceThreshold(slot_threshold=0.5),
    ConfidenceThreshold(slot_threshold=0.4, inclusive=True),
    ConfidenceThreshold(slot_threshold=0.99),
    ConfidenceThreshold(slot_threshold=0.99, ties="slots"),  # ReFusion's fallback: torch.topk over the slots
    ConfidenceThreshold(slot_threshold=0.5, ties="slots"),
    TopKConfidence(k=1),
    TopKConfidence(k=3),
    TopKMargin(k=2),
    LowestEntropy(k=2),
    Leftmost(),
]


@settings(max_examples=150, deadline=None)
@given(group=plan_groups(), which=st.sampled_from(range(len(SELECTORS))))
def test_choose_gives_each_row_its_own_select(group, which):
    selector = SELECTORS[which]
    batched = selector.choose(Plans(group))
    assert [sorted(c) for c in batched] == [sorted(selector.select(p)) for p in group]


def test_every_built_in_score_selector_has_a_batched_choose():
    from refusion.strategies.base import SlotSelector

    for selector in SELECTORS:
        assert type(selector).choose is not SlotSelector.choose, type(selector).__name__


def test_the_decoder_calls_choose_once_per_step_for_the_whole_batch(monkeypatch):
    calls = []
    original = ConfidenceThreshold.choose

    def counted(self, plans):
        calls.append(len(plans))
        return original(self, plans)

    monkeypatch.setattr(ConfidenceThreshold, "choose", counted)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1)
    prompts = [[1, 2], [3], [4, 5, 6], [7]]
    batched = decoder.decode_batch(tiny(), prompts, 8)
    assert max(calls) == len(prompts)  # the first iteration decides for every sequence at once
    alone = [decoder.decode(tiny(), p, 8) for p in prompts]
    assert [r.tokens.tolist() for r in batched] == [r.tokens.tolist() for r in alone]
