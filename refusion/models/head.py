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
        #: when set (:func:`refusion.measure.costmodel.recording`), the rows of every pass are appended here
        self.shape_log = None

    @property
    def vocab_size(self) -> int:
        return self.weight.shape[0]

    @property
    def reduce_dtype(self) -> torch.dtype:
        """The dtype of probabilities and log-sum-exps: float32, or float64 for a float64 model."""
        return torch.float64 if self.weight.dtype == torch.float64 else torch.float32

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(*hidden.shape[:-1], vocab)``, as the model's own head computes them."""
        if self.shape_log is not None:
            self.shape_log.head_passes.append(hidden.numel() // hidden.shape[-1])
        return torch.nn.functional.linear(hidden.to(self.weight.dtype), self.weight, self.bias)

    def stats(self, hidden: torch.Tensor, exclude: int | None = None, temperature: float = 1.0):
        """``(tokens, best, lse)`` per row of ``hidden`` ``(n, d)``: argmax id (never ``exclude``), its tempered logit, log-sum-exp."""
        from refusion_kernels import lm_head_stats

        if self.shape_log is not None:
            self.shape_log.head_passes.append(hidden.shape[0])
        return lm_head_stats(hidden, self.weight, self.bias, exclude, temperature)

    def token_logits(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The logit of ``tokens[i]`` at row ``i`` (shape ``(n,)``), without the other logits."""
        w = self.weight[tokens.to(self.weight.device)]
        out = (hidden.to(self.weight.dtype) * w).sum(-1)
        if self.bias is not None:
            out = out + self.bias[tokens.to(self.bias.device)]
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
