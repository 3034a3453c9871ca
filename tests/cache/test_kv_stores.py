"""Key/value stores: in-place appends copy only new entries, truncation copies nothing, a finished sequence gives
its pages back and keeps its length."""

import pytest
import torch

from refusion.cache.paged import PagedKV, PagedStore
from refusion.cache.pages import PagePool
from refusion.cache.stores import DynamicStore
from refusion.decoding.protocol import KVSegment


def paged(limit=64, page_size=4) -> PagedKV:
    return PagedKV(PagePool(2, 1, 4, limit=limit, page_size=page_size))


def test_in_place_append_copies_only_new_tokens():
    kv = KVSegment(torch.ones(2, 2, 1, 8, 4))
    pages = paged()
    row = PagedStore(pages)
    row.append(kv)
    first = pages.counters.kv_new_bytes
    for _ in range(5):
        row.append(kv)
    assert pages.counters.kv_new_bytes == 6 * first
    assert pages.counters.kv_context_bytes == pages.pool.growth_bytes  # only the pool's growth copied entries
    row.truncate(10)
    assert len(row) == 10 and pages.counters.kv_new_bytes == 6 * first  # truncation copies nothing

    from transformers import DynamicCache

    store = DynamicStore(DynamicCache())
    costs = []
    for _ in range(4):
        before = store.counters.kv_context_bytes + store.counters.kv_new_bytes
        store.append(kv)
        costs.append(store.counters.kv_context_bytes + store.counters.kv_new_bytes - before)
    assert costs == [first, 2 * first, 3 * first, 4 * first]  # concatenation copies the whole cache


def test_growing_keeps_every_sequences_entries_in_place():
    pages = paged(limit=1000, page_size=2)
    rows = [PagedStore(pages) for _ in range(3)]
    data = [torch.randn(2, 2, 1, 5 + i, 4) for i in range(3)]
    for row, kv in zip(rows, data):
        row.append(KVSegment(kv))
    for _ in range(4):  # the pool grows past its first 8 pages: entries are kept
        rows[0].append(KVSegment(torch.zeros(2, 2, 1, 6, 4)))
    assert pages.pool.capacity > 8
    for row, kv in zip(rows[1:], data[1:]):
        assert torch.equal(pages.entries(row.table, 0, len(row)), kv)
    assert torch.equal(pages.entries(rows[0].table, 0, 5), data[0])


def test_a_finished_sequence_gives_its_pages_back_and_keeps_its_length():
    pages = paged()
    first, second = PagedStore(pages), PagedStore(pages)
    first.append(KVSegment(torch.ones(2, 2, 1, 3, 4)))
    second.append(KVSegment(torch.full((2, 2, 1, 5, 4), 2.0)))
    held = pages.pool.used
    first.detach()
    assert pages.pool.used == held - 1 and len(first) == 3
    third = PagedStore(pages)
    third.append(KVSegment(torch.zeros(2, 2, 1, 4, 4)))  # reuses the page given back: nothing else moved
    assert bool((pages.entries(second.table, 0, 5) == 2).all()) and pages.counters.kv_context_bytes == 0
    with pytest.raises(RuntimeError, match="given back"):
        first.append(KVSegment(torch.ones(2, 2, 1, 1, 4)))
