"""Where a sequence's keys/values live.

A store holds the encoded context of one sequence and offers three operations:
``append(kv)``, ``truncate(length)`` and ``len()``. Two stores exist:

* :class:`DynamicStore` - a transformers ``DynamicCache`` (grows by
  concatenation, so every append copies the whole cached context);
* :class:`RowStore` - one row of a :class:`PreallocatedKV` buffer, where an
  append writes the new entries in place and truncation is a length change.

Both count the bytes of keys/values they move (``copies``): copies of entries
already cached (``context``, the cost that grows with the sequence) apart from
writes of new entries (``new``).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from refusion.cache.kv import KVSegment


@attrs.define
class CopyStats:
    """Bytes of keys/values moved: ``context`` (re-copies of cached entries) and ``new`` (new entries written)."""

    context: int = 0
    new: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"context": self.context, "new": self.new}


def bytes_per_token(layers: int, heads: int, dim: int, dtype: torch.dtype) -> int:
    """Bytes of keys plus values of one token over all layers."""
    return layers * 2 * heads * dim * torch.empty((), dtype=dtype).element_size()


class DynamicStore:
    """A transformers ``DynamicCache`` for one sequence (the reference decoder's cache)."""

    def __init__(self, cache: Any):
        self.cache = cache
        self.copies = CopyStats()

    def __len__(self) -> int:
        return self.cache.get_seq_length()

    def append(self, kv: KVSegment) -> None:
        data = kv.data
        length = len(self)
        for layer in range(data.shape[0]):
            self.cache.update(data[layer, 0].unsqueeze(0), data[layer, 1].unsqueeze(0), layer)
        layers, _, heads, n, dim = data.shape
        token = bytes_per_token(layers, heads, dim, data.dtype)
        self.copies.context += length * token  # torch.cat copies everything already cached
        self.copies.new += n * token

    def truncate(self, length: int) -> None:
        if length < len(self):
            self.cache.crop(length - len(self))


class PreallocatedKV:
    """One buffer of keys/values for a batch of sequences, allocated once.

    ``data`` has shape ``(layers, 2, batch, kv_heads, capacity, head_dim)``.
    Row ``b`` holds its sequence's encoded context in slots ``0:lengths[b]``;
    slots beyond are scratch space for the model call in flight.
    """

    def __init__(self, layers: int, batch: int, heads: int, capacity: int, dim: int, *, dtype, device):
        self.data = torch.zeros((layers, 2, batch, heads, capacity, dim), dtype=dtype, device=device)
        self.lengths = [0] * batch
        self.copies = CopyStats()
        self.token_bytes = bytes_per_token(layers, heads, dim, dtype)

    @property
    def capacity(self) -> int:
        return self.data.shape[4]

    def ensure_capacity(self, needed: int) -> None:
        """Grow the buffer (one copy) if ``needed`` slots do not fit."""
        if needed <= self.capacity:
            return
        new_cap = max(needed, 2 * self.capacity)
        grown = self.data.new_zeros((*self.data.shape[:4], new_cap, self.data.shape[5]))
        used = max(self.lengths) if self.lengths else 0
        grown[:, :, :, :, :used] = self.data[:, :, :, :, :used]
        self.copies.context += used * self.token_bytes * len(self.lengths)
        self.data = grown

    def write(self, row: int, start: int, kv: torch.Tensor) -> None:
        """Write ``kv`` of shape ``(layers, 2, heads, n, dim)`` into row ``row`` at slots ``start:start+n``."""
        from refusion_kernels import scatter_kv

        n = kv.shape[3]
        self.ensure_capacity(start + n)
        cols = torch.arange(start, start + n, device=self.data.device)
        scatter_kv(self.data, kv, torch.full_like(cols, row), cols)
        self.copies.new += n * self.token_bytes

    def row(self, index: int) -> "RowStore":
        return RowStore(self, index)


class RowStore:
    """The store of one sequence inside a :class:`PreallocatedKV`."""

    def __init__(self, buffer: PreallocatedKV, row: int):
        self.buffer = buffer
        self.row = row
        self._detached_length: int | None = None

    def detach(self) -> None:
        """Give the row up (its sequence has finished): keep the length, refuse further writes."""
        self._detached_length = len(self)
        self.row = -1

    @property
    def copies(self) -> CopyStats:
        return CopyStats()  # counted once, on the shared buffer

    def __len__(self) -> int:
        if self._detached_length is not None:
            return self._detached_length
        return self.buffer.lengths[self.row]

    def append(self, kv: KVSegment) -> None:
        if self._detached_length is not None:
            raise RuntimeError("this sequence's row was given up when it finished")
        start = len(self)
        self.buffer.write(self.row, start, kv.data)
        self.buffer.lengths[self.row] = start + len(kv)

    def truncate(self, length: int) -> None:
        if self._detached_length is not None:
            self._detached_length = min(length, self._detached_length)
            return
        self.buffer.lengths[self.row] = min(length, len(self))
