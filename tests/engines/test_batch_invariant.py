"""Batch-invariant decoding: with ``batch_invariant=True`` a prompt decodes exactly as alone, in any batch and dtype.

Exactly: the tokens, and every number the engine computes for the prompt
(its forward outputs and its LM-head statistics), bit for bit, in bf16 and
fp16 too, for every engine that can run the model.
"""

import random

import attrs
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion import probe as rows
from refusion.config import PRESETS, DecoderSpec
from refusion.decoding.decoder import Decoder
from refusion.engines import invariant, open_engine
from refusion.engines.branch import BranchEngine
from refusion.engines.invariant import InvariantHead, rows_depend_on_count, tiled_linear
from refusion.errors import ConfigError
from refusion.models.block import tiny_block_diffusion
from refusion.models.hf import HFCausalLM
from refusion.models.mdm import tiny_bidirectional
from refusion.models.tiny import tiny_qwen3
from refusion.probe import probe_rows

ENGINES = ("branch", "branch-padded", "repeat", "canvas", "block", "block-recompute")


def recording(engine):
    """The engine, noting per admitted sequence each answered extend's forward output and its Scores."""
    engine.seen = {}
    admit, run = engine.admit, engine.run

    def admitted(prompt, region_length):
        state = admit(prompt, region_length)
        engine.seen[state] = []
        return state

    def ran(calls):
        outputs = run(calls)
        for state, outs in outputs.items():
            for out in outs:
                scores = out.scores
                engine.seen[state].append((scores.hidden if scores.hidden is not None else scores.logits).clone())
                engine.seen[state].append(scores)  # its LM-head statistics are filled in later
        return outputs

    engine.admit, engine.run = admitted, ran
    return engine


def numbers(seen: list) -> list:
    """The forward outputs and the known LM-head statistics of one sequence, in call order."""
    out = []
    for item in seen:
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif item._cache is not None:
            cache = item._cache
            out += [cache.known, cache.tokens[cache.known], cache.best[cache.known], cache.lse[cache.known]]
    return out


def identical(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b)
    )


@st.composite
def setups(draw, engine: str, dtype: torch.dtype):
    """(model, decoder, gen_length, engine options) for ``engine``: a tiny model of ``dtype`` and a drawn decoder."""
    kw = {
        "vocab_size": 16,
        "hidden_size": 32,
        "seed": draw(st.integers(0, 1000)),
        "eos_token_id": draw(st.sampled_from([None, 2])),
        "dtype": dtype,
    }
    if engine in ("branch", "branch-padded", "repeat"):
        model = HFCausalLM(tiny_qwen3(logit_scale=8.0, **kw))
        slot, blocks = draw(st.sampled_from([2, 1, 3])), draw(st.sampled_from([2, 1]))
        selector = draw(st.sampled_from(["threshold", "topk", "leftmost"]))
        infiller = draw(st.sampled_from(["parallel-ar", "greedy-verify"]))
        params = {"slot_size": slot, "serial_num_blocks": blocks}
        threshold = draw(st.floats(0.05, 0.95))
        if selector == "threshold":
            params["slot_threshold"] = threshold
        if selector == "topk":
            params["k"] = draw(st.integers(1, 2))
        if infiller == "parallel-ar":
            params["token_threshold"] = threshold
        decoder = Decoder.from_names(
            selector=selector,
            infiller=infiller,
            reorderer=draw(st.sampled_from(["commit-order", "reencode"])),
            **params,
        )
        gen_length = slot * blocks * draw(st.sampled_from([2, 1]))
    elif engine == "canvas":
        block = draw(st.sampled_from([3, 2, 4]))
        model = tiny_bidirectional(logit_scale=4.0, logit_shift=draw(st.sampled_from([0, 1])), **kw)
        decoder = Decoder.from_names(
            partitioner="semi-ar",
            selector="topk",
            infiller="draft",
            block_length=block,
            k=draw(st.integers(1, 2)),
            reorderer=draw(st.sampled_from(["commit-order", "prefix-cache", "dual-cache"])),
        )
        gen_length = block * draw(st.sampled_from([2, 1]))
    else:
        block = draw(st.sampled_from([3, 2, 4]))
        model = tiny_block_diffusion(block_length=block, logit_scale=4.0, **kw)
        decoder = Decoder.from_names(
            partitioner="semi-ar",
            selector="threshold",
            infiller="draft",
            block_length=block,
            slot_threshold=draw(st.floats(0.05, 0.95)),
        )
        gen_length = block * draw(st.sampled_from([2, 1]))
    name = "branch" if engine == "branch-padded" else engine
    options = {"packed": False} if engine == "branch-padded" else {}
    return model, attrs.evolve(decoder, engine=name, batch_invariant=True), gen_length, options


@st.composite
def batches(draw, sizes=(32, 2, 17, 7, 24)):
    """A batch of one of ``sizes`` prompts (the largest first) drawn from a pool of up to 5, each decoded alone once:
    random lengths (1 to 10 tokens) and random neighbours."""
    size = draw(st.sampled_from(sizes))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    pool = [[rng.randrange(14) for _ in range(rng.randint(1, 10))] for _ in range(rng.randint(1, 5))]
    return [rng.choice(pool) for _ in range(size)]


def check_batch_equals_alone(model, decoder, gen_length, options, prompts):
    batched_engine = recording(open_engine(model, decoder, **options))
    assert batched_engine.batch_invariant
    batched = decoder.decode_batch(model, prompts, gen_length, engine=batched_engine)
    seen = list(batched_engine.seen.values())
    alone: dict[tuple, tuple] = {}
    for i, prompt in enumerate(prompts):
        if tuple(prompt) not in alone:
            engine = recording(open_engine(model, decoder, **options))
            result = decoder.decode(model, prompt, gen_length, engine=engine)
            alone[tuple(prompt)] = (result.tokens.tolist(), numbers(next(iter(engine.seen.values()))))
        tokens, expected = alone[tuple(prompt)]
        assert batched[i].tokens.tolist() == tokens, f"prompt {i} of {len(prompts)}"
        assert identical(numbers(seen[i]), expected), f"prompt {i} of {len(prompts)}: its numbers depend on the batch"


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=4)
@given(data=st.data())
def test_bf16_tokens_and_numbers_are_the_same_alone_and_in_any_batch(engine, data):
    model, decoder, gen_length, options = data.draw(setups(engine, torch.bfloat16))
    check_batch_equals_alone(model, decoder, gen_length, options, data.draw(batches()))


@pytest.mark.parametrize(
    "engine,dtype", [("branch", torch.float16), ("repeat", torch.float16), ("branch", torch.float32)]
)
@settings(max_examples=2)
@given(data=st.data())
def test_fp16_and_fp32_too(engine, dtype, data):
    model, decoder, gen_length, options = data.draw(setups(engine, dtype))
    check_batch_equals_alone(model, decoder, gen_length, options, data.draw(batches(sizes=(12, 3, 8))))


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_the_peer_families_checkpoints_in_bf16(family):
    """LLaDA (Llama), Dream (Qwen2, logit shift 1) and SDAR (block diffusion from position 0), with their presets."""
    from pathlib import Path

    from refusion.api import build_decoder, load_model

    model = load_model(str(Path(__file__).resolve().parents[1] / "fixtures" / "peers" / family), dtype=torch.bfloat16)
    decoder = attrs.evolve(build_decoder(model, preset=family)[0], batch_invariant=True)
    rng = random.Random(family)
    pool = [[rng.randrange(10, 100) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    prompts = [rng.choice(pool) for _ in range(9)]
    check_batch_equals_alone(model, decoder, 8, {}, prompts)


def test_the_default_can_differ_in_bf16_where_batch_invariant_does_not():
    """A hand-found case: the short prompt attends over the long one's key range, padded, and flips a close call."""
    model = HFCausalLM(tiny_qwen3(vocab_size=32, hidden_size=64, seed=2168, logit_scale=4.0, dtype=torch.bfloat16))
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1, slot_threshold=0.5, token_threshold=0.5)
    prompts = [[9, 12, 23, 13, 26, 20, 2, 0, 19, 6, 22, 10], [7, 7, 20]]
    invariant = attrs.evolve(decoder, batch_invariant=True)
    alone = [invariant.decode(model, p, 8).tokens.tolist() for p in prompts]
    assert [r.tokens.tolist() for r in invariant.decode_batch(model, prompts, 8)] == alone
    default = [r.tokens.tolist() for r in decoder.decode_batch(model, prompts, 8)]
    if default == [decoder.decode(model, p, 8).tokens.tolist() for p in prompts]:
        pytest.skip("this machine's kernels happen to agree on the hand-found example")
    assert default[1] != alone[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_probe_says_whether_this_machine_s_linear_rows_depend_on_the_row_count(dtype):
    """Measured, not assumed, on other random inputs than the probe's (was: "CPU half precision never depends on the
    row count", false on an AMX Xeon, where fp16 ``F.linear`` on 1 row differs from 70 rows for most inputs and bf16
    rows of 1024 inputs differ below 64 rows)."""
    generator = torch.Generator().manual_seed(5)
    differs, stable_from = set(), []
    for d, out in ((64, 128), (256, 768), (1024, 1024)):
        weight = torch.randn(out, d, generator=generator).to(dtype)
        for _ in range(2):
            x = torch.randn(70, d, generator=generator).to(dtype)
            full = F.linear(x, weight)
            differs |= {n for n in (1, 2, 3, 4, 5, 8, 17, 33) if not torch.equal(F.linear(x[:n], weight), full[:n])}
            stable_from.append((x, weight, full))
    found = probe_rows("cpu", dtype)
    assert found.depends == bool(differs) == rows_depend_on_count("cpu", dtype)
    if found.min_rows is not None:
        for x, weight, full in stable_from:
            assert all(torch.equal(F.linear(x[:n], weight), full[:n]) for n in (4, 8, 33) if n >= found.min_rows)
    assert probe_rows("cpu", dtype) is found  # once per process


@pytest.fixture
def rows_depend_in_bf16(monkeypatch):
    """Force the probe's answer for CPU bf16, as a CPU whose bf16 GEMMs pick kernels by row count would give it."""
    monkeypatch.setitem(rows._PROBED, rows.probe_key("cpu", torch.bfloat16), rows.RowClasses(True, 4))


@pytest.mark.parametrize("engine", ["branch", "repeat"])
def test_where_the_probe_says_rows_depend_the_engine_tiles_and_a_batch_still_decodes_as_alone(
    engine, rows_depend_in_bf16
):
    model = HFCausalLM(tiny_qwen3(vocab_size=40, hidden_size=32, seed=3, logit_scale=4.0, dtype=torch.bfloat16))
    assert invariant.Invariance.for_model(model).tile == invariant.ROW_TILE
    decoder = attrs.evolve(Decoder.from_names(slot_size=2, serial_num_blocks=2), batch_invariant=True)
    check_batch_equals_alone(
        model,
        decoder,
        8,
        {"engine": engine} if engine != "branch" else {},
        [[5, 6, 7, 8, 9, 10, 11], [12, 13], [5, 6, 7, 8, 9, 10, 11]],
    )


def test_row_tiles_and_the_invariant_head_give_a_row_the_same_numbers_whatever_the_row_count():
    from refusion.models.head import LMHead

    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(40000, 24, generator=generator)  # more than one vocabulary chunk
    hidden = torch.randn(21, 24, generator=generator)
    head = InvariantHead(LMHead(weight), tile=8, chunk=16384)
    full = [
        tiled_linear(hidden, weight, None, 8),
        *head.stats(hidden, exclude=3),
        head.logits(hidden),
        head.token_logits(hidden, torch.arange(21)),
    ]
    for count in (1, 2, 3, 9, 20):
        part = [
            tiled_linear(hidden[:count], weight, None, 8),
            *head.stats(hidden[:count], exclude=3),
            head.logits(hidden[:count]),
            head.token_logits(hidden[:count], torch.arange(count)),
        ]
        assert all(torch.equal(a, b[:count]) for a, b in zip(part, full)), count
    assert torch.equal(full[0], full[4])  # tiled logits are the tiled linear's
    assert int(full[1].eq(3).sum()) == 0


def test_the_option_round_trips_through_specs_presets_and_files(tmp_path):
    decoder = Decoder.from_names(slot_size=2, batch_invariant=True)
    assert decoder.batch_invariant and decoder.spec.batch_invariant
    data = decoder.spec.to_dict()
    assert data["batch_invariant"] is True
    assert Decoder.from_spec(DecoderSpec.from_dict(data)) == decoder
    spec = PRESETS["paper"].merged(params={"batch_invariant": True})
    path = tmp_path / "preset.json"
    spec.save(path)
    loaded = DecoderSpec.load(path)
    assert loaded == spec and Decoder.from_spec(loaded).batch_invariant
    assert not Decoder.from_spec(PRESETS["paper"]).batch_invariant  # off by default
    assert open_engine(HFCausalLM(tiny_qwen3()), Decoder.from_spec(loaded)).batch_invariant


def test_a_value_that_is_not_a_bool_is_refused_naming_the_option():
    with pytest.raises(ConfigError, match=r"`batch_invariant` must be True or False; got 1\.") as caught:
        Decoder.from_names(batch_invariant=1)
    assert caught.value.param == "batch_invariant"
    data = {**Decoder.from_names().spec.to_dict(), "batch_invariant": "yes"}
    with pytest.raises(ConfigError, match=r"field `batch_invariant` has the wrong type: 'yes'"):
        DecoderSpec.from_dict(data)
    with pytest.raises(ConfigError, match=r"`batch_invariant` must be True or False; got 'yes'"):
        BranchEngine(HFCausalLM(tiny_qwen3()), batch_invariant="yes")


def test_a_live_engine_opened_without_it_is_refused():
    model = HFCausalLM(tiny_qwen3())
    decoder = Decoder.from_names(slot_size=2, batch_invariant=True)
    with pytest.raises(ConfigError, match=r"asks for `batch_invariant`=True but engine 'branch' was opened without"):
        decoder.decode(model, [1, 2], 4, engine=BranchEngine(model))
    assert decoder.decode(model, [1, 2], 4, engine=BranchEngine(model, batch_invariant=True)).tokens.numel() == 4


def test_requests_joining_a_running_generator_decode_as_alone_and_a_plain_generator_refuses_them():
    from refusion.generator import Generator

    model = HFCausalLM(tiny_qwen3(vocab_size=32, hidden_size=64, seed=2168, logit_scale=4.0, dtype=torch.bfloat16))
    decoder = Decoder.from_names(
        slot_size=2, serial_num_blocks=1, slot_threshold=0.5, token_threshold=0.5, batch_invariant=True
    )
    prompts = [[9, 12, 23, 13, 26, 20, 2, 0, 19, 6, 22, 10], [7, 7, 20], [5], [1, 2, 3, 4, 5, 6], [7, 7, 20]]
    generator = Generator(model, decoder, max_rows=3, gen_length=8)
    requests, step = [], 0
    while len(requests) < len(prompts) or not generator.idle():
        if len(requests) < len(prompts):  # one more request joins at every step
            requests.append(generator.submit(prompts[len(requests)]))
        generator.step()
        step += 1
    for request, prompt in zip(requests, prompts):
        assert request.result.tokens.tolist() == decoder.decode(model, prompt, 8).tokens.tolist()
    plain = Generator(model, attrs.evolve(decoder, batch_invariant=False), gen_length=8)
    with pytest.raises(ConfigError, match=r"asks for `batch_invariant`=True but engine 'branch' was opened without"):
        plain.submit([1, 2], decoder=decoder)


def test_on_gpus_means_over_the_last_dimension_are_tiled_too(monkeypatch):
    """CUDA's reduction kernels give a row more or fewer threads as the row count changes (another order of the
    sums), so a batch-invariant forward on a GPU takes the RMS norms' means in fixed row tiles as well."""
    import types

    from refusion.engines import invariant
    from refusion.engines.invariant import Invariance, RowTiles, tiled_mean

    gpu = types.SimpleNamespace(model=torch.nn.Linear(2, 2).to(torch.bfloat16), device=torch.device("cuda"))
    assert Invariance.for_model(gpu).reductions and Invariance.for_model(gpu).tile == 8
    assert not Invariance.for_model(HFCausalLM(tiny_qwen3(dtype=torch.float32))).reductions
    x = torch.randn(21, 3, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    full = tiled_mean(x, True, 8)
    torch.testing.assert_close(full, x.mean(-1, keepdim=True), rtol=1e-12, atol=1e-12)
    for count in (1, 2, 7, 9):
        assert torch.equal(tiled_mean(x[:count], True, 8), full[:count])
    calls = []
    monkeypatch.setattr(invariant, "tiled_mean", lambda *a: calls.append(a[0].shape) or tiled_mean(*a))
    model = tiny_qwen3(dtype=torch.float64)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with RowTiles(8, reductions=True):
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    assert calls  # the RMS norms went through the tiles
    with torch.no_grad(), RowTiles(8):
        calls.clear()
        model(input_ids=ids)
    assert not calls  # not where reductions are left alone
