"""The page pool and the prefix cache on their own: references, growth, matching by content, eviction."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.cache.pages import PagePool
from refusion.cache.prefix import PrefixCache


def kv_of(prompt, start, stop):
    """Keys/values that depend on every token up to each entry (as a causal model's do): a wrong page shows."""
    values = [float(hash(tuple(prompt[: i + 1])) % 100_003) for i in range(start, stop)]
    return torch.tensor(values, dtype=torch.float64).view(1, 1, 1, -1, 1).expand(1, 2, 1, -1, 1)


def pool(limit, page_size=2):
    return PagePool(1, 1, 1, limit=limit, page_size=page_size, dtype=torch.float64)


def test_pages_are_counted_by_reference_and_limited():
    p = pool(limit=3)
    a, b, c = p.allocate(), p.allocate(), p.allocate()
    assert len({a, b, c}) == 3 and p.used == 3 and p.allocate() is None
    p.retain(a)
    p.release(a)
    assert p.used == 3  # still held once
    p.release(a)
    assert p.used == 2 and p.allocate() == a
    p.release(b)
    with pytest.raises(ValueError, match="already free"):
        p.release(b)


def test_growing_the_pool_keeps_what_pages_hold():
    p = pool(limit=100)
    held = [p.allocate() for _ in range(8)]
    for i, page in enumerate(held):
        p.write([page], torch.full((1, 2, 1, 2, 1), float(i), dtype=torch.float64))
    assert p.capacity == 8
    extra = p.allocate()  # grows
    assert p.capacity == 16 and extra not in held
    assert [p.read([page], 2)[0, 0, 0, 0, 0].item() for page in held] == [float(i) for i in range(8)]


def test_a_prompt_reuses_the_full_pages_it_shares_and_computes_its_last_token():
    cache = PrefixCache(pool(limit=100))
    first = [1, 2, 3, 4, 5, 6, 7]
    cache.publish(first, lambda a, b: kv_of(first, a, b))
    assert len(cache) == 3  # three full pages of two; the seventh token is no page

    hit = cache.match([1, 2, 3, 4, 9, 9])
    assert hit.tokens == 4
    assert torch.equal(cache.pool.read(list(hit.pages), 4), kv_of(first, 0, 4))
    assert cache.match([1, 2, 3, 4, 5, 6]).tokens == 4  # the last token is always computed
    assert cache.match([1, 2, 3, 4, 5, 6], limit=6).tokens == 6
    assert cache.match([2, 1, 3, 4]).tokens == 0  # a page's position in the prompt is part of its key
    assert (cache.stats.queries, cache.stats.hits) == (6 + 6 + 6 + 4, 4 + 4 + 6 + 0)  # whole prompts looked up


def test_a_full_cache_evicts_the_least_recently_used_and_never_what_others_hold():
    cache = PrefixCache(pool(limit=2))
    a, b = [1, 1, 1, 1, 0], [2, 2, 2, 2, 0]
    cache.publish(a, lambda s, e: kv_of(a, s, e))
    assert cache.match(a).tokens == 4
    cache.publish(b, lambda s, e: kv_of(b, s, e))  # evicts a's pages, the deepest first
    assert cache.match(b).tokens == 4 and cache.match(a).tokens == 0
    held = cache.match(b).pages
    for page in held:  # someone else holds b's pages now: nothing is evictable
        cache.pool.retain(page)
    assert cache.publish(a, lambda s, e: kv_of(a, s, e)) == 0
    assert cache.match(b).tokens == 4


def test_a_publish_that_fails_midway_leaves_the_cache_whole_and_its_pages_free():
    cache = PrefixCache(pool(limit=100))
    first = [1, 2, 3, 4, 5, 6, 7]

    def read_then_fail(a, b):
        if a >= 4:
            raise RuntimeError("the device failed")
        return kv_of(first, a, b)

    with pytest.raises(RuntimeError, match="device failed"):
        cache.publish(first, read_then_fail)
    assert len(cache) == 2 and cache.pool.used == 2  # the pages written before the failure, nothing half-made
    assert cache.match(first).tokens == 4
    cache.publish(first, lambda a, b: kv_of(first, a, b))  # a later publish completes the chain
    assert cache.match(first).tokens == 6 and cache.pool.used == 3


def test_a_pool_that_cannot_grow_answers_none_and_publishing_stops_there(monkeypatch):
    p = pool(limit=100)
    for _ in range(p.capacity):
        p.allocate()

    def out_of_memory(pages):
        raise torch.OutOfMemoryError("no room to grow")

    monkeypatch.setattr(p, "_grow", out_of_memory)
    assert p.allocate() is None
    cache = PrefixCache(p)
    assert cache.publish([1, 2, 3, 4, 5], lambda a, b: kv_of([1, 2, 3, 4, 5], a, b)) == 0
    assert cache.match([1, 2, 3, 4, 5]).tokens == 0


@st.composite
def prompts(draw):
    """Prompts over a tiny alphabet, many sharing starts (branches of one tree)."""
    base = draw(st.lists(st.integers(0, 2), min_size=1, max_size=9))
    cut = draw(st.integers(0, len(base)))
    return base[:cut] + draw(st.lists(st.integers(0, 2), min_size=1, max_size=6))


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), prompts()), min_size=1, max_size=25),
    limit=st.integers(1, 12),
    page_size=st.integers(1, 3),
)
def test_every_hit_holds_exactly_the_prompts_own_keys_and_values(ops, limit, page_size):
    cache = PrefixCache(pool(limit, page_size))
    published: list[list[int]] = []
    for publish, prompt in ops:
        if publish:
            cache.publish(prompt, lambda a, b, p=prompt: kv_of(p, a, b))
            published.append(prompt)
        else:
            hit = cache.match(prompt)
            assert hit.tokens % page_size == 0 and hit.tokens <= max(len(prompt) - 1, 0)
            assert hit.tokens <= max((_shared(prompt, p) for p in published), default=0)
            if hit.tokens:
                assert torch.equal(cache.pool.read(list(hit.pages), hit.tokens), kv_of(prompt, 0, hit.tokens))
        assert cache.pool.used == len(cache) <= limit
    if limit * page_size >= sum(len(p) for p in published):  # nothing was evicted: the longest shared pages hit
        for prompt in published:
            best = max(min(_shared(prompt, p), len(p) // page_size * page_size) for p in published)
            expect = min(best, len(prompt) - 1) // page_size * page_size
            assert cache.match(prompt).tokens == expect


def _shared(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
