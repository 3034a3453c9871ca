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
POSTPROCESSING_FIELDS = ("final_logit_softcapping", "logit_softcapping", "logit_scale", "logits_scaling",
                         "output_logits_scaling")


class LMHead:
    """``logits = hidden @ weight.T + bias`` for the rows asked, in the weight's dtype.

    ``weight`` has shape ``(vocab, hidden)``, ``bias`` ``(vocab,)`` or ``None``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight
        self.bias = bias
        #: when set (:func:`refusion.measure.costmodel.recording`), counters that record the rows of every pass
        self.counters = None
        #: :class:`refusion.decoding.counters.observe` contexts timing the network (they are told of every pass)
        self.observers: list = []

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
        start = time.process_time()
        out = torch.nn.functional.linear(hidden.to(self.weight.dtype), self.weight, self.bias)
        self._passed(hidden.numel() // hidden.shape[-1], start)
        return out

    def stats(self, hidden: torch.Tensor, exclude: int | None = None, temperature: float = 1.0, *,
              chunk: int | None = None):
        """``(tokens, best, lse)`` per row of ``hidden`` ``(n, d)``: argmax id (never ``exclude``), its tempered
        logit, log-sum-exp.

        ``chunk``: a fixed vocabulary chunk for the torch path (see :func:`refusion_kernels.lm_head_stats`).
        """
        from refusion_kernels import lm_head_stats

        start = time.process_time()
        out = lm_head_stats(hidden, self.weight, self.bias, exclude, temperature, chunk=chunk)
        self._passed(hidden.shape[0], start)
        return out

    def token_logits(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The logit of ``tokens[i]`` at row ``i`` (shape ``(n,)``), without the other logits."""
        start = time.process_time() if self.observers else 0.0
        w = self.weight[tokens.to(self.weight.device)]
        out = (hidden.to(self.weight.dtype) * w).sum(-1)
        if self.bias is not None:
            out = out + self.bias[tokens.to(self.bias.device)]
        if self.observers:  # a few rows of the head, not a pass: timed, not recorded
            seconds = time.process_time() - start
            for observer in self.observers:
                observer.counters.network_seconds += seconds
        return out


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
