"""The paper's cache update: append finished slots in commit order, with the infiller's keys/values."""

from __future__ import annotations

import attrs
import torch

from refusion.decoding.context import CacheEditor
from refusion.decoding.protocol import KVSegment
from refusion.decoding.types import InfillResult
from refusion.plugins import hookimpl
from refusion.strategies.base import CacheReorderer


@attrs.frozen
class CommitOrder(CacheReorderer):
    """Append each commit's tokens and keys/values after the context, in commit order.

    Keys/values of slots infilled in parallel were computed per branch, so the
    cache is not what a causal re-encode would give (ReFusion's behaviour,
    kept on purpose); use ``reencode`` for the exact cache.
    """

    name = "commit-order"
    commit_order = True

    def reorder(self, cache: CacheEditor, result: InfillResult) -> None:
        anchor, previous_chain = len(cache), None
        groups = _chains(result.commits)
        for i, group in enumerate(groups):
            commit = group[0]
            if len(group) == 1:
                tokens, positions, kv = commit.tokens, commit.positions, commit.kv
            else:  # consecutive commits of one chain: one append
                tokens = torch.cat([c.tokens for c in group])
                positions = torch.cat([c.positions for c in group])
                kv = KVSegment.cat([c.kv for c in group])
            cache.append(
                tokens,
                positions,
                kv,
                anchor=anchor,
                continues=commit.chain == previous_chain,
                last_logits=result.next_logits if i == len(groups) - 1 else None,
            )
            previous_chain = commit.chain


def _chains(commits) -> list[list]:
    """Runs of consecutive commits of one chain whose keys/values cover them fully (they can be appended as one)."""
    groups: list[list] = []
    for commit in commits:
        full = commit.kv is not None and len(commit.kv) == len(commit.tokens)
        last = groups[-1][-1] if groups else None
        if (
            last is not None
            and last.chain == commit.chain
            and full
            and last.kv is not None
            and len(last.kv) == len(last.tokens)
        ):
            groups[-1].append(commit)
        else:
            groups.append([commit])
    return groups


@hookimpl
def register_reorderers(register):
    register(CommitOrder)
