"""Engines: one interface, the same tokens and the same counters whichever runs the calls."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refusion.decoding.decoder import Decoder
from refusion.decoding.protocol import Branch, Extend, ModelCall
from refusion.engines import choose_engine, open_engine
from refusion.engines.branch import BranchEngine
from refusion.engines.canvas import CanvasEngine
from refusion.engines.repeat import RepeatEngine
from refusion.errors import ConfigError, UnknownNameError
from tests.support.helpers import tiny

SETTINGS = st.fixed_dictionaries(
    {
        "selector": st.sampled_from(["threshold", "topk", "leftmost", "margin", "entropy"]),
        "infiller": st.sampled_from(["parallel-ar", "greedy-verify"]),
        "reorderer": st.sampled_from(["commit-order", "reencode"]),
        "slot_size": st.integers(1, 4),
        "serial_num_blocks": st.integers(1, 2),
        "threshold": st.floats(0, 1),
        "k": st.integers(1, 3),
    }
)


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
    batched = decoder.decode_batch(adapter, prompts, gen_length, record=True)
    alone = [decoder.decode(adapter, p, gen_length, record=True) for p in prompts]
    repeat = attrs.evolve(decoder, engine="repeat")
    reference = [repeat.decode(adapter, p, gen_length, record=True) for p in prompts]
    for b, a, r in zip(batched, alone, reference):
        assert b.tokens.tolist() == a.tokens.tolist() == r.tokens.tolist()
        assert [s.committed for s in b.iterations] == [s.committed for s in r.iterations]
        assert b.forwards <= r.forwards  # the branch engine folds pending re-encodes into the next call
    assert batched[0].engine_totals["forwards"] == max(r.forwards for r in batched)


def test_sequences_finish_at_different_times():
    adapter = tiny(vocab=16, seed=11, scale=10.0, eos=2)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1, slot_threshold=0.5, token_threshold=0.5)
    prompts = [[1], [3, 4, 5, 6, 7, 8, 9], [5, 5], [7, 1, 3]]
    results = decoder.decode_batch(adapter, prompts, 12, record=True)
    assert len({r.forwards for r in results}) > 1, "pick prompts that finish at different times"
    for p, r in zip(prompts, results):
        assert r.tokens.tolist() == decoder.decode(adapter, p, 12, record=True).tokens.tolist()


def test_engine_is_validated():
    with pytest.raises(
        UnknownNameError,
        match="Unknown engine 'fast'. Known engines: block, block-recompute, branch, canvas, denoiser, repeat",
    ):
        attrs.evolve(Decoder.from_names(), engine="fast")
    with pytest.raises(ConfigError, match="`engine` must be a registered engine name, an Engine subclass"):
        attrs.evolve(Decoder.from_names(), engine=42)


def test_the_best_engine_that_can_run_the_model_is_chosen():
    from refusion.models.mdm import tiny_bidirectional

    causal = tiny()
    assert choose_engine(causal) is BranchEngine
    assert choose_engine(causal, Decoder.from_names(engine="repeat")) is RepeatEngine
    assert choose_engine(tiny_bidirectional(vocab_size=16)) is CanvasEngine
    with pytest.raises(ConfigError, match="`engine` 'canvas' cannot run HFCausalLM: it is for bidirectional models"):
        choose_engine(causal, Decoder.from_names(engine="canvas"))


def test_attention_without_custom_masks_gets_the_repeat_engine_and_a_named_branch_engine_is_refused():
    model = tiny()
    model.model.config._attn_implementation = "flash_attention_2"
    assert choose_engine(model) is RepeatEngine
    with pytest.raises(ConfigError, match="'flash_attention_2' cannot apply custom 4-D masks"):
        Decoder.from_names(engine="branch").decode(model, [1, 2], 16, record=True)


def test_every_engine_reports_the_same_result_keys_and_counts_forwards_alike():
    from refusion.models.mdm import tiny_bidirectional

    causal, bidirectional = tiny(vocab=16, seed=2), tiny_bidirectional(vocab_size=16, seed=2)
    paper = Decoder.from_names(slot_size=2, serial_num_blocks=1)
    mdm = Decoder.from_names(partitioner="semi-ar", selector="topk", infiller="draft", block_length=4)
    results = {
        "branch": paper.decode_batch(causal, [[1, 2], [3]], 8, engine="branch", record=True),
        "repeat": paper.decode_batch(causal, [[1, 2], [3]], 8, engine="repeat", record=True),
        "canvas": mdm.decode_batch(bidirectional, [[1, 2], [3]], 8, record=True),
    }
    assert all(not r.extra for rs in results.values() for r in rs)  # every engine reports in the typed fields
    for name, rs in results.items():
        totals = rs[0].engine_totals
        assert all(r.engine == name for r in rs)
        assert set(totals) == {"forwards", "fed_tokens", "padded_tokens", "kv_bytes"}
        assert sum(r.fed_tokens for r in rs) == totals["fed_tokens"]
        assert sum(r.kv_bytes.new for r in rs) <= totals["kv_bytes"]["new"]
        assert max(r.forwards for r in rs) <= totals["forwards"] <= sum(r.forwards for r in rs)
        assert all(r.forwards == sum(s.forwards for s in r.iterations) for r in rs)
    assert results["branch"][0].engine_totals["forwards"] == max(r.forwards for r in results["branch"])


def test_a_live_engine_can_be_passed_and_reused():
    model = tiny(vocab=16, seed=4)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1)
    engine = open_engine(model, decoder)
    first = decoder.decode_batch(model, [[1, 2]], 8, engine=engine, record=True)
    second = decoder.decode_batch(model, [[1, 2]], 8, engine=engine, record=True)
    assert first[0].tokens.tolist() == second[0].tokens.tolist()
    assert engine.counters.forwards == first[0].forwards + second[0].forwards
    with pytest.raises(ConfigError, match="opened for another model"):
        decoder.decode(tiny(vocab=16, seed=5), [1, 2], 8, engine=engine, record=True)


def test_prompts_must_be_a_list():
    with pytest.raises(ConfigError, match="`prompts` must be a non-empty list"):
        Decoder.from_names().decode_batch(tiny(), [], 8, record=True)


@pytest.mark.parametrize("engine", ["repeat", "branch"])
def test_output_kv_expires_at_the_next_call(engine):
    adapter = tiny(vocab=16, seed=1)
    session = Decoder.from_names(slot_size=2, serial_num_blocks=1).session(adapter, [1, 2, 3], 4, engine=engine)
    run = session.engine.run
    (first,) = run({session.state: ModelCall.of(Extend(Branch(), [4], [3]))})[session.state]
    run({session.state: ModelCall.of(Extend(Branch(), [5], [4]))})
    with pytest.raises(RuntimeError, match="read after a later model call"):
        _ = first.kv


@given(
    settings=SETTINGS,
    seed=st.integers(0, 5000),
    eos=st.sampled_from([None, 2]),
    prompts=st.lists(st.lists(st.integers(0, 14), min_size=1, max_size=6), min_size=1, max_size=3),
)
def test_a_plugin_engine_runs_the_same_decodes(settings, seed, eos, prompts):
    from refusion.plugins.manager import make_plugin_manager
    from refusion.plugins.registry import Registry, reset_registry
    from tests.support.plugins import sample_plugin

    reset_registry(Registry(make_plugin_manager(entry_points=False, extra=(sample_plugin,))))
    adapter = tiny(vocab=16, seed=seed, scale=8.0, eos=eos)
    decoder = decoder_from(settings)
    gen_length = settings["slot_size"] * settings["serial_num_blocks"]
    assert choose_engine(adapter) is BranchEngine  # a plugin of low priority is used only when named
    recomputed = decoder.decode_batch(adapter, prompts, gen_length, engine="recompute", record=True)
    branch = decoder.decode_batch(adapter, prompts, gen_length, record=True)
    assert [r.tokens.tolist() for r in recomputed] == [r.tokens.tolist() for r in branch]
    assert recomputed[0].engine == "recompute"


@given(
    settings=SETTINGS,
    seed=st.integers(0, 5000),
    eos=st.sampled_from([None, 2]),
    prompts=st.lists(st.lists(st.integers(0, 14), min_size=1, max_size=9), min_size=1, max_size=4),
)
def test_packed_and_padded_forwards_give_the_same_decodes(settings, seed, eos, prompts):
    adapter = tiny(vocab=16, seed=seed, scale=8.0, eos=eos)
    decoder = decoder_from(settings)
    gen_length = settings["slot_size"] * settings["serial_num_blocks"] * 2
    packed, padded = BranchEngine(adapter), BranchEngine(adapter, packed=False)
    assert packed.packed and not padded.packed
    a = decoder.decode_batch(adapter, prompts, gen_length, engine=packed, record=True)
    b = decoder.decode_batch(adapter, prompts, gen_length, engine=padded, record=True)
    assert [r.tokens.tolist() for r in a] == [r.tokens.tolist() for r in b]
    assert a[0].engine_totals["padded_tokens"] == 0
    assert packed.kv.pool.used == padded.kv.pool.used == 0  # every sequence gave its pages back


def test_padded_forwards_with_eager_attention_give_the_same_decodes():
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
    decoder = Decoder.from_names(slot_size=2, slot_threshold=0.5, token_threshold=0.5)
    eager = tiny(vocab=16, seed=7, attn_implementation="eager")
    sdpa = tiny(vocab=16, seed=7)
    a = decoder.decode_batch(sdpa, prompts, 8, engine=BranchEngine(sdpa), record=True)
    b = decoder.decode_batch(eager, prompts, 8, engine=BranchEngine(eager, packed=False), record=True)
    assert [r.tokens.tolist() for r in a] == [r.tokens.tolist() for r in b]
