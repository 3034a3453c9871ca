"""What decoding costs, counted in one place.

Every engine and every key/value store reports into :class:`Counters`: one
per sequence (what served it) and one per engine (the totals). Nothing else
counts forwards or bytes, so every engine is measured the same way.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define(eq=False)
class Counters:
    """Costs of a sequence's decode, or an engine's totals.

    ``forwards``: network forwards (for a sequence: the forwards that served
    it). ``fed_tokens``: query tokens fed to the network (for a sequence: its
    own, padding excluded). ``padded_tokens``: padding fed alongside (engine
    totals only). ``kv_context_bytes``: bytes of already-cached keys/values
    copied again (the cost that grows with the context); ``kv_new_bytes``:
    bytes of new keys/values written. ``parent`` (an engine's totals) also
    receives every byte counted here.
    """

    forwards: int = 0
    fed_tokens: int = 0
    padded_tokens: int = 0
    kv_context_bytes: int = 0
    kv_new_bytes: int = 0
    parent: "Counters | None" = attrs.field(default=None, repr=False)
    #: query tokens of each forward, in order (a sequence's counters keep it; the decoder's trace reads it)
    fed_log: list[int] = attrs.field(factory=list, repr=False)

    def forward(self, fed: int, *, log: bool = False) -> None:
        """Count one forward that fed ``fed`` query tokens (``log``: also append ``fed`` to :attr:`fed_log`)."""
        self.forwards += 1
        self.fed_tokens += fed
        if log:
            self.fed_log.append(fed)

    def copied(self, context: int = 0, new: int = 0) -> None:
        """Count ``context`` bytes of cached keys/values re-copied and ``new`` bytes written."""
        self.kv_context_bytes += context
        self.kv_new_bytes += new
        if self.parent is not None:
            self.parent.copied(context, new)

    @property
    def kv_bytes(self) -> dict[str, int]:
        return {"context": self.kv_context_bytes, "new": self.kv_new_bytes}

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers, the same keys for every engine."""
        return {"forwards": self.forwards, "fed_tokens": self.fed_tokens, "padded_tokens": self.padded_tokens,
                "kv_bytes": self.kv_bytes}
