"""The key/value manager of one engine: the page pool, the sequences' block tables, the prefix cache, the reservations.

One :class:`KVManager` owns every byte of keys/values an engine keeps: the :class:`~refusion.cache.pages.PagePool`
(at most ``budget`` bytes of pages), the :class:`~refusion.cache.paged.BlockTable` of every live lane, the
:class:`~refusion.cache.prefix.PrefixCache` of prompts' full pages shared across sequences, and the pages each
admitted sequence reserved. Admission (:meth:`KVManager.admission`) is by reservation: a sequence is admitted when
the pages it may need fit beside the ones the running sequences reserved, so the pages a step needs are always
there when the step allocates them (:meth:`KVManager.ensure`, before the forward). Engines lay out and run forwards;
they ask this manager for room and never own a page. Knows nothing about models or decoding.
"""

from __future__ import annotations

from typing import Any

import torch

from refusion.cache.paged import BlockTable, PagedKV
from refusion.cache.pages import PAGE_SIZE, PagePool
from refusion.cache.prefix import PrefixCache


class KVManager:
    """Pages, tables, prefix cache and reservations of one engine (see the module docstring).

    ``budget``: bytes of pages at most; ``prefix_cache``: keep prompts' full pages for later sequences.
    """

    def __init__(
        self,
        layers: int,
        heads: int,
        dim: int,
        dtype: torch.dtype,
        device: Any,
        *,
        budget: int,
        page_size: int = PAGE_SIZE,
        prefix_cache: bool = False,
        counters: Any = None,
    ):
        pool = PagePool.for_budget(
            layers, heads, dim, budget, page_size=page_size, dtype=dtype, device=device, counters=counters
        )
        #: the prompts' pages shared across sequences, when ``prefix_cache``
        self.prefixes: PrefixCache | None = PrefixCache(pool) if prefix_cache else None
        #: block tables over the pool (the operations on one table)
        self.kv = PagedKV(pool, self.prefixes)
        self.pool = pool
        self.page_size = pool.page_size
        self.token_bytes = pool.token_bytes
        #: pages each admitted owner reserved
        self.reserved: dict[object, int] = {}

    # -- admission ------------------------------------------------------------------
    def pages_for(self, columns: int) -> int:
        """Pages that hold ``columns`` columns."""
        return self.kv.pages_for(columns)

    def admission(self, pages: int, *, alone: bool = False) -> str | None:
        """Why an owner needing ``pages`` pages cannot be admitted beside the reserved ones (``alone``: even with
        none), naming the budget; ``None`` when it can."""
        limit = self.pool.limit
        held = 0 if alone else sum(self.reserved.values())
        if held + pages <= limit:
            return None
        page = self.pool.page_bytes
        return (
            f"it needs {pages} pages of keys/values ({pages * page} bytes); {limit - held} of the budget's "
            f"{limit} are free (raise `kv_memory`)"
        )

    def reserve(self, owner: object, pages: int) -> None:
        """Record that ``owner`` was admitted for ``pages`` pages (added to what it holds)."""
        self.reserved[owner] = self.reserved.get(owner, 0) + pages

    def unreserve(self, owner: object) -> None:
        """``owner`` left: its reservation is free again."""
        self.reserved.pop(owner, None)

    def usage(self) -> tuple[int, int]:
        """``(used, total)`` pages of the pool."""
        return self.pool.used, self.pool.limit

    # -- tables -----------------------------------------------------------------------
    def table(self) -> BlockTable:
        """A new, empty block table."""
        return BlockTable()

    def free(self, table: BlockTable) -> None:
        """Give every page of ``table`` back (its lane left)."""
        self.kv.free(table)

    def ensure(self, table: BlockTable, columns: int, counters: Any = None) -> None:
        """Room for ``columns`` columns in ``table`` before a step writes them (pages taken, shared ones copied)."""
        self.kv.ensure(table, columns, counters)

    def trim(self, table: BlockTable) -> None:
        """Give back the pages of ``table`` past its ``length``."""
        self.kv.trim(table)

    # -- prefixes shared across sequences -------------------------------------------------
    def reuse_prefix(self, owner: object, table: BlockTable, prompt: torch.Tensor) -> int:
        """Start the empty ``table`` with the cached pages of ``prompt``'s longest cached prefix (shared, not
        copied) and expect ``owner`` to publish the rest; returns the tokens reused (0 without a prefix cache)."""
        if self.prefixes is None:
            return 0
        hit = self.prefixes.match(prompt)
        self.prefixes.expect(owner, prompt)
        if hit.tokens:
            self.kv.share(table, hit.pages)
        return hit.tokens

    def publish(self, owner: object, table: BlockTable, prompt: torch.Tensor) -> None:
        """``owner``'s prompt is encoded in ``table``'s first columns: its full pages join the prefix cache (by
        reference: the table's pages become shared)."""
        if self.prefixes is None:
            return
        full = len(prompt) // self.page_size
        self.prefixes.publish(prompt, table.pages[:full])
        table.shared = max(table.shared, full)  # the cache holds them now: copied before any rewrite
        self.prefixes.forget(owner)

    def forget(self, owner: object) -> None:
        """``owner`` will publish nothing (it left, or published)."""
        if self.prefixes is not None:
            self.prefixes.forget(owner)

    def awaited_prefix(self, prompt: torch.Tensor) -> int:
        """Prompt tokens a sequence admitted now would compute but could reuse once the prompts being encoded are
        published (0 without a prefix cache)."""
        return self.prefixes.awaited(prompt) if self.prefixes is not None else 0
