"""Live sequences' keys/values on pages: a block table per sequence, pages taken on demand, no row copies.

Every live sequence of the ``branch`` engine owns a :class:`BlockTable`: the pages of one shared
:class:`~refusion.cache.pages.PagePool` that hold its cache columns ``0, 1, 2, ...`` in order (column ``c`` is
entry ``c % page_size`` of page ``pages[c // page_size]``). ReFusion's commit-order cache maps onto it directly:
committing appends columns after ``length``, invalidating is a length change, and a loop's uncommitted branches
are columns past the committed ones that it holds for a while. Pages past the columns in use go back to the pool
(:meth:`PagedKV.trim`) after each whole-batch forward, and before a sequence's next forward otherwise (its last
outputs' keys/values are read until then), and a sequence that leaves gives its pages back: no other sequence's
entries move.

Pages can be shared read-only: a prompt's full pages are published to the prefix cache
(:mod:`refusion.cache.prefix`) by reference, and a later prompt that starts the same way starts its table with
them (:meth:`PagedKV.share`). A table's first ``shared`` pages may be held by others; writing one of them copies it
first (copy on write, :meth:`PagedKV.own_from`), which only happens when a reorderer invalidates into the prompt.

Attention reads a forward's rows through slot indices (:meth:`PagedKV.slot_index`): one ``index_select`` gathers
each row's keys into ``(rows, keys, heads, dim)`` per layer, or, for one row whose pages are consecutive, a plain
slice of the pool (:meth:`PagedKV.first_slot`) with no copy at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import attrs
import numpy as np
import torch

from refusion.cache.pages import PagePool
from refusion.cache.segment import KVSegment
from refusion.counters import Counters


@attrs.define(eq=False)
class BlockTable:
    """The pages of one sequence, in column order.

    ``length``: columns in use (its cached entries, and any branches its loop holds past them); ``shared``: how
    many leading pages others (the prefix cache, other sequences) may hold too.
    """

    pages: list[int] = attrs.field(factory=list)
    length: int = 0
    shared: int = 0


class PagedKV:
    """Block tables over one :class:`~refusion.cache.pages.PagePool` (see the module docstring).

    Contract: a table's columns ``0:length`` keep their entries until the table's owner shortens ``length``;
    :meth:`ensure` makes room for columns (taking pages, evicting the prefix cache's least recently used pages when
    the pool is at its limit, and growing past the limit only for a sequence already running, counted in
    :attr:`PagePool.over_limit <refusion.cache.pages.PagePool.over_limit>`); nothing here decides who may run.
    """

    def __init__(self, pool: PagePool, prefixes: Any = None):
        self.pool = pool
        #: the :class:`~refusion.cache.prefix.PrefixCache` sharing the pool (its pages are evicted for room)
        self.prefixes = prefixes
        self.page_size = pool.page_size
        self.token_bytes = pool.token_bytes
        self.counters = pool.counters

    def pages_for(self, columns: int) -> int:
        """Pages that hold ``columns`` columns."""
        return -(-columns // self.page_size)

    # -- taking and giving back pages ---------------------------------------------------
    def _take(self) -> int:
        page = self.pool.allocate()
        while page is None and self.prefixes is not None and self.prefixes.evict():
            page = self.pool.allocate()
        if page is None:  # a running sequence must not fail for lack of room: past the budget (counted)
            page = self.pool.allocate(beyond_limit=True)
        if page is None:
            raise torch.OutOfMemoryError("the device has no memory left for another page of keys/values")
        return page

    def ensure(self, table: BlockTable, columns: int, counters: Counters | None = None) -> None:
        """Room for ``columns`` columns in ``table``, the columns from ``length`` on writable (pages owned)."""
        while len(table.pages) < self.pages_for(columns):
            table.pages.append(self._take())
        self.own_from(table, table.length, counters)

    def own_from(self, table: BlockTable, column: int, counters: Counters | None = None) -> None:
        """Make the pages holding columns ``column`` onwards this table's own: a shared one is copied first."""
        first = column // self.page_size
        for index in range(first, min(table.shared, len(table.pages))):
            page = table.pages[index]
            if self.pool.refs[page] > 1:
                fresh = self._take()
                self.pool.data[:, :, fresh] = self.pool.data[:, :, page]
                self.pool.release(page)
                table.pages[index] = fresh
                (counters or self.counters).copied(context=self.page_size * self.token_bytes)
        table.shared = min(table.shared, first)

    def share(self, table: BlockTable, pages: Sequence[int]) -> None:
        """Start the empty ``table`` with ``pages`` (full, read-only: their holders keep them); no copy."""
        if table.pages:
            raise ValueError("only an empty block table can start with shared pages")
        for page in pages:
            self.pool.retain(page)
        table.pages, table.length, table.shared = list(pages), len(pages) * self.page_size, len(pages)

    def trim(self, table: BlockTable) -> None:
        """Give back the pages past the columns in use."""
        keep = self.pages_for(table.length)
        while len(table.pages) > keep:
            self.pool.release(table.pages.pop())
        table.shared = min(table.shared, keep)

    def free(self, table: BlockTable) -> None:
        """Give back every page of ``table`` (its sequence left); ``length`` is kept. If the pool held more than its
        limit (a running sequence grew past it), the prefix cache's pages go first until it holds no more."""
        for page in table.pages:
            self.pool.release(page)
        table.pages, table.shared = [], 0
        while self.pool.over_limit and self.prefixes is not None and self.prefixes.evict():
            pass

    # -- addressing ------------------------------------------------------------------------
    def page_table(self, tables: Sequence[BlockTable], keys: int) -> np.ndarray:
        """``(rows, pages_for(keys))`` block tables of ``tables``' columns ``0:keys`` (page 0 past a table's pages,
        which attention must mask)."""
        width = self.pages_for(keys)
        held = [table.pages[:width] for table in tables]
        pages: np.ndarray = np.zeros((len(tables), width), dtype=np.int64)
        pages[np.arange(width)[None, :] < np.array([len(h) for h in held])[:, None]] = list(chain.from_iterable(held))
        return pages

    def slot_index(self, tables: Sequence[BlockTable], keys: int) -> np.ndarray:
        """``(rows, keys)`` pool slots of each table's columns ``0:keys`` (columns past a table's pages: slot 0,
        which attention must mask)."""
        size = self.page_size
        pages = self.page_table(tables, keys)
        slots = (pages * size)[:, :, None] + np.arange(size)  # (rows, width, size): every column of every page
        return np.ascontiguousarray(slots.reshape(len(tables), -1)[:, :keys])

    def first_slot(self, table: BlockTable, keys: int) -> int | None:
        """The slot of column 0 when columns ``0:keys`` lie in consecutive pages (one slice of the pool), else
        ``None``."""
        count = self.pages_for(keys)
        pages = table.pages[:count]
        if len(pages) < count or (count > 1 and pages != list(range(pages[0], pages[0] + count))):
            return None
        return pages[0] * self.page_size if pages else 0

    def _slots(self, table: BlockTable, start: int, stop: int) -> slice | torch.Tensor:
        """The pool slots of columns ``start:stop``: one slice when they lie on consecutive pages (a range within
        one page always does), else an index tensor."""
        size = self.page_size
        first, last = start // size, (stop - 1) // size
        pages = table.pages[first : last + 1]
        if (
            pages
            and pages[-1] - pages[0] == last - first
            and (last - first < 2 or pages == list(range(pages[0], pages[-1] + 1)))
        ):
            at = pages[0] * size + start % size
            return slice(at, at + stop - start)
        columns = np.arange(start, stop)
        pages = np.asarray(table.pages, dtype=np.int64)[columns // self.page_size]
        return torch.from_numpy(pages * self.page_size + columns % self.page_size).to(self.pool.data.device)

    # -- moving entries ---------------------------------------------------------------------
    def write(self, table: BlockTable, start: int, kv: torch.Tensor, counters: Counters | None = None) -> None:
        """Write ``kv`` ``(layers, 2, heads, n, dim)`` at columns ``start:start+n`` of ``table`` (one copy); the
        length is the caller's to change."""
        n = kv.shape[3]
        if not n:
            return
        self.own_from(table, start, counters)
        self.ensure(table, start + n, counters)
        slots, where = self.pool.slots, self._slots(table, start, start + n)
        if isinstance(where, slice):
            slots[:, :, where] = kv.transpose(2, 3)
        else:
            slots.index_copy_(2, where, kv.transpose(2, 3).to(slots.dtype))
        (counters or self.counters).copied(new=n * self.token_bytes)

    def entries(self, table: BlockTable, start: int, stop: int) -> torch.Tensor:
        """Columns ``start:stop`` of ``table`` as ``(layers, 2, heads, n, dim)`` (a copy)."""
        if stop <= start:
            return self.pool.slots[:, :, :0].transpose(2, 3).clone()
        where = self._slots(table, start, stop)
        if isinstance(where, slice):
            return self.pool.slots[:, :, where].transpose(2, 3).clone()
        return self.pool.slots.index_select(2, where).transpose(2, 3)


class PagedStore:
    """The store of one sequence on pages (the :class:`~refusion.decoding.context.SequenceCache` interface:
    ``append``, ``truncate``, ``len``). :meth:`detach` gives its pages back when the sequence leaves; the length is
    kept and further writes are refused."""

    def __init__(self, kv: PagedKV, counters: Counters | None = None, table: BlockTable | None = None):
        self.kv = kv
        self.table = table if table is not None else BlockTable()
        self.counters = counters if counters is not None else Counters(parent=kv.counters)
        self.detached = False

    def __len__(self) -> int:
        return self.table.length

    def append(self, kv: KVSegment) -> None:
        if self.detached:
            raise RuntimeError("this sequence's pages were given back when it finished")
        start = self.table.length
        self.kv.write(self.table, start, kv.data, self.counters)
        self.table.length = start + len(kv)

    def truncate(self, length: int) -> None:
        self.table.length = min(length, self.table.length)

    def detach(self) -> None:
        """Give the pages back (the sequence has finished)."""
        if not self.detached:
            self.kv.free(self.table)
            self.detached = True


class TableReader:
    """The keys/values an :class:`~refusion.decoding.protocol.ExtendOutput` reads: columns of one table."""

    def __init__(self, kv: PagedKV, table: BlockTable):
        self.kv, self.table = kv, table

    def entries(self, start: int, stop: int) -> torch.Tensor:
        return self.kv.entries(self.table, start, stop)
