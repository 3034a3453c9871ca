"""Where a sequence's keys/values live.

A store holds the encoded context of one sequence and offers three operations:
``append(kv)``, ``truncate(length)`` and ``len()``. The stores:

* :class:`DynamicStore` - a transformers ``DynamicCache`` (grows by
  concatenation, so every append copies the whole cached context);
* :class:`~refusion.cache.paged.PagedStore` - a block table of pages
  (:mod:`refusion.cache.paged`), where an append writes the new entries in
  place and truncation is a length change;
* :class:`NoStore` - nothing, for engines that keep no per-sequence cache.

The first two report the bytes of keys/values they move to the sequence's
:class:`~refusion.counters.Counters`: copies of entries already cached
(``context``, the cost that grows with the sequence) apart from writes of new
entries (``new``).
"""

from __future__ import annotations

from typing import Any

import torch

from refusion.cache.segment import KVSegment
from refusion.counters import Counters


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


class NoStore:
    """A store that keeps nothing: for engines whose sequences keep no per-sequence keys/values (the canvas
    re-reads committed tokens from the canvas; the block engine keeps its own cache of finished blocks)."""

    def __len__(self) -> int:
        return 0

    def append(self, kv) -> None:
        pass

    def truncate(self, length: int) -> None:
        pass
