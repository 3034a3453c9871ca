"""Requests whose prompts start alike reuse the keys/values of the pages they share, and decode as if alone."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.cache.paged import BlockTable
from refusion.decoding.decoder import Decoder
from refusion.engines.branch import BranchEngine
from refusion.errors import ConfigError
from refusion.generator import Generator
from refusion.models.mdm import tiny_bidirectional
from tests.support.helpers import SESSION_PATHS, draw_paged_setup, tiny


def alone(model, decoder, prompt, gen_length, seed, record):
    """The request decoded by itself on an engine that reuses nothing."""
    generator = Generator(model, decoder, engine="branch", prefix_cache=False)
    return generator.submit(prompt, gen_length=gen_length, seed=seed, record=record).wait()


def shared_pages(a, b, page_size):
    """Tokens of ``b``'s prompt found among ``a``'s full pages (never ``b``'s last token)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return min(n, len(a) // page_size * page_size, len(b) - 1) // page_size * page_size


@pytest.mark.parametrize("name", list(SESSION_PATHS))
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_a_request_reusing_an_earlier_prompts_pages_decodes_as_alone(name, data):
    vocab = 16
    model, decoder, page_size = draw_paged_setup(data, name, vocab)
    tokens = st.integers(0, vocab - 2)
    head = data.draw(st.lists(tokens, min_size=0, max_size=12))
    first = head + data.draw(st.lists(tokens, min_size=1, max_size=4))
    later = [
        head[: data.draw(st.integers(0, len(head)))] + data.draw(st.lists(tokens, min_size=1, max_size=4))
        for _ in range(data.draw(st.integers(1, 2)))
    ]
    record = data.draw(st.booleans())  # iteration records: every session a per-sequence program
    gen_length = 4 * data.draw(st.integers(1, 2))

    engine = BranchEngine(model, prefix_cache=True, page_size=page_size)
    generator = Generator(model, decoder, engine=engine)
    seeds = range(len(later) + 1)
    results = [generator.submit(first, gen_length=gen_length, seed=0, record=record).wait()]
    requests = [generator.submit(p, gen_length=gen_length, seed=s, record=record) for p, s in zip(later, seeds[1:])]
    results += [r.wait() for r in requests]  # admitted together: each reuses what the first published

    for prompt, seed, result in zip([first, *later], seeds, results):
        reference = alone(model, decoder, prompt, gen_length, seed, record)
        hits = 0 if prompt is first else shared_pages(first, prompt, page_size)
        assert result.tokens.tolist() == reference.tokens.tolist()
        assert result.region() == reference.region()
        assert result.forwards == reference.forwards
        assert result.fed_tokens == reference.fed_tokens - hits  # the reused tokens were not computed
    stats = engine.prefixes.stats
    assert stats.hits == sum(shared_pages(first, p, page_size) for p in later)
    assert stats.queries == sum(len(p) for p in [first, *later])


def test_generators_reuse_prefixes_by_default_where_the_engine_can():
    model = tiny(vocab=16)
    decoder = Decoder.from_names(slot_size=2)
    prompt = list(range(12)) * 2
    generator = Generator(model, decoder, gen_length=4)
    assert generator.engine.prefix_cache
    generator.submit(prompt).wait()
    generator.submit(prompt[:-1] + [3]).wait()
    assert generator.engine.prefixes.stats.hits == 16

    assert not Generator(model, decoder, prefix_cache=False).engine.prefix_cache
    invariant = Decoder.from_names(slot_size=2, batch_invariant=True)
    assert not Generator(model, invariant).engine.prefix_cache  # a reused prefix was computed in another shape


def live_engine_without_reuse():
    model = tiny(vocab=16)
    return Generator(model, engine=BranchEngine(model), prefix_cache=True)


def test_an_admission_whose_reuse_fails_gives_its_pages_back(monkeypatch):
    model = tiny(vocab=16)
    engine = BranchEngine(model, prefix_cache=True, page_size=2)
    generator = Generator(model, Decoder.from_names(slot_size=2), engine=engine, gen_length=4)
    generator.submit([1, 2, 3, 4, 5]).wait()

    reuse = engine.kvm.reuse_prefix

    def fail(owner, table, prompt):
        reuse(owner, table, prompt)  # the pages are shared, then something fails
        raise RuntimeError("the copy failed")

    monkeypatch.setattr(engine.kvm, "reuse_prefix", fail)
    with pytest.raises(RuntimeError, match="copy failed"):
        engine.admit(torch.tensor([1, 2, 3, 4, 6]), 4)
    assert not engine.reserved and engine.kv.pool.used == len(engine.prefixes)  # only the cache's pages are held


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: Generator(tiny_bidirectional(vocab_size=16), prefix_cache=True), "engine 'canvas' does not"),
        (
            lambda: Generator(tiny(vocab=16), Decoder.from_names(batch_invariant=True), prefix_cache=True),
            "cannot under batch_invariant",
        ),
        (lambda: Generator(tiny(vocab=16), prefix_cache="yes"), "prefix_cache"),
        (lambda: BranchEngine(tiny(vocab=16), prefix_cache=True, page_size=0), "page_size"),
        (lambda: Generator("/no/such/checkpoint", prefix_cache="yes"), "prefix_cache"),  # before the model loads
        (lambda: live_engine_without_reuse(), "needs an engine opened with it"),
    ],
)
def test_asking_for_prefix_reuse_where_it_cannot_run_names_the_option(build, words):
    with pytest.raises(ConfigError, match=words) as info:
        build()
    assert info.value.param in ("prefix_cache", "page_size")


def test_the_reused_pages_hold_the_models_own_keys_and_values_of_the_prefix():
    """Against transformers' own cache of the shared prefix, not only against the tokens that follow."""
    from transformers import DynamicCache

    model = tiny(vocab=16, seed=3)
    engine = BranchEngine(model, prefix_cache=True, page_size=4)
    generator = Generator(model, Decoder.from_names(slot_size=2), engine=engine, gen_length=4)
    shared = [5, 1, 7, 3, 9, 2, 4, 8, 6, 0, 11]
    generator.submit(shared + [12], seed=0).wait()
    hit = engine.prefixes.match(shared + [13, 14])
    assert hit.tokens == 8
    reused = engine.kv.entries(BlockTable(list(hit.pages)), 0, hit.tokens)  # (layers, 2, heads, n, dim)

    cache = DynamicCache(config=model.model.config)
    with torch.no_grad():
        model.model(torch.tensor([shared[:8]]), cache=cache, use_cache=True)
    expected = torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])
    torch.testing.assert_close(reused, expected, rtol=1e-5, atol=1e-6)


def test_requests_arriving_together_compute_their_shared_prefix_once():
    """The first encodes the shared pages; the others wait one step for them (never longer than HOLD_FOR_PREFIX)."""
    model = tiny(vocab=16, seed=5)
    decoder = Decoder.from_names(slot_size=2)
    shared = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]  # three full pages of 4
    prompts = [shared + [i, 7] for i in range(4)]
    engine = BranchEngine(model, prefix_cache=True, page_size=4)
    generator = Generator(model, decoder, engine=engine, gen_length=4)
    requests = [generator.submit(p) for p in prompts]
    results = [r.wait() for r in requests]
    assert engine.prefixes.stats.hits == 3 * 12
    for prompt, result in zip(prompts, results):
        reference = alone(model, decoder, prompt, 4, None, False)
        assert result.tokens.tolist() == reference.tokens.tolist()
    assert [r.ticket.held for r in requests] == [0, 1, 0, 0]  # only the head of the queue waited, once


def test_a_request_waits_for_shared_pages_a_bounded_number_of_steps(monkeypatch):
    from refusion.generator import HOLD_FOR_PREFIX

    model = tiny(vocab=16, seed=5)
    engine = BranchEngine(model, prefix_cache=True, page_size=4)
    generator = Generator(model, Decoder.from_names(slot_size=2), engine=engine, gen_length=8)
    monkeypatch.setattr(engine, "awaited_prefix", lambda prompt: 4)  # pages always "about to be published"
    first = generator.submit(list(range(9)))
    later = generator.submit(list(range(9)))
    generator.step()
    assert first.status == "running" and later.status == "waiting"
    for _ in range(HOLD_FOR_PREFIX):
        generator.step()
    assert later.status in ("running", "finished") and later.ticket.held == HOLD_FOR_PREFIX
    assert later.wait().tokens.tolist() == first.wait().tokens.tolist()
