"""The batched engine: batch equals single, branch masks equal batch repeat, in-place cache costs."""

import attrs
import pytest
import torch
from hypothesis import given, strategies as st

from refusion.cache.calls import Branch, Extend, ModelCall
from refusion.cache.kv import KVSegment
from refusion.cache.stores import DynamicStore, PreallocatedKV
from refusion.decoder import Decoder
from refusion.errors import ConfigError
from tests.helpers import tiny

SETTINGS = st.fixed_dictionaries({
    "selector": st.sampled_from(["threshold", "topk", "leftmost", "margin", "entropy"]),
    "infiller": st.sampled_from(["parallel-ar", "greedy-verify"]),
    "reorderer": st.sampled_from(["commit-order", "reencode"]),
    "slot_size": st.integers(1, 4),
    "serial_num_blocks": st.integers(1, 2),
    "threshold": st.floats(0, 1),
    "k": st.integers(1, 3),
})


def decoder_from(s):
    params = dict(slot_size=s["slot_size"], serial_num_blocks=s["serial_num_blocks"])
    if s["selector"] == "threshold":
        params["slot_threshold"] = s["threshold"]
    if s["selector"] in ("topk", "margin", "entropy"):
        params["k"] = s["k"]
    if s["infiller"] == "parallel-ar":
        params["token_threshold"] = s["threshold"]
    return Decoder.from_names(selector=s["selector"], infiller=s["infiller"], reorderer=s["reorderer"], **params)


@given(
    settings=SETTINGS,
    seed=st.integers(0, 5000),
    eos=st.sampled_from([None, 2]),
    prompts=st.lists(st.lists(st.integers(0, 14), min_size=1, max_size=9), min_size=1, max_size=5),
    blocks_of=st.integers(1, 3),
)
def test_batch_equals_single_and_repeat(settings, seed, eos, prompts, blocks_of):
    adapter = tiny(vocab=16, seed=seed, scale=8.0, eos=eos)
    decoder = decoder_from(settings)
    gen_length = settings["slot_size"] * settings["serial_num_blocks"] * blocks_of
    batched = decoder.decode_batch(adapter, prompts, gen_length)
    alone = [decoder.decode(adapter, p, gen_length) for p in prompts]
    repeat = attrs.evolve(decoder, engine="repeat")
    reference = [repeat.decode(adapter, p, gen_length) for p in prompts]
    for b, a, r in zip(batched, alone, reference):
        assert b.tokens.tolist() == a.tokens.tolist() == r.tokens.tolist()
        assert [s.committed for s in b.steps] == [s.committed for s in r.steps]
        assert b.forwards <= r.forwards  # the branch engine folds pending re-encodes into the next call
    assert batched[0].extra["batch_forwards"] == max(r.forwards for r in batched)


def test_sequences_finish_at_different_times():
    adapter = tiny(vocab=16, seed=11, scale=10.0, eos=2)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1, slot_threshold=0.5, token_threshold=0.5)
    prompts = [[1], [3, 4, 5, 6, 7, 8, 9], [5, 5], [7, 1, 3]]
    results = decoder.decode_batch(adapter, prompts, 12)
    assert len({r.forwards for r in results}) > 1, "pick prompts that finish at different times"
    for p, r in zip(prompts, results):
        assert r.tokens.tolist() == decoder.decode(adapter, p, 12).tokens.tolist()


def test_engine_is_validated():
    with pytest.raises(ConfigError, match="`engine` must be one of branch, repeat; got 'fast'"):
        attrs.evolve(Decoder.from_names(), engine="fast")


def test_prompts_must_be_a_list():
    with pytest.raises(ConfigError, match="`prompts` must be a non-empty list"):
        Decoder.from_names().decode_batch(tiny(), [], 8)


def test_output_kv_expires_at_the_next_call():
    adapter = tiny(vocab=16, seed=1)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1)
    session = decoder.session(adapter, [1, 2, 3], 4)
    from refusion.cache.executor import RepeatExecutor

    ex = RepeatExecutor(adapter, session.cache)
    (first,) = ex.run(ModelCall.of(Extend(Branch(), [4], [3])))
    ex.run(ModelCall.of(Extend(Branch(), [5], [4])))
    with pytest.raises(RuntimeError, match="read after a later model call"):
        first.kv


def test_in_place_append_copies_only_new_tokens():
    kv = KVSegment(torch.ones(2, 2, 1, 8, 4))
    buffer = PreallocatedKV(2, 1, 1, 64, 4, dtype=torch.float32, device="cpu")
    row = buffer.row(0)
    row.append(kv)
    first = buffer.copies.new
    for _ in range(5):
        row.append(kv)
    assert buffer.copies.new == 6 * first and buffer.copies.context == 0  # same cost whatever is cached
    row.truncate(10)
    assert len(row) == 10 and buffer.copies.new == 6 * first  # truncation copies nothing

    from transformers import DynamicCache

    store = DynamicStore(DynamicCache())
    costs = []
    for _ in range(4):
        before = store.copies.context + store.copies.new
        store.append(kv)
        costs.append(store.copies.context + store.copies.new - before)
    assert costs == [first, 2 * first, 3 * first, 4 * first]  # concatenation copies the whole cache


def test_buffer_grows_when_needed():
    buffer = PreallocatedKV(1, 1, 1, 4, 2, dtype=torch.float32, device="cpu")
    buffer.row(0).append(KVSegment(torch.arange(24.0).view(1, 2, 1, 6, 2)))
    assert buffer.capacity >= 6 and len(buffer.row(0)) == 6
    assert torch.equal(buffer.data[:, :, 0, :, :6], torch.arange(24.0).view(1, 2, 1, 6, 2))
