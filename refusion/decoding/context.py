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

Who may do what: engines encode pending entries (:meth:`SequenceCache.mark_encoded`)
and read everything; a cache reorderer gets a :class:`CacheEditor`, which
allows exactly :meth:`~CacheEditor.append` and :meth:`~CacheEditor.invalidate`.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from refusion.decoding.protocol import KVSegment
from refusion.decoding.scores import Scores


def _one_row(value: Scores | torch.Tensor | None) -> Scores | None:
    """One-row Scores from ``(vocab,)`` logits, one-row Scores or a single-row slice of Scores."""
    if value is None:
        return None
    if isinstance(value, Scores):
        return value[None] if value.shape == () else value
    return Scores(logits=value.reshape(1, -1))


@attrs.frozen
class Chunk:
    """Entries ``start:stop`` were encoded attending to ``0:anchor`` and causally to themselves."""

    start: int
    stop: int
    anchor: int


class SequenceCache:
    """Context tokens, positions and keys/values of one sequence.

    ``store`` holds the keys/values of the first ``encoded`` entries; entries
    ``encoded:length`` are pending. Reorderers change it through a
    :class:`CacheEditor`, engines through :meth:`mark_encoded`.
    """

    def __init__(self, store: Any, tokens: torch.Tensor, positions: torch.Tensor):
        self.store = store
        self.tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        self.positions = torch.as_tensor(positions, dtype=torch.long).flatten()
        self.encoded = 0
        self.chunks: list[Chunk] = []
        #: the model's output at the last entry in cache order (it predicts the token after it), when known:
        #: a one-row :class:`~refusion.decoding.scores.Scores`.
        self.last_scores: Scores | None = None

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

    # -- used by reorderers, through a CacheEditor ------------------------------
    def append(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        kv: KVSegment | None = None,
        *,
        anchor: int | None = None,
        continues: bool = False,
        last_logits: torch.Tensor | Scores | None = None,
    ) -> None:
        """Append tokens in cache order.

        ``kv`` may cover all of ``tokens`` or a prefix of them; the rest (and
        everything appended once any entry is pending) becomes pending.
        ``anchor`` is the cache length the keys/values were computed against
        (default: the current length, i.e. plain causal); ``continues`` says
        they were computed after the previously appended run, as one chain
        (e.g. drafts verified concatenated). ``last_logits`` are
        the model's output (logits or one-row Scores) at the last appended token, if the caller has them.
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
        if covered and kv is not None:
            self.store.append(kv[:covered])
            self.encoded += covered
            self._record(start, start + covered, start if anchor is None else anchor, continues)
        self.tokens = torch.cat((self.tokens, tokens.to(self.tokens.device)))
        self.positions = torch.cat((self.positions, positions.to(self.positions.device)))
        self.last_scores = _one_row(last_logits) if covered == n else None

    def invalidate(self, start: int = 0) -> None:
        """Drop keys/values from entry ``start`` on; those entries become pending."""
        if not 0 <= start <= len(self):
            raise ValueError(f"`start` must be in [0, {len(self)}]; got {start}.")
        if start < self.encoded:
            self.store.truncate(start)
            self.encoded = start
            self.chunks = [
                c if c.stop <= start else Chunk(c.start, start, c.anchor) for c in self.chunks if c.start < start
            ]
        self.last_scores = None

    # -- used by engines -------------------------------------------------------
    def reuse(self, n: int) -> None:
        """Record that the first ``n`` pending entries' keys/values were put in the store from an earlier request's
        (a cached prefix: they were encoded causally, as :meth:`mark_encoded` would encode them). Only before
        anything is encoded, and never all entries (the last one's output is computed by the next call)."""
        if self.encoded or not 0 <= n < len(self):
            raise ValueError(f"a reused prefix must precede everything encoded and leave an entry; got {n}")
        if n:
            self._record(0, n, 0)
            self.encoded = n

    def mark_encoded(self, last_scores: Scores | torch.Tensor | None) -> None:
        """Record that the pending entries were just encoded causally (the engine put them in the store).

        ``last_scores``: the model's output at the last entry (logits of shape
        ``(vocab,)`` or one-row Scores).
        """
        if self.pending:
            self._record(self.encoded, len(self), self.encoded)
            self.encoded = len(self)
        self.last_scores = _one_row(last_scores)

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


class CacheEditor:
    """What a cache reorderer may do to a sequence's context: append and invalidate, nothing else.

    Reads (``len``, ``tokens``, ``positions``, ``encoded``, ``pending``,
    ``last_position``) see the underlying :class:`SequenceCache`; the only
    writes are :meth:`append` (each committed token exactly once) and
    :meth:`invalidate` (drop keys/values so the next call re-encodes them).
    It counts what was done through it: ``appended`` entries, of which
    ``appended_kv`` came with their keys/values, and ``invalidated`` entries
    whose keys/values were dropped (read by the decoder's trace).
    """

    __slots__ = ("_cache", "appended", "appended_kv", "invalidated")

    def __init__(self, cache: SequenceCache):
        self._cache = cache
        self.appended = self.appended_kv = self.invalidated = 0

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def tokens(self) -> torch.Tensor:
        return self._cache.tokens

    @property
    def positions(self) -> torch.Tensor:
        return self._cache.positions

    @property
    def encoded(self) -> int:
        return self._cache.encoded

    @property
    def pending(self) -> int:
        return self._cache.pending

    @property
    def last_position(self) -> int:
        return self._cache.last_position

    def append(
        self,
        tokens,
        positions,
        kv: KVSegment | None = None,
        *,
        anchor: int | None = None,
        continues: bool = False,
        last_logits: torch.Tensor | Scores | None = None,
    ) -> None:
        """See :meth:`SequenceCache.append`."""
        length, encoded = len(self._cache), self._cache.encoded
        self._cache.append(tokens, positions, kv, anchor=anchor, continues=continues, last_logits=last_logits)
        self.appended += len(self._cache) - length
        self.appended_kv += self._cache.encoded - encoded

    def invalidate(self, start: int = 0) -> None:
        """See :meth:`SequenceCache.invalidate`."""
        encoded = self._cache.encoded
        self._cache.invalidate(start)
        self.invalidated += encoded - self._cache.encoded
