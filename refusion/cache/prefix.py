"""Prefix reuse across requests: full pages of prompt tokens, found by content, evicted least recently used.

A causal model's keys and values of a prompt's first ``n`` tokens depend on those tokens only, so a request whose
prompt starts like an earlier one's (a shared system prompt, a few-shot header, a conversation's earlier turns) can
take them instead of computing them. :class:`PrefixCache` keeps one entry per full page of prompt tokens, on the
pages of the :class:`~refusion.cache.pages.PagePool` that live sequences use (:mod:`refusion.cache.paged`):
publishing an encoded prompt takes a reference to the pages its sequence wrote, and a later sequence that matches
takes a reference too (nothing is copied either way). An entry is keyed by its tokens chained with the entry before
it (the page's position in the prompt and everything before it are part of the key), compared exactly (no hash
collision can hand a request another prompt's keys). The cache holds one reference to each entry's page; a page that
only the cache holds is evictable, the least recently used first (a match touches the deepest entry first, so an
entry is never evicted before the entries that continue it). Queries and hits are counted in tokens, as vLLM counts
them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import attrs
import torch

from refusion.cache.pages import PagePool

#: an entry's key: (the entry before it, or -1 at the prompt's start; its page's tokens)
Key = tuple[int, tuple[int, ...]]


@attrs.frozen
class PrefixHit:
    """What :meth:`PrefixCache.match` found: ``tokens`` entries (a multiple of the page size) in ``pages``."""

    tokens: int
    pages: tuple[int, ...]


@attrs.define
class PrefixStats:
    """Prompt tokens looked up (``queries``) and found (``hits``); pages published and evicted."""

    queries: int = 0
    hits: int = 0
    published: int = 0
    evicted: int = 0


class PrefixCache:
    """Full pages of prompt keys/values by content (see the module docstring).

    :meth:`match` finds the longest cached run of full pages that starts ``prompt`` (at most ``limit`` tokens) and
    counts the query; :meth:`publish` adds the full pages of an encoded prompt that are not cached yet by taking a
    reference to the pages that hold them (no copy); :meth:`evict` frees the least recently used page only the
    cache holds, when the pool it shares with live sequences needs room. It never changes a page's contents.
    """

    def __init__(self, pool: PagePool):
        self.pool = pool
        self.stats = PrefixStats()
        self._entries: dict[Key, int] = {}  # key -> entry id
        self._page: dict[int, int] = {}  # entry id -> page
        self._key: dict[int, Key] = {}  # entry id -> key
        self._lru: OrderedDict[int, None] = OrderedDict()  # entry ids, least recently used first
        self._children: dict[int, set[int]] = {}  # entry id (-1: the start) -> the entries continuing it
        self._next_id = 0
        self._expected: dict[object, list[int]] = {}  # owner -> a prompt being encoded, to be published

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    def __len__(self) -> int:
        return len(self._entries)

    def _chain(self, prompt: list[int], pages: int):
        """Keys of the first ``pages`` full pages of ``prompt``, walking the cached entries (stops at a miss)."""
        size, parent = self.page_size, -1
        for i in range(pages):
            entry = self._entries.get((parent, tuple(prompt[i * size : (i + 1) * size])))
            if entry is None:
                return
            yield entry
            parent = entry

    def match(self, prompt: torch.Tensor | list[int], limit: int | None = None) -> PrefixHit:
        """The cached pages of ``prompt``'s longest cached prefix of full pages, of at most ``limit`` tokens
        (default: all but the last token, which the caller must compute to read its output). Counts the query: the
        prompt's tokens, and the tokens found."""
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        limit = len(ids) - 1 if limit is None else min(limit, len(ids))
        found = list(self._chain(ids, max(limit, 0) // self.page_size))
        for entry in reversed(found):  # the deepest first: a continuation is evicted before what it continues
            self._lru.move_to_end(entry)
        hit = PrefixHit(len(found) * self.page_size, tuple(self._page[e] for e in found))
        self.stats.queries += len(ids)
        self.stats.hits += hit.tokens
        return hit

    def publish(self, prompt: torch.Tensor | list[int], pages: Sequence[int]) -> int:
        """Cache the full pages of an encoded ``prompt`` not cached yet; ``pages[i]`` holds its entries
        ``i * page_size`` onwards (a live sequence's own pages: the cache takes a reference to each, copies nothing;
        their holder must not write them again without copying first). Returns the pages added."""
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        size, parent, added = self.page_size, -1, 0
        chain: list[int] = []
        for i in range(min(len(ids) // size, len(pages))):
            key = (parent, tuple(ids[i * size : (i + 1) * size]))
            entry = self._entries.get(key)
            if entry is None:
                page = pages[i]
                self.pool.retain(page)
                entry = self._next_id
                self._next_id += 1
                self._entries[key], self._page[entry], self._key[entry] = entry, page, key
                self._children.setdefault(parent, set()).add(entry)
                self._lru[entry] = None
                added += 1
            chain.append(entry)
            parent = entry
        for entry in reversed(chain):  # the deepest first, as a match touches them
            self._lru.move_to_end(entry)
        self.stats.published += added
        return added

    def expect(self, owner: object, prompt: torch.Tensor | list[int]) -> None:
        """Note that ``owner``'s ``prompt`` is being encoded and will be published (until :meth:`forget`)."""
        self._expected[owner] = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)

    def forget(self, owner: object) -> None:
        """``owner``'s prompt was published, or will not be (its sequence ended first)."""
        self._expected.pop(owner, None)

    def awaited(self, prompt: torch.Tensor | list[int]) -> int:
        """Tokens of ``prompt``'s full pages (all but its last token at most) that are not cached but that a prompt
        being encoded will publish: waiting for it saves computing them. Counts nothing."""
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        cached = len(list(self._chain(ids, max(len(ids) - 1, 0) // self.page_size))) * self.page_size
        best = 0
        for other in self._expected.values():
            n, top = 0, min(len(ids) - 1, len(other))
            while n < top and ids[n] == other[n]:
                n += 1
            best = max(best, min(n, len(other) // self.page_size * self.page_size) // self.page_size * self.page_size)
        return max(0, best - cached)

    @property
    def evictable(self) -> int:
        """Pages only the cache holds (freed by :meth:`evict` when the pool needs room)."""
        return sum(self.pool.refs[page] == 1 for page in self._page.values())

    def evict(self) -> bool:
        """Drop the least recently used entry whose page only the cache holds, and the entries that continue it;
        False when there is none. (Called by whoever needs a page of the shared pool.)"""
        for entry in self._lru:
            if self.pool.refs[self._page[entry]] == 1:
                self._drop(entry)
                return True
        return False

    def _drop(self, entry: int) -> None:
        """Forget ``entry`` and every entry continuing it (no match can reach them any more)."""
        for child in list(self._children.pop(entry, ())):
            self._drop(child)
        key = self._key.pop(entry)
        del self._lru[entry], self._entries[key]
        self._children.get(key[0], set()).discard(entry)
        self.pool.release(self._page.pop(entry))
        self.stats.evicted += 1
