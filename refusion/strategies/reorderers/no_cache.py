"""No cache at all: every step re-encodes the whole context, as plain masked-diffusion decoding does."""

from __future__ import annotations

import attrs

from refusion.decoding.context import CacheEditor
from refusion.decoding.types import InfillResult
from refusion.plugins import hookimpl
from refusion.strategies.base import CacheReorderer


@attrs.frozen
class NoCache(CacheReorderer):
    """Append the commits, then drop every cached key/value (prompt included).

    The next forward re-encodes the whole context: the cost profile of LLaDA's
    original sampler, a baseline for what caching saves. Exact (causal) on
    causal models.
    """

    name = "no-cache"

    def reorder(self, cache: CacheEditor, result: InfillResult) -> None:
        for commit in result.commits:
            cache.append(commit.tokens, commit.positions)
        cache.invalidate(0)


@hookimpl
def register_reorderers(register):
    register(NoCache)
