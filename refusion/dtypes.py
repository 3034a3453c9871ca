"""The dtype rules of refusion's numerics, stated once.

Probabilities, log-sum-exps and confidences are computed in float32 at least,
so a bf16 or fp16 model's scores do not round to ties; a float64 model keeps
float64 (the tests compare against references in float64).
"""

from __future__ import annotations

import torch


def reduction_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype to compute softmaxes and reductions of ``dtype`` logits in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
