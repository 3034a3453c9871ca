"""Batch-invariant forwards: a sequence's numbers are the ones it gets alone, whatever else shares the batch.

An engine opened with ``batch_invariant=True`` (the decoder option
:attr:`Decoder.batch_invariant <refusion.decoding.decoder.Decoder>`) keeps an
:class:`Invariance` and runs every forward under it
(:meth:`Engine.run_network <refusion.engines.base.Engine.run_network>`). Three parts of
a forward then stop depending on the other sequences:

* **attention** of packed forwards (the branch engine,
  :func:`refusion.engines.ragged.ragged_attention`): each sequence attends with
  exactly its own queries and exactly its own keys, one call per sequence,
  under an explicit mask (also alone). Padding a sequence's key range to a
  longer one, even with the padding masked, changes the order of the sums in
  the CPU sdpa kernels (bf16, fp16 and fp32 alike); padding its queries changes
  them in fp16 and fp32;
* **linear layers** of forwards that hold several sequences' tokens
  (:class:`RowTiles`): where a backend's result for a row depends on how many
  rows are multiplied with it, rows are multiplied in tiles of exactly
  :attr:`Invariance.tile` rows, the last tile padded with zeros. Whether it
  does is measured, not assumed: :func:`~refusion.probe.probe_rows`
  multiplies a fixed random matrix with 1 to 70 rows once per process,
  device, dtype and thread count (on one AMD EPYC with torch 2.13, float32
  rows differ between 1, 2-3 and 4 or more rows and bfloat16/float16 rows
  never do; on an Intel Xeon with AMX float16 rows differ alone and bfloat16
  rows of 512 inputs or more below 64 rows);
* the **LM head** (:class:`InvariantHead`): rows that
  :func:`~refusion.decoding.scores.project` gathers from several sequences
  into one pass are reduced over the vocabulary in chunks of a fixed width
  (the torch path otherwise narrows its chunks as rows grow), in row tiles
  where linear layers need them;
* **means over the last dimension** (the RMS norms) of forwards that hold
  several sequences' tokens, on GPUs: CUDA's reduction kernels give each row
  more or fewer threads as the number of rows changes (so another order of
  the sums), so there they are taken in tiles of :attr:`Invariance.tile`
  rows too (``reductions``); CPU reductions sum each row alike whatever the
  row count.

Engines whose forwards hold one sequence only (``repeat``, ``canvas``,
``block``: :attr:`Engine.mixes_sequences <refusion.engines.base.Engine>` is
False) are batch-invariant in their forwards already; only their LM-head
passes change. The cost is measured by ``benchmarks/batch_invariant.py``
(docs/batching.md). Knows nothing about decoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from refusion.probe import probe_rows

#: rows per tile of linear layers and LM-head passes, where the row count changes a row's result
ROW_TILE = 8
#: vocabulary chunk of the torch LM-head reduction (one pass up to this many tokens)
HEAD_CHUNK = 32768

_ACTIVE: ContextVar[Invariance | None] = ContextVar("refusion_batch_invariance", default=None)


def rows_depend_on_count(device: Any, dtype: torch.dtype | None) -> bool:
    """Whether a linear layer's result for one row may change with the number of rows multiplied together
    (:func:`probe_rows`; an unknown dtype is assumed to)."""
    return dtype is None or probe_rows(device, dtype).depends


def current() -> Invariance | None:
    """The invariance of the forward running in this thread, or ``None``."""
    return _ACTIVE.get()


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: int) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed in tiles of exactly ``tile`` rows (the last padded with zeros).

    ``x`` has shape ``(..., d)``; every row goes through a matrix product of
    the same shape ``(tile, d) x (d, out)``, so its result does not depend on
    the number of rows of ``x``.
    """
    flat = x.reshape(-1, x.shape[-1])
    out = torch.cat([F.linear(part, weight, bias)[: stop - start] for start, stop, part in _rows(flat, tile)])
    return out[: flat.shape[0]].reshape(*x.shape[:-1], weight.shape[0])


def tiled_mean(x: torch.Tensor, keepdim: bool, tile: int) -> torch.Tensor:
    """``x.mean(-1, keepdim=keepdim)`` computed in tiles of exactly ``tile`` rows (the last padded with zeros).

    ``x`` has shape ``(..., d)``; every row is reduced by the same kernel
    launch shape ``(tile, d)``, so its result does not depend on the number
    of rows of ``x``.
    """
    flat = x.reshape(-1, x.shape[-1])
    out = torch.cat([part.mean(-1)[: stop - start] for start, stop, part in _rows(flat, tile)])[: flat.shape[0]]
    out = out.reshape(x.shape[:-1])
    return out.unsqueeze(-1) if keepdim else out


class RowTiles(TorchFunctionMode):
    """Inside this mode (thread-local), every ``F.linear`` runs in fixed row tiles (:func:`tiled_linear`) and, with
    ``reductions``, every mean over the last dimension too (:func:`tiled_mean`)."""

    def __init__(self, tile: int, reductions: bool = False):
        super().__init__()
        self.tile, self.reductions = tile, reductions

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return tiled_linear(x, weight, bias, self.tile)
        if self.reductions and (func is torch.Tensor.mean or func is torch.mean):
            x = args[0]
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            if (
                isinstance(x, torch.Tensor)
                and x.dim() >= 2
                and dim in (-1, x.dim() - 1, (-1,), [-1])
                and set(kwargs) <= {"dim", "keepdim"}
                and len(args) <= 3
            ):
                return tiled_mean(x, bool(keepdim), self.tile)
        return func(*args, **kwargs)


def _rows(x: torch.Tensor, tile: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(start, stop, padded_tile)`` over the rows of ``x`` ``(n, ...)``, each tile exactly ``tile`` rows."""
    n = x.shape[0]
    for start in range(0, max(n, 1), tile):
        part = x[start : start + tile]
        if part.shape[0] < tile:
            part = torch.cat((part, part.new_zeros((tile - part.shape[0], *part.shape[1:]))))
        yield start, min(n, start + tile), part


class InvariantHead:
    """An LM head (:class:`~refusion.models.head.LMHead`) whose per-row results do not depend on the row count.

    Reductions over the vocabulary use chunks of ``chunk`` tokens whatever
    the number of rows; with ``tile``, rows go through the head in tiles of
    exactly ``tile`` rows. Everything else (``weight``, ``vocab_size``,
    ``counters``, ``observers``, ...) is the wrapped head's.
    """

    def __init__(self, head: Any, tile: int | None, chunk: int = HEAD_CHUNK):
        from refusion.models.head import LMHead

        self.head, self.tile, self.chunk = head, tile, chunk
        self._options = {"chunk": chunk} if isinstance(head, LMHead) else {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.head, name)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full logits ``(*hidden.shape[:-1], vocab)``."""
        if self.tile is None:
            return self.head.logits(hidden)
        flat = hidden.reshape(-1, hidden.shape[-1])
        parts = [self.head.logits(tile)[: stop - start] for start, stop, tile in _rows(flat, self.tile)]
        return torch.cat(parts)[: flat.shape[0]].reshape(*hidden.shape[:-1], -1)

    def stats(
        self,
        hidden: torch.Tensor,
        exclude: int | None = None,
        temperature: float = 1.0,
        *,
        targets: torch.Tensor | None = None,
        lse: bool = True,
    ):
        """``(tokens, best, lse[, picked])`` per row of ``hidden`` ``(n, d)``, as
        :meth:`LMHead.stats <refusion.models.head.LMHead.stats>` (``lse=False``: the log-sum-exp may be ``None``)."""
        if self.tile is None:
            return self.head.stats(hidden, exclude, temperature, targets=targets, lse=lse, **self._options)
        wanted = None
        if targets is not None:
            wanted = torch.full(
                (-(-max(len(targets), 1) // self.tile) * self.tile,), -1, dtype=torch.long, device=targets.device
            )
            wanted[: len(targets)] = targets
        parts = [
            (
                self.head.stats(
                    tile,
                    exclude,
                    temperature,
                    **self._options,
                    targets=None if wanted is None else wanted[start : start + self.tile],
                    lse=lse,
                ),
                stop - start,
            )
            for start, stop, tile in _rows(hidden, self.tile)
        ]
        width = len(parts[0][0])
        return tuple(
            None if parts[0][0][i] is None else torch.cat([out[i][:count] for out, count in parts])[: hidden.shape[0]]
            for i in range(width)
        )

    def token_logits(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The logit of ``tokens[i]`` at row ``i`` (shape ``(n,)``)."""
        if self.tile is None:
            return self.head.token_logits(hidden, tokens)
        padded = torch.zeros(-(-max(len(tokens), 1) // self.tile) * self.tile, dtype=tokens.dtype, device=tokens.device)
        padded[: len(tokens)] = tokens
        parts = [
            self.head.token_logits(tile, padded[start : start + self.tile])[: stop - start]
            for start, stop, tile in _rows(hidden, self.tile)
        ]
        return torch.cat(parts)[: hidden.shape[0]]


class Invariance:
    """What one batch-invariant engine needs: the row tile of its backend and its wrapped LM heads.

    ``tile`` is ``None`` where linear layers give every row the same result
    whatever the row count (:func:`rows_depend_on_count`), else the rows per
    tile; ``reductions``: means over the last dimension are tiled too (GPUs).
    Built by :meth:`for_model` when the engine is opened.
    """

    def __init__(self, tile: int | None, chunk: int = HEAD_CHUNK, reductions: bool = False):
        self.tile, self.chunk, self.reductions = tile, chunk, reductions
        self._heads: dict[int, InvariantHead] = {}
        self._spans: tuple[Any, list[tuple[int, int, int]]] | None = None

    @classmethod
    def for_model(cls, model: Any, tile: int = ROW_TILE) -> Invariance:
        """The invariance for ``model`` (an adapter): tiles unless its device and dtype are measured not to need
        them (:func:`rows_depend_on_count`)."""
        network = getattr(model, "model", None)
        dtype = None
        if isinstance(network, torch.nn.Module):
            dtype = next((p.dtype for p in network.parameters() if p.is_floating_point()), None)
        device = getattr(model, "device", "cpu")
        return cls(
            tile if dtype is None or rows_depend_on_count(device, dtype) else None,
            reductions=torch.device(device).type != "cpu",
        )

    @contextmanager
    def forward(self, mixed: bool) -> Iterator[None]:
        """Run one forward under this invariance (``mixed``: it holds several sequences' tokens)."""
        token = _ACTIVE.set(self)
        try:
            with RowTiles(self.tile, self.reductions) if mixed and self.tile is not None else nullcontext():
                yield
        finally:
            _ACTIVE.reset(token)

    def scores(self, scores: Any) -> Any:
        """``scores`` with its LM head wrapped in an :class:`InvariantHead` (one wrapper per head, so that
        :func:`~refusion.decoding.scores.project` still gathers the rows of all sequences into one pass)."""
        from refusion.decoding.scores import Scores

        head = getattr(scores, "head", None)
        if not isinstance(scores, Scores) or head is None or isinstance(head, InvariantHead):
            return scores
        wrapped = self._heads.get(id(head))
        if wrapped is None or wrapped.head is not head:
            wrapped = self._heads[id(head)] = InvariantHead(head, self.tile, self.chunk)
        return Scores(hidden=scores.hidden, head=wrapped, logits=scores._logits)

    def spans(self, layout: Any) -> list[tuple[int, int, int]]:
        """``(start, stop, keys)`` per row of a packed forward: its queries' slice and how many key columns it owns.

        The packed queries of row ``r`` are consecutive; its keys are the
        columns up to its last query's own column. Computed once per layout.
        """
        if self._spans is not None and self._spans[0] is layout:
            return self._spans[1]
        if layout.rows == 1:
            spans = [(0, layout.n_max, layout.keys)]
        else:
            row_of, col_of = layout.row_of.cpu(), layout.col_of.cpu()
            counts = torch.bincount(row_of, minlength=layout.rows).tolist()
            last = torch.zeros(layout.rows, dtype=torch.long).scatter_reduce(0, row_of, col_of, "amax").tolist()
            spans, start = [], 0
            for count, column in zip(counts, last):
                spans.append((start, start + count, column + 1))
                start += count
        self._spans = (layout, spans)
        return spans
