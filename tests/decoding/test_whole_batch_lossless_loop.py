"""The whole-batch (columnar) loop of lossless decoders: the tokens and slots of the per-sequence programs and of
transformers' greedy ``generate``, for every row of any batch, with fewer forwards when drafts are right."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import refusion
from refusion.api import build_decoder
from refusion.decoding.decoder import Decoder
from refusion.decoding.forms import form_for
from refusion.decoding.forms.lossless import Lossless
from refusion.engines import open_engine
from refusion.engines.branch import BranchEngine
from refusion.strategies.infillers.greedy_verify import GreedyVerify
from tests.support.helpers import decode_counting_loop_forwards, hf_greedy, tiny


def _decode(decoder, model, prompts, gen_length, *, columnar):
    """Results and how many whole-batch forwards ran."""
    results, _, calls = decode_counting_loop_forwards(decoder, model, prompts, gen_length, columnar=columnar)
    return results, calls


def _same(a, b, stop_at_eos=True):
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.stopped_at_eos == b.stopped_at_eos
    if not stop_at_eos:  # the loop decodes every position; a program leaves the rest of an EOS's slot undecoded
        assert a.num_iterations == len(a.partition.slots) and (a.commit_step >= 0).all()
        return
    assert a.num_iterations == b.num_iterations
    assert a.commit_step.tolist() == b.commit_step.tolist()


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 50),
    prompts=st.lists(st.lists(st.integers(1, 22), min_size=1, max_size=9), min_size=1, max_size=5),
    gen_length=st.integers(1, 19),
    slot_size=st.integers(1, 6),
    stop_at_eos=st.booleans(),
    eos=st.sampled_from([None, 3, 7]),
    blocks=st.integers(1, 3),
)
def test_the_loop_gives_every_row_the_tokens_and_slots_of_its_program(
    seed, prompts, gen_length, slot_size, stop_at_eos, eos, blocks
):
    model = tiny(seed=seed, eos=eos)
    decoder = Decoder.from_names(
        selector="leftmost",
        infiller="greedy-verify",
        slot_size=slot_size,
        serial_num_blocks=blocks if -(-gen_length // slot_size) % blocks == 0 else 1,
        stop_at_eos=stop_at_eos,
    )
    together, loop_forwards = _decode(decoder, model, prompts, gen_length, columnar=True)
    programs, none = _decode(decoder, model, prompts, gen_length, columnar=False)
    assert loop_forwards > 0 and none == 0
    for prompt, a, b in zip(prompts, together, programs):
        _same(a, b, stop_at_eos)
        assert a.tokens.tolist() == hf_greedy(model, prompt, gen_length)[: len(a.tokens)]
        assert 1 <= a.forwards <= gen_length  # every forward gains at least one token
        assert len(a.tokens) == gen_length or a.stopped_at_eos


@pytest.mark.parametrize("floor, guesses", [(1.01, False), (0.0, True)])
def test_guesses_less_likely_than_the_floor_are_not_fed(monkeypatch, floor, guesses):
    """Above every prediction's probability, no guess is fed after the first step's masks: one token per row and
    forward, as AR decoding; at 0 the mask rows' guesses are fed. Tokens are greedy AR either way."""
    from refusion.decoding.forms.lossless import Lossless as LosslessColumns

    monkeypatch.setattr(LosslessColumns, "min_draft_probability", floor)
    model = tiny(seed=4)
    slot, gen_length = 4, 12
    decoder = Decoder.from_names(
        selector="leftmost", infiller="greedy-verify", slot_size=slot, serial_num_blocks=1, stop_at_eos=False
    )
    prompts = [[1, 2, 3], [7, 8]]
    results, _ = _decode(decoder, model, prompts, gen_length, columnar=True)
    for prompt, r in zip(prompts, results):
        assert r.tokens.tolist() == hf_greedy(model, prompt, gen_length)
        unguessed = len(prompt) + (slot + 1) + (gen_length - 1)  # the prompt and the first masks, then one token
        assert (r.fed_tokens > unguessed) is guesses
        if not guesses:
            assert r.forwards == gen_length


def test_on_the_shipped_model_accepted_drafts_save_forwards():
    model = refusion.load_model(None, dtype="float32")
    decoder = build_decoder(model, preset="ar")[0]
    prompts = [model.tokenizer.encode(p) for p in ("rev abcdef=", "rep 3 ab=", "copy hello=")]
    together, calls = _decode(decoder, model, prompts, 24, columnar=True)
    programs, _ = _decode(decoder, model, prompts, 24, columnar=False)
    for a, b in zip(together, programs):
        _same(a, b)
    assert calls < sum(len(r.tokens) for r in together) / len(prompts)  # more than one token per forward per row


@pytest.mark.parametrize(
    "options, reason",
    [
        (dict(selector="topk"), "trait `leftmost_only`"),
        (dict(infiller=GreedyVerify(adaptive=False)), "not adaptive"),
        (dict(stop_at_eos="block"), "stop_at_eos='block'"),
        (dict(sampler="categorical", temperature=0.7), "draws at random"),
    ],
)
def test_other_compositions_run_as_programs(options, reason):
    model = tiny()
    parts = dict(selector="leftmost", infiller="greedy-verify", serial_num_blocks=1) | options
    decoder = Decoder.from_names(**parts)
    engine = open_engine(model, decoder, None)
    assert reason in form_for(decoder, engine, record=False)[1]


def test_records_keep_the_programs_and_batch_invariance_keeps_the_batched_form():
    model = tiny()
    decoder = Decoder.from_names(selector="leftmost", infiller="greedy-verify", serial_num_blocks=1)
    assert form_for(decoder, open_engine(model, decoder, None), record=False) == (Lossless, None)
    assert "records" in form_for(decoder, open_engine(model, decoder, None), record=True)[1]
    invariant = BranchEngine(model, batch_invariant=True)
    assert form_for(decoder, invariant, record=False) == (Lossless, None)
    result = decoder.decode(model, [1, 2, 3], 6, record=True)
    assert len(result.iterations) == result.num_iterations > 0
    assert torch.equal(result.tokens, decoder.decode(model, [1, 2, 3], 6).tokens)
