"""A causal LM's output projection, applied only to the rows someone reads.

The decoder feeds many positions per forward (masks of a plan, drafts to
verify) but reads few of them, and often needs only the argmax and its
probability. :class:`LMHead` keeps the projection's weight and computes, for
given hidden states, the full logits (:meth:`LMHead.logits`, what the model's
own head returns) or just per-row statistics without materialising
``(rows, vocab)`` logits (:meth:`LMHead.stats`, fused:
:func:`refusion_kernels.lm_head_stats`).
"""

from __future__ import annotations

import time
from typing import Any

import torch

#: config fields with which a model post-processes its logits (soft-capping, scaling): no separate head then
POSTPROCESSING_FIELDS = (
    "final_logit_softcapping",
    "logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_logits_scaling",
)


class LMHead:
    """``logits = hidden @ weight.T + bias`` for the rows asked, in the weight's dtype.

    ``weight`` has shape ``(vocab, hidden)``, ``bias`` ``(vocab,)`` or ``None``.

    Every projection gives a row the numbers the network's own head gives it
    in a forward of at least :attr:`min_rows` rows: where the backend's
    matrix product picks its kernel by the row count
    (:func:`refusion.probe.probe_rows`: on CPUs float32 rows
    differ between 1, 2-3 and 4 or more), fewer rows are padded with zero
    rows. So the statistics of the rows a decoder reads equal those of the
    plain projection of the whole forward, bit for bit, ties included
    (:mod:`refusion_kernels.lm_head`), whichever path runs.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight
        self.bias = bias
        #: when set (:func:`refusion.measure.costmodel.recording`), counters that record the rows of every pass
        self.counters = None
        #: :class:`refusion.counters.observe` contexts timing the network (they are told of every pass)
        self.observers: list = []

    @property
    def min_rows(self) -> int:
        """Rows a projection is padded to: from there on a row's numbers do not depend on the row count (1 where
        they never do; the probe's answer is cached per process)."""
        from refusion.probe import probe_rows

        found = probe_rows(self.weight.device, self.weight.dtype)
        return found.min_rows or 1

    def _padded(self, hidden: torch.Tensor, *extra: torch.Tensor | None) -> tuple[int, tuple]:
        """``(rows, (hidden, *extra))`` with at least :attr:`min_rows` rows (zero rows, -1 targets appended)."""
        n = hidden.shape[0]
        want = self.min_rows
        if n >= want or n == 0:
            return n, (hidden, *extra)
        pad = [torch.cat((hidden, hidden.new_zeros((want - n, hidden.shape[1]))))]
        pad += [None if e is None else torch.cat((e, e.new_full((want - n,), -1))) for e in extra]
        return n, tuple(pad)

    def _passed(self, rows: int, start: float) -> None:
        if self.counters is not None:
            self.counters.head_pass(rows)
        if self.observers:
            seconds = time.process_time() - start
            for observer in self.observers:
                observer.head_pass(rows, seconds)

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(*hidden.shape[:-1], vocab)``, as the model's own head computes them."""
        start = time.process_time() if self.observers else 0.0  # a slow call on some hosts: only when timed
        flat = hidden.reshape(-1, hidden.shape[-1]).to(self.weight.dtype)
        n, (padded,) = self._padded(flat)
        out = torch.nn.functional.linear(padded, self.weight, self.bias)[:n]
        self._passed(n, start)
        return out.reshape(*hidden.shape[:-1], self.vocab_size)

    def stats(
        self,
        hidden: torch.Tensor,
        exclude: int | None = None,
        temperature: float = 1.0,
        *,
        targets: torch.Tensor | None = None,
        chunk: int | None = None,
        lse: bool = True,
    ):
        """``(tokens, best, lse)`` per row of ``hidden`` ``(n, d)``: argmax id (never ``exclude``), its tempered logit,
        log-sum-exp; with ``targets`` (one id per row, -1 for none) also each target's tempered logit.

        ``chunk``: logits the torch path holds at a time (see :func:`refusion_kernels.lm_head_stats`); ``lse=False``:
        the torch path skips the log-sum-exp (``None`` in its place).
        """
        from refusion_kernels import lm_head_stats

        start = time.process_time() if self.observers else 0.0
        if targets is not None:
            targets = targets.to(device=hidden.device, dtype=torch.long)
        n, (padded, wanted) = self._padded(hidden, targets)
        out = lm_head_stats(padded, self.weight, self.bias, exclude, temperature, targets=wanted, chunk=chunk, lse=lse)
        self._passed(n, start)
        return tuple(None if t is None else t[:n] for t in out)

    def token_logits(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The logit of ``tokens[i]`` at row ``i`` (shape ``(n,)``), as the projection of the row computes it."""
        start = time.process_time() if self.observers else 0.0
        n, (padded,) = self._padded(hidden.to(self.weight.dtype))
        out = torch.nn.functional.linear(padded, self.weight, self.bias)[:n]
        picked = out.gather(-1, tokens.to(out.device).unsqueeze(-1)).squeeze(-1)
        if self.observers:  # a few rows of the head, not a pass: timed, not recorded
            seconds = time.process_time() - start
            for observer in self.observers:
                observer.counters.network_seconds += seconds
        return picked


def find_head(model: Any) -> tuple[Any, LMHead] | None:
    """``(backbone, head)`` of a transformers causal LM whose logits are ``lm_head(backbone(...))``, else ``None``.

    Models that post-process their logits (soft-capping, scaling), that are not
    ``PreTrainedModel`` s, or whose output embedding is not a plain linear layer
    give ``None``; the caller then uses the model's full logits.
    """
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(model, PreTrainedModel):
        return None
    backbone = getattr(model, "base_model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if backbone is None or backbone is model or not isinstance(head, torch.nn.Linear):
        return None
    config = model.config
    for field in POSTPROCESSING_FIELDS:
        value = getattr(config, field, None)
        if value not in (None, 1, 1.0, 0, 0.0):
            return None
    return backbone, LMHead(head.weight, head.bias)
