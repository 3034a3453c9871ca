"""Compiled forwards (``load_model(compile=...)``): the tokens of eager decoding, with few recompiles.

Most tests compile with dynamo's ``eager`` backend: the graph capture and its
guards (what decides recompiles) without a C++ compiler, fast enough for CI.
The inductor test runs where a C++ compiler exists and
``REFUSION_TEST_INDUCTOR=1`` asks for it; the CUDA-graph test where CUDA
does.
"""

import os
import shutil

import attrs
import pytest
import torch

from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError
from refusion.models.compiled import compile_adapter, compile_stats
from refusion.models.loading import load_model
from tests.support.helpers import tiny

#: the lossless decoder (one verified token at a time: one-token forwards) and the default one (plans, drafts)
DECODERS = {"lossless": {"selector": "leftmost", "infiller": "greedy-verify"}, "default": {}}
PROMPTS = ([1, 2, 3], [4, 5, 6, 7, 8, 9, 1, 2, 3, 5, 7])


def model(**kw):
    return tiny(vocab=32, seed=3, scale=8.0, num_layers=1, **kw)


@pytest.fixture(scope="module")
def eager():
    return model()


def tokens(adapter, engine, decoder, prompts, gen_length=16):
    d = attrs.evolve(Decoder.from_names(**DECODERS[decoder]), engine=engine)
    return [r.tokens.tolist() for r in d.decode_batch(adapter, list(prompts), gen_length)]


@pytest.mark.parametrize("engine", ["branch", "repeat"])
def test_compiled_decoding_gives_eager_tokens_with_few_compiles(eager, engine):
    compiled = load_model(model(), compile={"backend": "eager"})
    assert compile_stats(compiled).calls == 0 and compile_stats(eager) is None
    for decoder in DECODERS:
        assert tokens(compiled, engine, decoder, PROMPTS[:1]) == tokens(eager, engine, decoder, PROMPTS[:1])
    warm = compile_stats(compiled)
    assert warm.graph_breaks == 0
    assert warm.compiling_calls <= 5 < warm.calls // 5, warm  # a graph per Python branch, not per shape
    # other prompt and generation lengths, so other token and key counts at every step: nothing compiles
    for decoder in DECODERS:
        assert tokens(compiled, engine, decoder, PROMPTS[1:], 32) == tokens(eager, engine, decoder, PROMPTS[1:], 32)
    assert compile_stats(compiled).compiling_calls == warm.compiling_calls


def test_packed_batches_and_key_buckets_give_eager_tokens(eager):
    compiled = compile_adapter(model(), backend="eager", buckets=16)
    prompts = [PROMPTS[0], PROMPTS[1], [5, 5]]
    assert tokens(compiled, "branch", "lossless", prompts) == tokens(eager, "branch", "lossless", prompts)
    stats = compile_stats(compiled)
    assert stats.graph_breaks == 0 and stats.compiling_calls <= 4, stats


def test_batch_invariant_forwards_run_eagerly(eager):
    compiled = compile_adapter(model(), backend="eager")
    d = attrs.evolve(Decoder.from_names(**DECODERS["lossless"]), batch_invariant=True)
    want = [r.tokens.tolist() for r in d.decode_batch(eager, list(PROMPTS), 16)]
    assert [r.tokens.tolist() for r in d.decode_batch(compiled, list(PROMPTS), 16)] == want
    assert compile_stats(compiled).calls == 0


@pytest.mark.parametrize(
    "value",
    [
        "fast",
        1,
        0,
        "",
        {"mode": "fast"},
        {"fullgraph": True},
        {"backend": "nope"},
        {"buckets": 0},
        {"dynamic": "yes"},
        {"mode": "default", "backend": "eager"},
    ],
)
def test_bad_compile_values_are_refused_before_loading(value):
    with pytest.raises(ConfigError, match="`compile`") as info:
        load_model("/nonexistent/checkpoint", compile=value)
    assert info.value.param == "compile"


def test_cuda_graph_modes_are_refused_on_the_cpu():
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="`compile` mode 'reduce-overhead' captures CUDA graphs"):
            load_model("/nonexistent/checkpoint", compile="reduce-overhead")
    with pytest.raises(ConfigError, match="`mode` 'reduce-overhead' captures CUDA graphs and needs a model on CUDA"):
        compile_adapter(model(), mode="reduce-overhead")


def test_inductor_without_a_cpp_compiler_is_refused(monkeypatch):
    from refusion.models import compiled

    monkeypatch.setattr(compiled, "_cpp_compiler", lambda: None)
    with pytest.raises(ConfigError, match="no C\\+\\+ compiler was found") as info:
        load_model(model(), compile=True)
    assert info.value.param == "backend"


def test_compile_false_loads_an_eager_model():
    assert compile_stats(load_model(model(), compile=False)) is None


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
@pytest.mark.skipif(not os.environ.get("REFUSION_TEST_INDUCTOR"), reason="set REFUSION_TEST_INDUCTOR=1 (~100 s cold)")
def test_inductor_forward_gives_eager_logits(eager):
    """One graph: a cold inductor compile takes ~100 s on 2 cores, so it runs on request; benchmarks/compiled.py
    compares whole inductor decodes with eager ones."""
    compiled = load_model(model(), compile=True)
    ids, pos, mask = torch.tensor([[1, 2, 3, 4, 5]]), torch.arange(5)[None], torch.ones(1, 5, dtype=torch.long)
    torch.testing.assert_close(compiled.forward(ids, pos, mask, None), eager.forward(ids, pos, mask, None))
    assert compile_stats(compiled).graphs == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
def test_cuda_graphs_give_eager_tokens_with_a_graph_per_bucket():
    eager_cuda = model(dtype=torch.float32, attn_implementation="sdpa")
    eager_cuda.model.to("cuda")
    compiled = model(dtype=torch.float32, attn_implementation="sdpa")
    compiled.model.to("cuda")
    load_model(compiled, compile="reduce-overhead")
    for decoder in DECODERS:
        assert tokens(compiled, "branch", decoder, PROMPTS) == tokens(eager_cuda, "branch", decoder, PROMPTS)
    stats = compile_stats(compiled)
    assert stats.graph_breaks == 0 and stats.compiling_calls <= 8, stats
