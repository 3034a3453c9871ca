"""The whole-batch loop of plan-and-infill decoders (any selector, ``parallel-ar``, ``commit-order``): every row gets
the tokens, slots, iterations, forwards and cache of its per-sequence program, whatever the batch."""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import refusion
from refusion.api import build_decoder
from refusion.decoding.decoder import Decoder
from refusion.decoding.forms import form_for
from refusion.decoding.forms.plan_infill import PlanInfill
from refusion.decoding.loop import drive
from refusion.engines import open_engine
from refusion.errors import PluginError
from refusion.strategies.base import SlotSelector
from tests.support.helpers import decode_counting_loop_forwards, tiny


@attrs.frozen
class Rightmost(SlotSelector):
    """A per-sequence selector (no batched form): the rightmost drafted slot."""

    name = "rightmost-test"

    def select(self, plan):
        return [len(plan) - 1]


@attrs.frozen
class Everything(SlotSelector):
    """A batched selector written against ``Plans``: every drafted slot of every row."""

    name = "everything-test"

    def select(self, plan):
        return list(range(len(plan)))

    def choose(self, plans):
        return [list(range(int(n))) for n in plans.lengths]


def _same(a, b):
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.commit_step.tolist() == b.commit_step.tolist()
    assert a.region_tokens == b.region_tokens
    assert (a.num_iterations, a.forwards, a.fed_tokens) == (b.num_iterations, b.forwards, b.fed_tokens)
    assert a.stopped_at_eos == b.stopped_at_eos


SELECTORS = ["threshold", "topk", "margin", "entropy", "leftmost", Rightmost(), Everything()]
#: refusion's fused float32 path, the reference's (softmax in the logits' dtype, torch.topk ties), float64
ARITHMETIC = [{}, dict(precision="logits", ties="slots"), dict(precision="float64")]
#: greedy, and samplers that draw (each row from its own seeded generator): temperature/top-k, LLaDA's Gumbel noise
#: over the canvas, SDAR's block multinomial
SAMPLERS = [
    {},
    dict(sampler="categorical", temperature=0.8),
    dict(sampler="categorical", temperature=1.0, top_k=3),
    dict(sampler="gumbel", temperature=0.6),
    dict(sampler="block-multinomial", temperature=0.9),
]


def _decoder(selector, slot_size, gen_length, blocks, token_threshold, stop_at_eos, arithmetic, sampler=None):
    slots = -(-gen_length // slot_size)
    if selector != "threshold":
        arithmetic = {k: v for k, v in arithmetic.items() if k != "ties"}
    return Decoder.from_names(
        selector=selector,
        infiller="parallel-ar",
        slot_size=slot_size,
        serial_num_blocks=blocks if slots % blocks == 0 else 1,
        token_threshold=token_threshold,
        stop_at_eos=stop_at_eos,
        seed=7,
        **arithmetic,
        **(sampler or {}),
    )


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 60),
    prompts=st.lists(st.lists(st.integers(1, 22), min_size=1, max_size=9), min_size=1, max_size=5),
    gen_length=st.integers(1, 19),
    slot_size=st.integers(1, 6),
    blocks=st.integers(1, 3),
    selector=st.sampled_from(SELECTORS),
    token_threshold=st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]),
    stop_at_eos=st.booleans(),
    eos=st.sampled_from([None, 3, 7]),
    arithmetic=st.sampled_from(ARITHMETIC),
    sampler=st.sampled_from(SAMPLERS),
)
def test_the_loop_gives_every_row_what_its_program_gives(
    seed, prompts, gen_length, slot_size, blocks, selector, token_threshold, stop_at_eos, eos, arithmetic, sampler
):
    model = tiny(seed=seed, eos=eos)
    decoder = _decoder(selector, slot_size, gen_length, blocks, token_threshold, stop_at_eos, arithmetic, sampler)
    together, sessions, calls = decode_counting_loop_forwards(decoder, model, prompts, gen_length, columnar=True)
    programs, alone_sessions, none = decode_counting_loop_forwards(decoder, model, prompts, gen_length, columnar=False)
    assert calls > 0 and none == 0
    for a, b, s, t in zip(together, programs, sessions, alone_sessions):
        _same(a, b)
        assert s.committed == t.committed  # streams see the same pieces
        assert s.cache.tokens.tolist() == t.cache.tokens.tolist()  # the cache in commit order
        assert s.cache.positions.tolist() == t.cache.positions.tolist()
    for prompt, a in zip(prompts, together):  # a row decides alone what it decides in the batch
        _same(a, decode_counting_loop_forwards(decoder, model, [prompt], gen_length, columnar=True)[0][0])


@pytest.mark.parametrize("seed", range(8))
def test_in_bfloat16_the_loop_gives_the_programs_tokens(seed):
    """The checkpoints' dtype: a batch decoded by the loop gets the tokens the programs give the same batch."""
    model = tiny(seed=seed, eos=3, dtype=torch.bfloat16)
    prompts = [[1 + (seed + i) % 20, 5, 9 - i] for i in range(3)]
    for arithmetic in ARITHMETIC:
        decoder = _decoder("threshold", 3, 12, 2, 0.3, True, arithmetic)
        together, _, calls = decode_counting_loop_forwards(decoder, model, prompts, 12, columnar=True)
        programs, _, _ = decode_counting_loop_forwards(decoder, model, prompts, 12, columnar=False)
        assert calls > 0
        for a, b in zip(together, programs):
            _same(a, b)


def test_the_shipped_models_preset_runs_in_the_loop_with_its_programs_tokens():
    model = refusion.load_model(None, dtype="float32")
    decoder = build_decoder(model)[0]
    assert form_for(decoder, open_engine(model, decoder, None), record=False) == (PlanInfill, None)
    prompts = [model.tokenizer.encode(p) for p in ("rev abcdef=", "rep 3 ab=", "copy hello=", "sort dcba=")]
    together, _, calls = decode_counting_loop_forwards(decoder, model, prompts, 32, columnar=True)
    programs, _, _ = decode_counting_loop_forwards(decoder, model, prompts, 32, columnar=False)
    for a, b in zip(together, programs):
        _same(a, b)
    assert calls == max(r.forwards for r in together)  # one forward per step serves every row


@attrs.frozen
class Empty(SlotSelector):
    name = "empty-test"

    def select(self, plan):
        return []


def test_a_plugin_selectors_bad_answer_is_named_in_the_loop_too():
    model = tiny()
    decoder = Decoder.from_names(selector=Empty(), infiller="parallel-ar", slot_size=2)
    assert form_for(decoder, open_engine(model, decoder, None), record=False) == (PlanInfill, None)
    with pytest.raises(PluginError, match="selector 'empty-test'.*empty selection"):
        decoder.decode(model, [1, 2], 4)


@pytest.mark.parametrize(
    "options, reason",
    [
        (dict(infiller="draft"), "no batched form"),
        (dict(reorderer="reencode"), "commit order"),
        (dict(cfg_scale=1.5), "guidance"),
    ],
)
def test_other_compositions_run_as_programs(options, reason):
    model = tiny()
    decoder = Decoder.from_names(**(dict(selector="threshold", infiller="parallel-ar") | options))
    assert reason in form_for(decoder, open_engine(model, decoder, None), record=False)[1]


def test_records_keep_the_program_and_give_the_same_tokens():
    model = tiny(seed=3)
    decoder = Decoder.from_names(selector="threshold", infiller="parallel-ar", slot_size=2, token_threshold=0.4)
    assert "records" in form_for(decoder, open_engine(model, decoder, None), record=True)[1]
    recorded = decoder.decode(model, [1, 2, 3], 8, record=True)
    assert len(recorded.iterations) == recorded.num_iterations > 0
    assert torch.equal(recorded.tokens, decoder.decode(model, [1, 2, 3], 8).tokens)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 40),
    lengths=st.lists(st.integers(1, 16), min_size=2, max_size=5),
    slot_size=st.integers(2, 5),
    token_threshold=st.sampled_from([0.5, 1.0]),
)
def test_rows_that_finish_early_leave_the_others_branches_intact(seed, lengths, slot_size, token_threshold):
    """Rows of other lengths finish while the others infill branches (their keys/values beyond the committed
    context, kept when the engine moves rows into the freed ones): each row gets what its program gives alone."""
    model = tiny(seed=seed)
    decoder = Decoder.from_names(
        selector="threshold",
        infiller="parallel-ar",
        slot_size=slot_size,
        serial_num_blocks=1,
        token_threshold=token_threshold,
    )
    engine = open_engine(model, decoder, None)
    prompts = [[1 + (seed + i) % 20, 4, 2 + i] for i in range(len(lengths))]
    sessions = [decoder.start(model, engine, decoder.prepare(model, p, n)) for p, n in zip(prompts, lengths)]
    for result, prompt, n in zip(drive(engine, sessions), prompts, lengths):
        _same(result, decode_counting_loop_forwards(decoder, model, [prompt], n, columnar=False)[0][0])
