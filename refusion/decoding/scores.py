"""The model's output at some fed positions, projected to the vocabulary only when and where asked.

A :class:`Scores` holds either the hidden states before the LM head (plus the
head) or, for models without a separate head, the logits themselves. Parts
read what they need:

* ``scores.logits`` - full ``(n, vocab)`` logits (materialised on first use);
* ``scores.greedy(exclude=...)`` - argmax token and its softmax probability
  per row, fused (no ``(n, vocab)`` tensor);
* ``scores.probability(tokens)`` - softmax probability of given tokens;
* ``scores[rows]`` - the same for a subset of rows, computing nothing.

Probabilities are computed in float32 at least (float64 for a float64
model), whatever the model's dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from refusion_kernels.underflow import floor_for_exp


def _reduce_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class Scores:
    """Outputs at ``n`` rows (leading shape ``shape``); see the module docstring.

    Build with ``Scores(hidden=h, head=head)`` (``h`` of shape ``(..., d)``) or
    ``Scores(logits=x)`` (``x`` of shape ``(..., vocab)``).
    """

    __slots__ = ("hidden", "head", "_logits", "_cache")

    def __init__(self, hidden: torch.Tensor | None = None, head: Any = None, logits: torch.Tensor | None = None):
        if logits is None and (hidden is None or head is None):
            raise ValueError("Scores need `logits` or both `hidden` and `head`")
        self.hidden = hidden
        self.head = head
        self._logits = logits
        self._cache: _StatsCache | None = None  # argmax statistics of some rows, computed in a batch

    @staticmethod
    def of(value: "Scores | torch.Tensor") -> "Scores":
        """``value`` as Scores (a logits tensor is wrapped)."""
        return value if isinstance(value, Scores) else Scores(logits=value)

    @property
    def shape(self) -> tuple[int, ...]:
        source = self.hidden if self.hidden is not None else self._logits
        return tuple(source.shape[:-1])

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def materialised(self) -> bool:
        return self._logits is not None

    @property
    def logits(self) -> torch.Tensor:
        """Full logits, shape ``(*shape, vocab)``, in the model's dtype."""
        if self._logits is None:
            self._logits = self.head.logits(self.hidden)
        return self._logits

    def __getitem__(self, index: Any) -> "Scores":
        if self._logits is not None:
            out = Scores(self.hidden[index] if self.hidden is not None else None, self.head, self._logits[index])
        else:
            out = Scores(self.hidden[index], self.head)
        if self._cache is not None:
            out._cache = self._cache.subset(index)
        return out

    @property
    def batchable(self) -> bool:
        """Rows can be projected together with other Scores' rows (hidden states plus a head)."""
        return self._logits is None and self.hidden is not None and self.hidden.dim() == 2

    def cached_stats(self, exclude: int | None):
        """``(tokens, best, lse)`` of every row if a batched projection computed them, else ``None``."""
        cache = self._cache
        if cache is None or cache.exclude != exclude or not bool(cache.known.all()):
            return None
        return cache.tokens, cache.best, cache.lse

    def stats(self, exclude: int | None = None, temperature: float = 1.0):
        """``(tokens, best, lse)`` of 1-D rows: argmax id (never ``exclude``), its tempered logit, log-sum-exp."""
        if temperature == 1.0:
            cached = self.cached_stats(exclude)
            if cached is not None:
                return cached
        if self._logits is None:
            return self.head.stats(self.hidden, exclude, temperature)
        x = self._logits.to(_reduce_dtype(self._logits.dtype))
        if temperature != 1.0:
            x = x / temperature
        lse = torch.logsumexp(floor_for_exp(x), dim=-1)
        ranked = x if exclude is None else x.index_fill(-1, torch.tensor([exclude], device=x.device), float("-inf"))
        best, tokens = ranked.max(dim=-1)
        return tokens, best, lse

    def greedy(self, exclude: int | None = None, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Argmax token (never ``exclude``) and its probability under ``softmax(logits / temperature)``."""
        tokens, best, lse = self.stats(exclude, temperature)
        return tokens, torch.exp(best - lse).nan_to_num_(0.0)

    def probability(self, tokens: torch.Tensor) -> torch.Tensor:
        """Softmax probability of ``tokens[i]`` at row ``i`` (shape ``(n,)``)."""
        if self._logits is None:
            cache = self._cache
            if cache is not None and bool(cache.known.all()):
                lse = cache.lse
            else:
                _, _, lse = self.head.stats(self.hidden)
            picked = self.head.token_logits(self.hidden, tokens).to(lse.dtype)
            return torch.exp(picked - lse)
        x = floor_for_exp(self._logits.to(_reduce_dtype(self._logits.dtype)))
        return torch.softmax(x, dim=-1).gather(-1, tokens.to(x.device).unsqueeze(-1)).squeeze(-1)


class _StatsCache:
    """Argmax statistics of the rows of one Scores (``known`` marks the rows computed), for one ``exclude``."""

    __slots__ = ("exclude", "known", "tokens", "best", "lse")

    def __init__(self, exclude, known, tokens, best, lse):
        self.exclude, self.known, self.tokens, self.best, self.lse = exclude, known, tokens, best, lse

    def subset(self, index: Any) -> "_StatsCache":
        return _StatsCache(self.exclude, self.known[index], self.tokens[index], self.best[index], self.lse[index])


def project(requests: list[tuple[Scores, Any]], exclude: int | None) -> None:
    """Compute argmax statistics for ``rows`` of each ``Scores`` in as few fused LM-head passes as possible.

    Rows of Scores that share a head are concatenated into one pass (one read
    of the head's weight for many sequences); the results are cached on each
    Scores, so that a later ``greedy()``, ``stats()`` or ``probability()`` of
    those rows computes nothing. Materialised or logits-only Scores are left
    alone (they are cheap to reduce on their own).
    """
    groups: dict[int, list[tuple[Scores, torch.Tensor]]] = {}
    for scores, rows in requests:
        if not scores.batchable:
            continue
        n = scores.hidden.shape[0]
        index = torch.arange(n)[rows] if not isinstance(rows, torch.Tensor) else rows
        cache = scores._cache
        if cache is not None and cache.exclude == exclude:
            index = index[~cache.known[index]]
        if len(index):
            groups.setdefault(id(scores.head), []).append((scores, index))
    for items in groups.values():
        head = items[0][0].head
        hidden = torch.cat([s.hidden[i] for s, i in items]) if len(items) > 1 else items[0][0].hidden[items[0][1]]
        tokens, best, lse = head.stats(hidden, exclude)
        start = 0
        for scores, index in items:
            stop = start + len(index)
            cache = scores._cache
            if cache is None or cache.exclude != exclude:
                n = scores.hidden.shape[0]
                cache = _StatsCache(exclude, torch.zeros(n, dtype=torch.bool, device=tokens.device),
                                    torch.zeros(n, dtype=torch.long, device=tokens.device),
                                    torch.zeros(n, dtype=best.dtype, device=best.device),
                                    torch.zeros(n, dtype=lse.dtype, device=lse.device))
                scores._cache = cache
            index = index.to(tokens.device)
            cache.known[index] = True
            cache.tokens[index] = tokens[start:stop]
            cache.best[index] = best[start:stop]
            cache.lse[index] = lse[start:stop]
            start = stop
