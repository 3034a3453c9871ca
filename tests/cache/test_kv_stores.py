"""Key/value stores: in-place appends copy only new entries, buffers grow and rows are reused."""

import pytest
import torch

from refusion.cache.stores import DynamicStore, PreallocatedKV
from refusion.decoding.protocol import KVSegment


def test_in_place_append_copies_only_new_tokens():
    kv = KVSegment(torch.ones(2, 2, 1, 8, 4))
    buffer = PreallocatedKV(2, 1, 1, 64, 4, dtype=torch.float32, device="cpu")
    row = buffer.row(buffer.allocate(64))
    row.append(kv)
    first = buffer.counters.kv_new_bytes
    for _ in range(5):
        row.append(kv)
    assert buffer.counters.kv_new_bytes == 6 * first and buffer.counters.kv_context_bytes == 0
    row.truncate(10)
    assert len(row) == 10 and buffer.counters.kv_new_bytes == 6 * first  # truncation copies nothing

    from transformers import DynamicCache

    store = DynamicStore(DynamicCache())
    costs = []
    for _ in range(4):
        before = store.counters.kv_context_bytes + store.counters.kv_new_bytes
        store.append(kv)
        costs.append(store.counters.kv_context_bytes + store.counters.kv_new_bytes - before)
    assert costs == [first, 2 * first, 3 * first, 4 * first]  # concatenation copies the whole cache


def test_buffer_grows_when_needed():
    buffer = PreallocatedKV(1, 1, 1, 4, 2, dtype=torch.float32, device="cpu")
    buffer.row(buffer.allocate(4)).append(KVSegment(torch.arange(24.0).view(1, 2, 1, 6, 2)))
    assert buffer.capacity >= 6 and buffer.lengths[0] == 6
    assert torch.equal(buffer.data[:, :, 0, :, :6], torch.arange(24.0).view(1, 2, 1, 6, 2))
    second = buffer.allocate(8)  # no free row: the rows double, the cached entries are kept
    assert buffer.rows == 2 and second == 1
    assert torch.equal(buffer.data[:, :, 0, :, :6], torch.arange(24.0).view(1, 2, 1, 6, 2))


def test_freed_rows_are_reused_and_moves_keep_the_entries():
    buffer = PreallocatedKV(1, 2, 1, 8, 2, dtype=torch.float32, device="cpu")
    a, b = buffer.allocate(8), buffer.allocate(8)
    buffer.row(b).append(KVSegment(torch.full((1, 2, 1, 3, 2), 7.0)))
    buffer.free(a)
    buffer.move(b, a)
    assert buffer.lengths[a] == 3 and bool((buffer.data[:, :, a, :, :3] == 7).all())
    assert buffer.allocate(8) == b and buffer.rows == 2


def test_a_finished_rows_store_keeps_its_length_after_its_row_is_reused():
    buffer = PreallocatedKV(1, 2, 1, 16, 2, dtype=torch.float32, device="cpu")
    first, second = buffer.row(buffer.allocate(16)), buffer.row(buffer.allocate(16))
    first.append(KVSegment(torch.ones(1, 2, 1, 3, 2)))
    second.append(KVSegment(torch.ones(1, 2, 1, 5, 2)))
    first.detach()
    buffer.lengths[0] = 99  # the row is reused by another sequence
    assert len(first) == 3
    with pytest.raises(RuntimeError, match="given up"):
        first.append(KVSegment(torch.ones(1, 2, 1, 1, 2)))
