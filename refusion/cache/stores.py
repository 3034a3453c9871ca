"""Where a sequence's keys/values live.

A store holds the encoded context of one sequence and offers three operations:
``append(kv)``, ``truncate(length)`` and ``len()``. Two stores exist:

* :class:`DynamicStore` - a transformers ``DynamicCache`` (grows by
  concatenation, so every append copies the whole cached context);
* :class:`RowStore` - one row of a :class:`PreallocatedKV` buffer, where an
  append writes the new entries in place and truncation is a length change.

Both report the bytes of keys/values they move to the sequence's
:class:`~refusion.decoding.counters.Counters`: copies of entries already cached
(``context``, the cost that grows with the sequence) apart from writes of new
entries (``new``).
"""

from __future__ import annotations

from typing import Any

import torch

from refusion.decoding.counters import Counters
from refusion.decoding.protocol import KVSegment


def bytes_per_token(layers: int, heads: int, dim: int, dtype: torch.dtype) -> int:
    """Bytes of keys plus values of one token over all layers."""
    return layers * 2 * heads * dim * torch.empty((), dtype=dtype).element_size()


class DynamicStore:
    """A transformers ``DynamicCache`` for one sequence (the reference decoder's cache)."""

    def __init__(self, cache: Any, counters: Counters | None = None):
        self.cache = cache
        self.counters = counters if counters is not None else Counters()

    def __len__(self) -> int:
        return self.cache.get_seq_length()

    def token_bytes(self) -> int:
        """Bytes per cached token (0 while the cache is empty and its shape unknown)."""
        layer = self.cache.layers[0] if self.cache.layers else None
        if layer is None or not layer.is_initialized or not layer.keys.numel():
            return 0
        _, heads, _, dim = layer.keys.shape
        return bytes_per_token(len(self.cache.layers), heads, dim, layer.keys.dtype)

    def append(self, kv: KVSegment) -> None:
        data = kv.data
        length = len(self)
        for layer in range(data.shape[0]):
            self.cache.update(data[layer, 0].unsqueeze(0), data[layer, 1].unsqueeze(0), layer)
        layers, _, heads, n, dim = data.shape
        token = bytes_per_token(layers, heads, dim, data.dtype)
        self.counters.copied(context=length * token, new=n * token)  # torch.cat copies everything already cached

    def truncate(self, length: int) -> None:
        if length < len(self):
            self.cache.crop(length - len(self))


class PreallocatedKV:
    """One buffer of keys/values for many sequences, grown only when needed.

    ``data`` has shape ``(layers, 2, rows, kv_heads, capacity, head_dim)``.
    Row ``b`` holds its sequence's encoded context in slots ``0:lengths[b]``;
    slots beyond are scratch space for the model call in flight. Rows are
    handed out by :meth:`allocate` and returned by :meth:`free`; growing the
    buffer (more rows or more capacity) copies what is cached once, counted on
    ``counters``.
    """

    def __init__(
        self,
        layers: int,
        rows: int,
        heads: int,
        capacity: int,
        dim: int,
        *,
        dtype,
        device,
        counters: Counters | None = None,
    ):
        self.data = torch.zeros((layers, 2, rows, heads, capacity, dim), dtype=dtype, device=device)
        self.lengths = [0] * rows
        self.free_rows = list(range(rows - 1, -1, -1))
        self.counters = counters if counters is not None else Counters()
        self.token_bytes = bytes_per_token(layers, heads, dim, dtype)

    @property
    def capacity(self) -> int:
        return self.data.shape[4]

    @property
    def rows(self) -> int:
        return self.data.shape[2]

    def _grow(self, rows: int, capacity: int) -> None:
        grown = self.data.new_zeros((*self.data.shape[:2], rows, self.data.shape[3], capacity, self.data.shape[5]))
        used = max(self.lengths) if self.lengths else 0
        old_rows = self.rows
        grown[:, :, :old_rows, :, :used] = self.data[:, :, :, :, :used]
        self.counters.copied(context=sum(self.lengths) * self.token_bytes)
        self.data = grown
        self.lengths += [0] * (rows - old_rows)
        self.free_rows = list(range(rows - 1, old_rows - 1, -1)) + self.free_rows

    def ensure_capacity(self, needed: int) -> None:
        """Grow the buffer (one copy) if ``needed`` slots per row do not fit.

        While nothing is cached the buffer grows to exactly ``needed`` (nothing
        to copy); afterwards by at least a quarter, so growth stays amortised.
        """
        if needed > self.capacity:
            empty = not any(self.lengths)
            self._grow(self.rows, needed if empty else max(needed, self.capacity + self.capacity // 4))

    def allocate(self, needed: int) -> int:
        """A free row with room for ``needed`` slots (the buffer grows if there is none)."""
        if not self.free_rows:
            self._grow(max(1, 2 * self.rows), self.capacity)
        self.ensure_capacity(needed)
        row = min(self.free_rows)
        self.free_rows.remove(row)
        self.lengths[row] = 0
        return row

    def free(self, row: int) -> None:
        """Return ``row`` to the free list."""
        self.lengths[row] = 0
        self.free_rows.append(row)

    def move(self, source: int, target: int, counters: Counters | None = None) -> None:
        """Copy row ``source``'s cached entries into the free row ``target``, which it then owns."""
        n = self.lengths[source]
        self.data[:, :, target, :, :n] = self.data[:, :, source, :, :n]
        (counters or self.counters).copied(context=n * self.token_bytes)
        self.lengths[target] = n
        self.free_rows.remove(target)
        self.free(source)

    def write(self, row: int, start: int, kv: torch.Tensor, counters: Counters | None = None) -> None:
        """Write ``kv`` of shape ``(layers, 2, heads, n, dim)`` into row ``row`` at slots ``start:start+n`` (one
        copy)."""
        n = kv.shape[3]
        self.ensure_capacity(start + n)
        self.data[:, :, row, :, start : start + n] = kv
        (counters or self.counters).copied(new=n * self.token_bytes)

    def row(self, index: int, counters: Counters | None = None) -> RowStore:
        return RowStore(self, index, counters)


class RowStore:
    """The store of one sequence inside a :class:`PreallocatedKV`.

    The engine may move the sequence to another row (``row`` changes); when
    the sequence finishes the engine calls :meth:`detach`: the store keeps its
    length but owns no row any more.
    """

    def __init__(self, buffer: PreallocatedKV, row: int, counters: Counters | None = None):
        self.buffer = buffer
        self.row = row
        self.counters = counters if counters is not None else Counters(parent=buffer.counters)
        self._detached_length: int | None = None

    def detach(self) -> None:
        """Give the row up (its sequence has finished): keep the length, refuse further writes."""
        self._detached_length = len(self)
        self.row = -1

    def __len__(self) -> int:
        if self._detached_length is not None:
            return self._detached_length
        return self.buffer.lengths[self.row]

    def append(self, kv: KVSegment) -> None:
        if self._detached_length is not None:
            raise RuntimeError("this sequence's row was given up when it finished")
        start = len(self)
        self.buffer.write(self.row, start, kv.data, self.counters)
        self.buffer.lengths[self.row] = start + len(kv)

    def truncate(self, length: int) -> None:
        if self._detached_length is not None:
            self._detached_length = min(length, self._detached_length)
            return
        self.buffer.lengths[self.row] = min(length, len(self))


class NoStore:
    """A store that keeps nothing: for engines whose sequences keep no per-sequence keys/values (the canvas
    re-reads committed tokens from the canvas; the block engine keeps its own cache of finished blocks)."""

    def __len__(self) -> int:
        return 0

    def append(self, kv) -> None:
        pass

    def truncate(self, length: int) -> None:
        pass
