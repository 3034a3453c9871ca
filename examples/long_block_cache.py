"""A cache policy: reuse the prefix's keys/values only in long blocks, where recomputing it costs the most.

A cache reorderer decides, block by block, which keys/values a bidirectional model reuses: ``start_block`` returns
a :class:`~refusion.parts.BlockReuse` or ``None`` (exact: every forward sees the whole canvas). Here blocks of at
least ``min_block`` tokens take Fast-dLLM's prefix cache, shorter ones stay exact. SDAR's ``block`` engine keeps an
exact cache of finished blocks and refuses an approximation: there its 4-token blocks stay below ``min_block``.
"""

from __future__ import annotations

import attrs

from refusion.parts import BlockReuse, CacheReorderer, hookimpl


@attrs.frozen
class LongBlockCache(CacheReorderer):
    name = "long-block-cache"
    min_block: int = 8

    def reorder(self, cache, result):
        for commit in result.commits:  # the committed tokens join the context in commit order
            cache.append(commit.tokens, commit.positions)

    def start_block(self, start, stop):
        return BlockReuse("prefix") if stop - start >= self.min_block else None


@hookimpl
def register_reorderers(register):
    register(LongBlockCache)
