"""Fused confidence: per row, the argmax token and its softmax probability, in one pass.

``confidence(logits, temperature=1.0, exclude=None)`` receives logits of shape
``(n, vocab)`` (any float dtype, any strides) and returns ``(tokens, probs)`` of
shape ``(n,)``: ``tokens`` is the argmax over the vocabulary skipping the id
``exclude`` (the mask token), ``probs`` the probability of that token under
``softmax(logits / temperature)`` over the whole vocabulary, in the logits'
dtype. The Triton kernel runs an online softmax over vocabulary blocks, so the
``(n, vocab)`` probability tensor is never materialised. Rows whose logits are
all ``-inf`` give token 0 with probability 0. NaN logits are not supported.
"""

from __future__ import annotations

import torch

from refusion_kernels.backend import choose
from refusion_kernels.underflow import floor_for_exp


def confidence_reference(
    logits: torch.Tensor, temperature: float = 1.0, exclude: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference: same contract as :func:`confidence` (computes in fp32, or fp64 for fp64 logits)."""
    x = (logits if logits.dtype in (torch.float32, torch.float64) else logits.float()) / temperature
    ranked = x if exclude is None else x.index_fill(-1, torch.tensor([exclude], device=x.device), float("-inf"))
    tokens = ranked.argmax(dim=-1)
    lse = torch.logsumexp(floor_for_exp(x), dim=-1)
    best = x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    probs = torch.where(torch.isfinite(lse) & torch.isfinite(best), torch.exp(best - lse), torch.zeros_like(lse))
    return tokens, probs.to(logits.dtype)


def confidence(
    logits: torch.Tensor, temperature: float = 1.0, exclude: int | None = None, *, backend: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax token (never ``exclude``) and its tempered softmax probability per row; see the module docstring."""
    if logits.dim() != 2:
        raise ValueError(f"`logits` must have shape (n, vocab); got {tuple(logits.shape)}.")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0; got {temperature!r}.")
    if choose(logits, backend) == "torch":
        return confidence_reference(logits, temperature, exclude)
    return _confidence_triton(logits, temperature, exclude)


def _confidence_triton(logits, temperature, exclude, block: int | None = None):
    import triton

    from refusion_kernels._triton import confidence_kernel

    n, vocab = logits.shape
    tokens = torch.empty(n, dtype=torch.long, device=logits.device)
    probs = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n == 0:
        return tokens, probs.to(logits.dtype)
    block = block or min(triton.next_power_of_2(vocab), 4096)
    confidence_kernel[(n,)](
        logits,
        logits.stride(0),
        logits.stride(1),
        vocab,
        1.0 / temperature,
        -1 if exclude is None else int(exclude),
        tokens,
        probs,
        BLOCK=block,
    )
    return tokens, probs.to(logits.dtype)
