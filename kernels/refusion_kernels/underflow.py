"""Keep float32 ``exp`` off its slow underflow path in log-sum-exp reductions.

On x86 CPUs torch's vectorised float32 ``exp`` runs about ten times slower
for arguments below about -88 (where the result underflows) than above, and
a language model's logits routinely spread more than 88 below their row
maximum over a 32k-token vocabulary. A term more than :data:`FLOOR` below the
maximum adds at most ``vocab * exp(-FLOOR)`` (about ``1e-30`` for a million
tokens) to a sum that is at least 1, which no float32 or float64 sum can
represent, so raising such logits to ``max - FLOOR`` leaves every
log-sum-exp and softmax probability unchanged while ``exp`` stays fast.
float64 is left alone (its ``exp`` underflows only below -708).
"""

from __future__ import annotations

import torch

FLOOR = 80.0


def floor_for_exp(x: torch.Tensor, row_max: torch.Tensor | None = None, *, inplace: bool = False) -> torch.Tensor:
    """``x`` (``(..., vocab)``) with entries below ``row_max - FLOOR`` raised to it (float64: ``x`` unchanged).

    ``row_max`` (``(...,)``, the row maxima) is computed when not given.
    ``inplace=True`` writes into ``x`` (only for a tensor the caller owns).
    The maxima, the argmax and the log-sum-exp of every row are unchanged.
    """
    if x.dtype == torch.float64 or x.numel() == 0:
        return x
    if row_max is None:
        row_max = x.amax(dim=-1)
    floor = (row_max - FLOOR).unsqueeze(-1)
    return torch.maximum(x, floor, out=x) if inplace else torch.maximum(x, floor)
