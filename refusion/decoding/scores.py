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
model), whatever the model's dtype, as ``exp(logit - logsumexp(logits))``
on both paths, so that materialised logits and the fused LM-head statistics
(:mod:`refusion_kernels.lm_head`) give the same numbers, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from refusion.dtypes import reduction_dtype
from refusion_kernels.underflow import floor_for_exp


class Scores:
    """Outputs at ``n`` rows (leading shape ``shape``); see the module docstring.

    Build with ``Scores(hidden=h, head=head)`` (``h`` of shape ``(..., d)``) or
    ``Scores(logits=x)`` (``x`` of shape ``(..., vocab)``).
    """

    __slots__ = ("hidden", "head", "_logits", "_stats", "_view")

    def __init__(self, hidden: torch.Tensor | None = None, head: Any = None, logits: torch.Tensor | None = None):
        if logits is None and (hidden is None or head is None):
            raise ValueError("Scores need `logits` or both `hidden` and `head`")
        self.hidden: Any = hidden  # (..., d), or None when built from logits
        self.head = head
        self._logits = logits
        self._stats: _StatsCache | None = None  # argmax statistics of some rows, computed in a batch
        self._view: tuple[_StatsCache | None, Any] | None = None  # (a parent's statistics, our rows), cut when read

    @property
    def _cache(self) -> _StatsCache | None:
        if self._view is not None:
            parent, index = self._view
            self._stats, self._view = (parent.subset(index) if parent is not None else None), None
        return self._stats

    @_cache.setter
    def _cache(self, value: _StatsCache | None) -> None:
        self._stats, self._view = value, None

    @staticmethod
    def of(value: Scores | torch.Tensor) -> Scores:
        """``value`` as Scores (a logits tensor is wrapped)."""
        return value if isinstance(value, Scores) else Scores(logits=value)

    @staticmethod
    def cat(parts: list[Scores]) -> Scores:
        """The rows of ``parts`` one after another (hidden states when they share one head, else logits)."""
        if len(parts) == 1:
            return parts[0]
        head = parts[0].head
        if all(p.hidden is not None and p._logits is None and p.head is head for p in parts):
            return Scores(hidden=torch.cat([p.hidden for p in parts]), head=head)
        return Scores(logits=torch.cat([p.logits for p in parts]))

    @property
    def shape(self) -> tuple[int, ...]:
        source: Any = self.hidden if self.hidden is not None else self._logits
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

    def __getitem__(self, index: Any) -> Scores:
        if self._logits is not None:
            out = Scores(self.hidden[index] if self.hidden is not None else None, self.head, self._logits[index])
        else:
            out = Scores(self.hidden[index], self.head)
        if self.projected:
            out._view = (self._cache, index)
        return out

    @property
    def projected(self) -> bool:
        """Whether some rows' argmax statistics are cached (by :func:`project`, or a parent's)."""
        return self._stats is not None or self._view is not None

    @property
    def batchable(self) -> bool:
        """Rows can be projected together with other Scores' rows (hidden states plus a head)."""
        return self._logits is None and self.hidden is not None and self.hidden.dim() == 2

    def cached_stats(self, exclude: int | None):
        """``(tokens, best, lse)`` of every row if a batched projection computed them, else ``None``."""
        cache = self._cache
        if cache is None or cache.exclude != exclude or not cache.all_known():
            return None
        return cache.tokens, cache.best, cache.lse

    def stats(self, exclude: int | None = None, temperature: float = 1.0, *, lse: bool = True):
        """``(tokens, best, lse)`` of 1-D rows: argmax id (never ``exclude``), its tempered logit, log-sum-exp
        (``lse=False``: not computed where it is not known already, ``None`` then)."""
        if temperature == 1.0:
            cached = self.cached_stats(exclude)
            if cached is not None:
                return cached
        if self._logits is None:
            return self.head.stats(self.hidden, exclude, temperature, lse=lse)
        x = self._logits.to(reduction_dtype(self._logits.dtype))
        if temperature != 1.0:
            x = x / temperature
        total = torch.logsumexp(floor_for_exp(x), dim=-1) if lse else None
        ranked = x if exclude is None else x.index_fill(-1, torch.tensor([exclude], device=x.device), float("-inf"))
        best, tokens = ranked.max(dim=-1)
        return tokens, best, total

    def argmax(self, exclude: int | None = None) -> torch.Tensor:
        """The argmax id of 1-D rows (never ``exclude``): the ``tokens`` of :meth:`stats`, without the log-sum-exp."""
        return self.stats(exclude, lse=False)[0]

    def read(self, exclude: int | None, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One pass over 1-D rows: argmax id (never ``exclude``), its probability, and the probability of
        ``targets[i]`` at row ``i`` (``-1``: none; its value is then meaningless), as :meth:`greedy` and
        :meth:`probability` compute them."""
        if self._logits is None:
            tokens, best, lse, picked = self.head.stats(self.hidden, exclude, targets=targets)
        else:
            tokens, best, lse = self.stats(exclude)
            picked = self._logits.gather(-1, targets.to(self._logits.device).clamp(min=0).unsqueeze(-1)).squeeze(-1)
            picked = picked.to(lse.dtype)  # the same value as gathered from the logits in the reduction dtype
        return tokens, torch.exp(best - lse).nan_to_num_(0.0), torch.exp(picked - lse)

    def greedy(self, exclude: int | None = None, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Argmax token (never ``exclude``) and its probability under ``softmax(logits / temperature)``."""
        cache = self._cache
        if temperature == 1.0 and cache is not None and cache.exclude == exclude and cache.all_known():
            return cache.tokens, cache.prob
        tokens, best, lse = self.stats(exclude, temperature)
        return tokens, torch.exp(best - lse).nan_to_num_(0.0)

    def probability(self, tokens: torch.Tensor) -> torch.Tensor:
        """Softmax probability of ``tokens[i]`` at row ``i`` (shape ``(n,)``)."""
        if self._logits is None:
            cache = self._cache
            if cache is not None and cache.targets_are(tokens):  # projected with the rows: nothing to compute
                return cache.target_prob
            if cache is not None and cache.all_known():
                lse = cache.lse.to(self.hidden.device)
                picked = self.head.token_logits(self.hidden, tokens).to(lse.dtype)
            else:  # one pass: the tokens' logits from the same projection as the log-sum-exp
                _, _, lse, picked = self.head.stats(self.hidden, targets=tokens)
            return torch.exp(picked - lse)
        x = self._logits.to(reduction_dtype(self._logits.dtype))
        picked = x.gather(-1, tokens.to(x.device).unsqueeze(-1)).squeeze(-1)
        return torch.exp(picked - torch.logsumexp(floor_for_exp(x), dim=-1))  # as the fused path computes it


class _StatsCache:
    """Argmax statistics of the rows of one Scores, for one ``exclude``, held on the host.

    ``known`` marks the rows computed; ``tokens``, ``best``, ``lse`` and
    ``prob`` (the argmax's softmax probability) are host tensors, copied from
    the device once per batched projection for all sequences together, so
    that reading them never waits on the device. ``target`` (-1 where none)
    and ``target_prob`` hold the probability of one given token per row, when
    the projection was told which (:func:`project`'s ``targets``).
    """

    __slots__ = ("exclude", "known", "tokens", "best", "lse", "prob", "target", "target_prob")

    def __init__(self, exclude, known, tokens, best, lse, prob, target, target_prob):
        self.exclude, self.known, self.tokens, self.best, self.lse, self.prob = exclude, known, tokens, best, lse, prob
        self.target, self.target_prob = target, target_prob

    @classmethod
    def empty(cls, exclude: int | None, n: int, dtype: torch.dtype) -> _StatsCache:
        floats, ids = torch.zeros(4, n, dtype=dtype), torch.full((2, n), -1, dtype=torch.long)
        return cls(
            exclude, torch.zeros(n, dtype=torch.bool), ids[0], floats[0], floats[1], floats[2], ids[1], floats[3]
        )

    def subset(self, index: Any) -> _StatsCache:
        if isinstance(index, torch.Tensor):
            index = index.cpu()
        return _StatsCache(
            self.exclude,
            self.known[index],
            self.tokens[index],
            self.best[index],
            self.lse[index],
            self.prob[index],
            self.target[index],
            self.target_prob[index],
        )

    def all_known(self, index: Any = None) -> bool:
        known = self.known if index is None else self.known[index]
        return bool(known.all())

    def targets_are(self, tokens: torch.Tensor) -> bool:
        """Every row was projected with ``tokens[i]`` as its target."""
        return (
            tokens.shape == self.target.shape
            and tokens.device.type == "cpu"
            and bool((self.target == tokens).all())
            and self.all_known()
        )


def project(requests: list[tuple], exclude: int | None) -> None:
    """Compute argmax statistics for ``rows`` of each ``Scores`` in as few fused LM-head passes as possible.

    ``requests`` holds ``(scores, rows)`` or ``(scores, rows, fed)`` items;
    ``fed`` (the token ids fed at the rows of ``scores``, on the host) also
    gives each row's probability of the token fed after it (what verifying a
    draft asks ``scores.probability`` for). Rows of Scores that share a head are
    concatenated into one pass (one read of the head's weight for many
    sequences), and the results come to the host in one copy per pass,
    whatever the number of sequences; they are cached on each Scores, so
    that a later ``greedy()``, ``stats()`` or ``probability()`` of those rows
    computes (and waits for) nothing. Materialised or logits-only Scores are
    left alone (they are cheap to reduce on their own).
    """
    groups: dict[int, list[tuple[Scores, Any, Any]]] = {}
    for request in requests:
        scores, rows = request[0], request[1]
        fed = request[2] if len(request) > 2 else None
        if not scores.batchable:
            continue
        n = scores.hidden.shape[0]
        cache = scores._cache
        fresh = cache is None or cache.exclude != exclude
        if isinstance(rows, slice) and fresh:
            start, stop, step = rows.indices(n)
            if step == 1:  # a contiguous range of a Scores with nothing cached: no index needed
                if stop > start:
                    groups.setdefault(id(scores.head), []).append((scores, slice(start, stop), fed))
                continue
        index = torch.arange(n)[rows] if not isinstance(rows, torch.Tensor) else rows.cpu()
        if not fresh:
            index = index[~cache.known[index]]
        if len(index):
            groups.setdefault(id(scores.head), []).append((scores, index, fed))
    for items in groups.values():
        _project_group(items, exclude)


def _project_group(items: list[tuple[Scores, Any, Any]], exclude: int | None) -> None:
    """One LM-head pass for the rows of Scores sharing a head; one copy of the results to the host."""
    head = items[0][0].head
    device = items[0][0].hidden.device
    on_device = [index if isinstance(index, slice) else index.to(device) for _, index, _ in items]
    hidden = (
        torch.cat([s.hidden[i] for (s, _, _), i in zip(items, on_device)])
        if len(items) > 1
        else items[0][0].hidden[on_device[0]]
    )
    targets = None
    if any(fed is not None for _, _, fed in items):
        wanted = [_next_fed(fed, index) for _, index, fed in items]
        targets = torch.cat(wanted) if len(wanted) > 1 else wanted[0]
        tokens, best, lse, picked = _to_host(*head.stats(hidden, exclude, targets=targets))
        target_prob = torch.exp(picked - lse)
    else:
        tokens, best, lse = _to_host(*head.stats(hidden, exclude))
    prob = torch.exp(best - lse).nan_to_num_(0.0)
    start = 0
    for scores, index, _ in items:
        stop = start + _count(index)
        cache = scores._cache
        n = scores.hidden.shape[0]
        if (cache is None or cache.exclude != exclude) and stop - start == n:  # every row at once: views, no copies
            cache = scores._cache = _StatsCache(
                exclude,
                torch.ones(n, dtype=torch.bool),
                tokens[start:stop],
                best[start:stop],
                lse[start:stop],
                prob[start:stop],
                targets[start:stop] if targets is not None else torch.full((n,), -1, dtype=torch.long),
                target_prob[start:stop] if targets is not None else torch.zeros(n, dtype=prob.dtype),
            )
        else:
            if cache is None or cache.exclude != exclude:
                cache = scores._cache = _StatsCache.empty(exclude, n, best.dtype)
            cache.known[index] = True
            cache.tokens[index] = tokens[start:stop]
            cache.best[index] = best[start:stop]
            cache.lse[index] = lse[start:stop]
            cache.prob[index] = prob[start:stop]
            if targets is not None:
                cache.target[index] = targets[start:stop]
                cache.target_prob[index] = target_prob[start:stop]
        start = stop


def _to_host(tokens: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Token ids and float statistics of one pass on the host: one copy (one wait) from a device; on the CPU
    they are there already (each ``cpu()`` returns the tensor itself)."""
    if tokens.device.type == "cpu":
        return (tokens.cpu(), *(v.cpu() for v in values))
    dtype = values[0].dtype
    host = torch.stack((tokens.to(torch.float64), *(v.to(torch.float64) for v in values))).cpu()
    return (host[0].long(), *(row.to(dtype) for row in host[1:]))


def _next_fed(fed: torch.Tensor | None, index: Any) -> torch.Tensor:
    """The token fed after each row of ``index`` (-1 after the last row, or when ``fed`` is unknown)."""
    if fed is not None and isinstance(index, slice) and index.stop < len(fed):
        return fed[index.start + 1 : index.stop + 1]
    if fed is None:
        return torch.full((_count(index),), -1, dtype=torch.long)
    return torch.cat((fed[1:], torch.tensor([-1])))[index]


def _count(index: Any) -> int:
    return index.stop - index.start if isinstance(index, slice) else len(index)
