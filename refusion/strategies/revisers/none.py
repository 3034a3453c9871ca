"""``none``: nothing is revisable; every commit is sealed into the cache at once (ReFusion's own decoding)."""

from __future__ import annotations

import attrs

from refusion.plugins import hookimpl
from refusion.strategies.base import Reviser, Revision, RevisionView


@attrs.frozen
class NoReviser(Reviser):
    """Revises nothing: a commit is final and enters the cache in the iteration that made it."""

    name = "none"
    revises = False

    def revise(self, view: RevisionView) -> Revision | None:
        return None


@hookimpl
def register_revisers(register):
    register(NoReviser)
