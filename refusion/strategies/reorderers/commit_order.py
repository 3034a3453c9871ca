"""The paper's cache update: append finished slots in commit order, with the infiller's keys/values."""

from __future__ import annotations

import attrs

from refusion.cache.sequence import CacheEditor
from refusion.plugins import hookimpl
from refusion.state import InfillResult
from refusion.strategies.base import CacheReorderer


@attrs.frozen
class CommitOrder(CacheReorderer):
    """Append each commit's tokens and keys/values after the context, in commit order.

    Keys/values of slots infilled in parallel were computed per branch, so the
    cache is not what a causal re-encode would give (ReFusion's behaviour,
    kept on purpose); use ``reencode`` for the exact cache.
    """

    name = "commit-order"

    def reorder(self, cache: CacheEditor, result: InfillResult) -> None:
        anchor, previous_chain = len(cache), None
        last = len(result.commits) - 1
        for i, commit in enumerate(result.commits):
            cache.append(
                commit.tokens,
                commit.positions,
                commit.kv,
                anchor=anchor,
                continues=commit.chain == previous_chain,
                last_logits=result.next_logits if i == last else None,
            )
            previous_chain = commit.chain


@hookimpl
def register_reorderers(register):
    register(CommitOrder)
