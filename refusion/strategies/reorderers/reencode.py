"""Exact cache: committed slots are re-encoded causally, in commit order."""

from __future__ import annotations

import attrs

from refusion.decoding.context import CacheEditor
from refusion.decoding.types import InfillResult
from refusion.plugins import hookimpl
from refusion.strategies.base import CacheReorderer


@attrs.frozen
class Reencode(CacheReorderer):
    """Append the committed tokens without the infiller's keys/values.

    The next model call encodes them first, each attending to the whole context
    before it, so the cache equals a causal forward of the reorganized sequence.
    Costs no extra forward: the re-encode rides on the next plan.
    """

    name = "reencode"

    def reorder(self, cache: CacheEditor, result: InfillResult) -> None:
        for commit in result.commits:
            cache.append(commit.tokens, commit.positions)


@hookimpl
def register_reorderers(register):
    register(Reencode)
