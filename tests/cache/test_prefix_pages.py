"""The page pool, block tables and the prefix cache on their own: references, growth, matching by content,
eviction, copy on write."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.cache.paged import BlockTable, PagedKV
from refusion.cache.pages import PagePool
from refusion.cache.prefix import PrefixCache


def kv_of(prompt, start, stop):
    """Keys/values that depend on every token up to each entry (as a causal model's do): a wrong page shows."""
    values = [float(hash(tuple(prompt[: i + 1])) % 100_003) for i in range(start, stop)]
    return torch.tensor(values, dtype=torch.float64).view(1, 1, 1, -1, 1).expand(1, 2, 1, -1, 1)


def read(pool, pages, n):
    """The first ``n`` entries of ``pages`` in order, ``(layers, 2, heads, n, dim)``."""
    return PagedKV(pool).entries(BlockTable(list(pages)), 0, n)


def pool(limit, page_size=2):
    return PagePool(1, 1, 1, limit=limit, page_size=page_size, dtype=torch.float64)


def encode(kv: PagedKV, prompt) -> int:
    """What a sequence does with ``prompt``: write its entries to pages of its own, publish the full pages to the
    prefix cache, then leave (giving its references back). Returns the pages the cache added."""
    table = BlockTable()
    kv.write(table, 0, kv_of(prompt, 0, len(prompt)))
    table.length = len(prompt)
    added = kv.prefixes.publish(prompt, table.pages[: len(prompt) // kv.page_size])
    kv.free(table)
    return added


def paged(limit, page_size=2):
    p = pool(limit, page_size)
    cache = PrefixCache(p)
    return PagedKV(p, cache), cache


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
    extra = p.allocate(beyond_limit=True)
    assert extra is not None and p.used == 3 and p.allocate(beyond_limit=True) is not None and p.over_limit == 1


def test_growing_the_pool_keeps_what_pages_hold():
    p = pool(limit=100)
    held = [p.allocate() for _ in range(8)]
    for i, page in enumerate(held):
        PagedKV(p).write(BlockTable([page]), 0, torch.full((1, 2, 1, 2, 1), float(i), dtype=torch.float64))
    assert p.capacity == 8
    extra = p.allocate()  # grows
    assert p.capacity == 16 and extra not in held
    assert [read(p, [page], 2)[0, 0, 0, 0, 0].item() for page in held] == [float(i) for i in range(8)]


def test_a_block_table_takes_pages_as_it_grows_and_gives_back_what_it_no_longer_uses():
    kv = PagedKV(pool(limit=100, page_size=4))
    table = BlockTable()
    kv.write(table, 0, kv_of([1, 2, 3, 4, 5, 6], 0, 6))
    table.length = 6
    assert len(table.pages) == 2 and kv.pool.used == 2
    assert torch.equal(kv.entries(table, 1, 6), kv_of([1, 2, 3, 4, 5, 6], 1, 6))
    kv.ensure(table, 13)  # scratch for a forward: columns 6..12
    assert len(table.pages) == 4
    table.length = 3  # an invalidation: a length change
    kv.trim(table)
    assert len(table.pages) == 1 and kv.pool.used == 1
    assert kv.slot_index([table], 3).tolist() == [[table.pages[0] * 4 + i for i in range(3)]]
    kv.free(table)
    assert kv.pool.used == 0 and table.length == 3


def test_a_prompt_reuses_the_full_pages_it_shares_and_computes_its_last_token():
    kv, cache = paged(limit=100)
    first = [1, 2, 3, 4, 5, 6, 7]
    assert encode(kv, first) == 3  # three full pages of two; the seventh token is no page
    assert len(cache) == 3 and kv.pool.used == 3  # the sequence left: only the cache holds them

    hit = cache.match([1, 2, 3, 4, 9, 9])
    assert hit.tokens == 4
    assert torch.equal(read(cache.pool, hit.pages, 4), kv_of(first, 0, 4))
    assert cache.match([1, 2, 3, 4, 5, 6]).tokens == 4  # the last token is always computed
    assert cache.match([1, 2, 3, 4, 5, 6], limit=6).tokens == 6
    assert cache.match([2, 1, 3, 4]).tokens == 0  # a page's position in the prompt is part of its key
    assert (cache.stats.queries, cache.stats.hits) == (6 + 6 + 6 + 4, 4 + 4 + 6 + 0)  # whole prompts looked up


def test_a_shared_page_is_copied_before_it_is_written():
    kv, cache = paged(limit=100)
    prompt = [1, 2, 3, 4, 5]
    encode(kv, prompt)
    hit = cache.match(prompt)
    table = BlockTable()
    kv.share(table, hit.pages)  # a new sequence starts with the cached pages: no copy
    assert table.pages == list(hit.pages) and table.length == 4 and kv.pool.used == 2
    kv.write(table, 4, kv_of([1, 2, 3, 4, 8], 4, 5))  # past the shared pages: no copy
    assert table.pages[:2] == list(hit.pages)
    table.length = 3  # a reorderer invalidates into the prompt, then writes there
    kv.write(table, 3, kv_of([1, 2, 3, 7], 3, 4))
    assert table.pages[0] == hit.pages[0] and table.pages[1] not in hit.pages  # only the page written was copied
    assert torch.equal(kv.entries(table, 0, 4), kv_of([1, 2, 3, 7], 0, 4))
    assert torch.equal(read(cache.pool, hit.pages, 4), kv_of(prompt, 0, 4))  # the cache's pages unchanged


def test_a_full_pool_evicts_the_least_recently_used_and_never_what_others_hold():
    kv, cache = paged(limit=2)
    a, b = [1, 1, 1, 1, 0], [2, 2, 2, 2, 0]
    encode(kv, a)
    assert cache.match(a).tokens == 4
    encode(kv, b)  # its pages evict a's, the deepest first
    assert cache.match(b).tokens == 4 and cache.match(a).tokens == 0
    held = cache.match(b).pages
    for page in held:  # someone else holds b's pages now: nothing is evictable
        cache.pool.retain(page)
    encode(kv, a)  # a running sequence still gets its pages, past the limit, and the cache lets them go after
    assert cache.match(a).tokens == 0 and cache.match(b).tokens == 4 and kv.pool.used == 2


def full_pool_that_cannot_grow(monkeypatch):
    """A pool of limit 100 whose first 8 pages are all held and whose growth runs out of device memory."""
    p = pool(limit=100)
    for _ in range(p.capacity):
        p.allocate()

    def out_of_memory(pages):
        raise torch.OutOfMemoryError("no room to grow")

    monkeypatch.setattr(p, "_grow", out_of_memory)
    return p


def test_a_pool_that_cannot_grow_answers_none_and_a_sequence_gets_a_clear_error(monkeypatch):
    p = full_pool_that_cannot_grow(monkeypatch)
    assert p.allocate() is None and p.allocate(beyond_limit=True) is None
    with pytest.raises(torch.OutOfMemoryError, match="no memory left for another page"):
        PagedKV(p).ensure(BlockTable(), 1)


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
    kv, cache = paged(limit, page_size)
    published: list[list[int]] = []
    for publish, prompt in ops:
        if publish:
            encode(kv, prompt)
            published.append(prompt)
        else:
            hit = cache.match(prompt)
            assert hit.tokens % page_size == 0 and hit.tokens <= max(len(prompt) - 1, 0)
            assert hit.tokens <= max((_shared(prompt, p) for p in published), default=0)
            if hit.tokens:
                assert torch.equal(read(cache.pool, hit.pages, hit.tokens), kv_of(prompt, 0, hit.tokens))
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


def test_past_the_limit_free_pages_are_not_handed_out_and_a_failed_growth_shrinks_the_limit(monkeypatch):
    p = pool(limit=2)
    held = [p.allocate(), p.allocate(), p.allocate(beyond_limit=True)]  # a running sequence went past the limit
    p.release(held.pop())
    assert p.allocate() is None  # a free page above the limit is not handed out without asking for it
    assert p.allocate(beyond_limit=True) is not None

    q = full_pool_that_cannot_grow(monkeypatch)
    assert q.allocate() is None and q.limit == q.capacity == 8  # the budget is what the device holds


def test_a_full_pool_evicts_the_caches_pages_before_growing_past_its_limit():
    kv, cache = paged(limit=2)
    encode(kv, [1, 1, 1, 1, 0])  # the cache holds both pages of the budget
    table = BlockTable()
    kv.ensure(table, 4)  # a live sequence needs two pages: the cache's go first, nothing past the limit
    assert kv.pool.over_limit == 0 and len(cache) == 0 and kv.pool.used == 2
