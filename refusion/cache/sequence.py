"""The committed context of one sequence, in cache order.

ReFusion never keeps the context in position order: finished slots are appended
after what is already cached, wherever they sit in the answer, and the masks
still to be decoded are fed after them. A :class:`SequenceCache` records, for
every context token in cache order, its id, its position id and (once encoded)
its keys/values in a store (:mod:`refusion.cache.stores`).

Tokens may be committed without keys/values ("pending"): the next model call
encodes them first, causally, in cache order. This is how a reorderer asks for
an exact re-encode without spending a forward of its own, and how the prompt
is prefilled together with the first plan.

``chunks`` records how each encoded run was computed, so tests can rebuild the
attention pattern the cache embodies: entries ``start:stop`` were computed
seeing entries ``0:anchor`` and, causally, themselves.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from refusion.cache.kv import KVSegment


@attrs.frozen
class Chunk:
    """Entries ``start:stop`` were encoded attending to ``0:anchor`` and causally to themselves."""

    start: int
    stop: int
    anchor: int


class SequenceCache:
    """Context tokens, positions and keys/values of one sequence (batch row 1).

    ``store`` holds the keys/values of the first ``encoded`` entries; entries
    ``encoded:length`` are pending. Only the executor and reorderers
    mutate a SequenceCache; selectors and infillers read it.
    """

    def __init__(self, store: Any, tokens: torch.Tensor, positions: torch.Tensor):
        self.store = store
        self.tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        self.positions = torch.as_tensor(positions, dtype=torch.long).flatten()
        self.encoded = 0
        self.chunks: list[Chunk] = []
        #: logits at the last entry in cache order (they predict the token after it), when known.
        self.last_logits: torch.Tensor | None = None
        #: for bidirectional models: canvas length (prompt + generation region), first position after a
        #: committed EOS (filled with ``eos_fill``), and the Fast-dLLM block cache, if a reorderer set one.
        self.canvas_stop: int | None = None
        self.canvas_end: int | None = None
        self.eos_fill: int | None = None
        self.block_cache: Any = None

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def pending(self) -> int:
        """Number of entries committed without keys/values yet."""
        return len(self) - self.encoded

    @property
    def last_position(self) -> int:
        """Position id of the last entry in cache order (-1 if empty)."""
        return int(self.positions[-1]) if len(self) else -1

    # -- used by reorderers -------------------------------------------------
    def append(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        kv: KVSegment | None = None,
        *,
        anchor: int | None = None,
        continues: bool = False,
        last_logits: torch.Tensor | None = None,
    ) -> None:
        """Append tokens in cache order.

        ``kv`` may cover all of ``tokens`` or a prefix of them; the rest (and
        everything appended once any entry is pending) becomes pending.
        ``anchor`` is the cache length the keys/values were computed against
        (default: the current length, i.e. plain causal); ``continues`` says
        they were computed after the previously appended run, as one chain
        (e.g. drafts verified concatenated). ``last_logits`` are
        the logits at the last appended token, if the caller has them.
        """
        tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        positions = torch.as_tensor(positions, dtype=torch.long).flatten()
        n = tokens.shape[0]
        if positions.shape[0] != n:
            raise ValueError("`tokens` and `positions` must have the same length")
        if n == 0:
            return
        start = len(self)
        covered = 0 if kv is None or self.pending else min(len(kv), n)
        if covered:
            self.store.append(kv[:covered])
            self.encoded += covered
            self._record(start, start + covered, start if anchor is None else anchor, continues)
        self.tokens = torch.cat((self.tokens, tokens.to(self.tokens.device)))
        self.positions = torch.cat((self.positions, positions.to(self.positions.device)))
        self.last_logits = last_logits if covered == n else None

    def invalidate(self, start: int = 0) -> None:
        """Drop keys/values from entry ``start`` on; those entries become pending."""
        if not 0 <= start <= len(self):
            raise ValueError(f"`start` must be in [0, {len(self)}]; got {start}.")
        if start < self.encoded:
            self.store.truncate(start)
            self.encoded = start
            self.chunks = [c if c.stop <= start else Chunk(c.start, start, c.anchor) for c in self.chunks if c.start < start]
        self.last_logits = None

    # -- used by the executor ----------------------------------------------
    def mark_encoded(self, last_logits: torch.Tensor | None) -> None:
        """Record that the pending entries were just encoded causally (the executor put them in the store)."""
        if self.pending:
            self._record(self.encoded, len(self), self.encoded)
            self.encoded = len(self)
        self.last_logits = last_logits

    def _record(self, start: int, stop: int, anchor: int, continues: bool = False) -> None:
        last = self.chunks[-1] if self.chunks else None
        causal_run = anchor == start and last is not None and last.anchor == last.start
        if last is not None and last.stop == start and (continues or causal_run):
            self.chunks[-1] = Chunk(last.start, stop, last.anchor)
        else:
            self.chunks.append(Chunk(start, stop, anchor))

    def attention_pattern(self) -> torch.Tensor:
        """Boolean ``(length, length)`` matrix: entry ``i`` attended to entry ``j`` when it was encoded.

        Pending entries are shown as they will be encoded (causally). Used by
        tests to check that reading through the cache equals a fresh forward.
        """
        n = len(self)
        pattern = torch.tril(torch.ones(n, n, dtype=torch.bool))
        for c in self.chunks:
            pattern[c.start : c.stop, c.anchor : c.start] = False
        return pattern
