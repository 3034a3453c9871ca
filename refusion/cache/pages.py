"""Fixed-size pages of keys/values: storage, allocation and reference counts, no policy.

A :class:`PagePool` holds ``data`` of shape ``(layers, 2, pages, page_size, kv_heads, head_dim)``: page ``p`` keeps
the keys and values of ``page_size`` consecutive cache entries of one sequence. Seen as ``slots`` (``(layers, 2,
pages * page_size, kv_heads, head_dim)``, a view), entry ``i`` of page ``p`` is slot ``p * page_size + i``: a block
table turns into slot indices, and the entries of any rows gather into ``(rows, keys, heads, dim)`` with one
``index_select`` (the layout transformers' attention reads as ``(rows, heads, keys, dim)`` after a transpose). Pages
are handed out by :meth:`PagePool.allocate` and counted by references: a page is free again when its last holder
releases it. The pool grows by a quarter at a time (one copy of the pages in use, counted on ``counters``) up to
``limit`` pages, so a budget of many gigabytes costs nothing until it is used. What the pages mean (which tokens,
who shares them) is the business of the policies on top (:mod:`refusion.cache.paged` for live sequences,
:mod:`refusion.cache.prefix` for prompts shared across requests).
"""

from __future__ import annotations

import torch

from refusion.cache.stores import bytes_per_token
from refusion.counters import Counters

#: tokens per page (vLLM's default block size)
PAGE_SIZE = 16
#: the pool grows by ``1 / GROWTH`` of its size (at least 8 pages): it never holds much more than it was asked
#: for, and every entry is copied a bounded number of times on the way (amortised O(1) per page)
GROWTH = 4


class PagePool:
    """Pages of ``page_size`` entries, at most ``limit`` of them (see the module docstring).

    Contract: :meth:`allocate` returns a page with one reference, or ``None`` when all ``limit`` pages are held
    (or memory to grow is lacking; ``beyond_limit=True`` grows past ``limit``, for a running sequence that must not
    fail);
    :meth:`retain`/:meth:`release` add and drop references (releasing a free page raises). Entries are written and
    read through block tables (:class:`~refusion.cache.paged.PagedKV`); nothing here looks at what they are.
    """

    def __init__(
        self,
        layers: int,
        heads: int,
        dim: int,
        *,
        limit: int,
        page_size: int = PAGE_SIZE,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        counters: Counters | None = None,
    ):
        if page_size < 1 or limit < 1:
            raise ValueError(f"`page_size` and `limit` must be >= 1; got {page_size} and {limit}.")
        self.page_size = page_size
        self.limit = limit
        self.token_bytes = bytes_per_token(layers, heads, dim, dtype)
        self.counters = counters if counters is not None else Counters()
        self.data = torch.zeros((layers, 2, min(limit, 8), page_size, heads, dim), dtype=dtype, device=device)
        self.refs = [0] * self.data.shape[2]
        #: bytes of held pages copied when the pool grew (also counted on ``counters`` as copies of cached entries)
        self.growth_bytes = 0
        self._free = list(range(self.data.shape[2] - 1, -1, -1))

    @classmethod
    def for_budget(cls, layers: int, heads: int, dim: int, budget_bytes: int, **options) -> PagePool:
        """A pool of as many pages as ``budget_bytes`` holds (at least one, whatever the budget)."""
        page_size = options.get("page_size", PAGE_SIZE)
        page_bytes = bytes_per_token(layers, heads, dim, options.get("dtype", torch.float32)) * page_size
        return cls(layers, heads, dim, limit=max(1, int(budget_bytes) // page_bytes), **options)

    @property
    def page_bytes(self) -> int:
        return self.token_bytes * self.page_size

    @property
    def slots(self) -> torch.Tensor:
        """``data`` as ``(layers, 2, pages * page_size, heads, dim)`` (a view: writes go to the pages)."""
        layers, two, pages, size, heads, dim = self.data.shape
        return self.data.view(layers, two, pages * size, heads, dim)

    @property
    def used(self) -> int:
        """Pages holding at least one reference."""
        return len(self.refs) - len(self._free)

    @property
    def capacity(self) -> int:
        """Pages allocated in memory so far (grows up to :attr:`limit`)."""
        return self.data.shape[2]

    @property
    def over_limit(self) -> int:
        """Pages held beyond ``limit`` (taken with ``beyond_limit=True``)."""
        return max(0, self.used - self.limit)

    def allocate(self, beyond_limit: bool = False) -> int | None:
        """A page with one reference, or ``None`` when ``limit`` pages are held (unless ``beyond_limit``) or the
        device has no memory left to grow the pool (running out of room is an answer, not an error; the limit
        then shrinks to the pages that exist, so whoever admits by it stops counting on more)."""
        if not beyond_limit and self.used >= self.limit:
            return None
        if not self._free and (beyond_limit or self.capacity < self.limit):
            try:
                grown = self.capacity + max(8, self.capacity // GROWTH)
                self._grow(grown if beyond_limit and self.capacity >= self.limit else min(self.limit, grown))
            except torch.OutOfMemoryError:
                self.limit = max(1, self.capacity)  # the device holds no more: the budget is what exists
                return None
        if not self._free:
            return None
        page = self._free.pop()
        self.refs[page] = 1
        return page

    def retain(self, page: int) -> None:
        if self.refs[page] <= 0:
            raise ValueError(f"page {page} is free; only a held page can be retained")
        self.refs[page] += 1

    def release(self, page: int) -> None:
        """Drop one reference; the page is free once none is left."""
        if self.refs[page] <= 0:
            raise ValueError(f"page {page} is already free")
        self.refs[page] -= 1
        if not self.refs[page]:
            self._free.append(page)

    def _grow(self, pages: int) -> None:
        old = self.capacity
        grown = self.data.new_zeros((*self.data.shape[:2], pages, *self.data.shape[3:]))
        held = [p for p in range(old) if self.refs[p]]
        if held:
            grown[:, :, :old] = self.data
            self.counters.copied(context=len(held) * self.page_bytes)
            self.growth_bytes += len(held) * self.page_bytes
        self.data = grown
        # both lists are built first and rebound in one statement: a metrics thread reading `used` meanwhile can
        # pair an old list with a new one only between those two stores
        self.refs, self._free = self.refs + [0] * (pages - old), list(range(pages - 1, old - 1, -1)) + self._free
