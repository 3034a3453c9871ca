"""Fused LM head: per row, argmax token, its logit and the log-sum-exp, without the ``(n, vocab)`` logits.

``lm_head_stats(hidden, weight, bias=None, exclude=None, temperature=1.0)``
receives ``hidden`` of shape ``(n, d)`` and the output projection ``weight``
``(vocab, d)`` (optionally ``bias`` ``(vocab,)``) and returns three ``(n,)``
tensors: ``tokens``, the argmax of ``logits = hidden @ weight.T + bias`` over
the vocabulary skipping the id ``exclude``; ``best``, ``logits[token] /
temperature``; ``lse``, ``logsumexp(logits / temperature)`` over the whole
vocabulary. The greedy confidence is ``exp(best - lse)``; the probability of
any token ``t`` is ``exp(hidden @ weight[t] / temperature - lse)``.

The logits are computed in the weight's dtype (as the model's own head
would: each logit rounded to it) and reduced in float32 (float64 for float64
weights). The torch path walks the vocabulary in chunks, so at most ``n x
chunk`` logits exist at a time; the Triton kernel (CUDA; float64 weights take
the torch path) splits the vocabulary into :data:`SPLIT` -token pieces, one
program per piece and block of :data:`BLOCK_M` rows, never writes logits to
memory, and reduces the pieces in a second, fixed-order pass. Ties go to the
lowest id.
"""

from __future__ import annotations

import torch

from refusion_kernels.backend import choose
from refusion_kernels.underflow import FLOOR, floor_for_exp

#: vocabulary tokens per program of the Triton kernel (a fixed width: a row's sums do not depend on the row count)
SPLIT = 1024
#: rows per program of the Triton kernel
BLOCK_M = 16


def _reduce_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def lm_head_stats_reference(hidden, weight, bias=None, exclude=None, temperature=1.0, *, chunk: int | None = None):
    """The torch path (chunked over the vocabulary); same contract as :func:`lm_head_stats`."""
    n, vocab = hidden.shape[0], weight.shape[0]
    red = _reduce_dtype(weight.dtype)
    if chunk is None:
        chunk = max(1024, (1 << 21) // max(n, 1))  # about 2M logits at a time
    if vocab <= chunk:  # one pass
        x = torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias).to(red)  # owned: edited in place
        if temperature != 1.0:
            x = x / temperature
        if exclude is not None and 0 <= exclude < vocab:
            excluded = x[:, exclude].clone()
            x[:, exclude] = float("-inf")
            best, tokens = x.max(dim=-1)
            x[:, exclude] = excluded
            row_max = torch.maximum(best, excluded)
        else:
            best, tokens = x.max(dim=-1)
            row_max = best
        lse = torch.logsumexp(floor_for_exp(x, row_max, inplace=True), dim=-1)
        return tokens, best, lse
    run_max = torch.full((n,), float("-inf"), dtype=red, device=hidden.device)
    run_sum = torch.zeros(n, dtype=red, device=hidden.device)
    best = torch.full((n,), float("-inf"), dtype=red, device=hidden.device)
    tokens = torch.zeros(n, dtype=torch.long, device=hidden.device)
    h = hidden.to(weight.dtype)
    inv = 1.0 / temperature
    for start in range(0, vocab, chunk):
        stop = min(vocab, start + chunk)
        logits = torch.nn.functional.linear(h, weight[start:stop], None if bias is None else bias[start:stop])
        x = logits.to(red)
        if inv != 1.0:
            x = x * inv
        block_max = x.max(dim=-1).values
        new_max = torch.maximum(run_max, block_max)
        shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
        shifted = x - shift[:, None]
        if red != torch.float64:  # see refusion_kernels.underflow
            shifted.clamp_(min=-FLOOR)
        run_sum = run_sum * torch.exp(run_max - shift) + torch.exp(shifted).sum(-1)
        run_max = new_max
        if exclude is not None and start <= exclude < stop:
            x = x.clone()
            x[:, exclude - start] = float("-inf")
        value, index = x.max(dim=-1)
        better = value > best
        best = torch.where(better, value, best)
        tokens = torch.where(better, index + start, tokens)
    lse = torch.where(run_sum > 0, run_max + torch.log(run_sum), torch.full_like(run_sum, float("-inf")))
    return tokens, best, lse


def lm_head_stats(hidden, weight, bias=None, exclude=None, temperature=1.0, *, backend: str | None = None,
                  chunk: int | None = None):
    """Argmax token, its tempered logit and the tempered log-sum-exp per row; see the module docstring.

    ``chunk`` fixes the vocabulary chunk of the torch path (default: narrower
    as rows grow, about 2M logits at a time); with a fixed chunk a row's
    result does not depend on the number of rows. The Triton kernel reduces
    each row in the same order whatever the row count and ignores it.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"`hidden` (n, d) and `weight` (vocab, d) must agree; got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}.")
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0; got {temperature!r}.")
    wanted = choose(weight, backend)
    if wanted == "torch" or hidden.shape[0] == 0 or (weight.dtype == torch.float64 and backend != "triton"):
        return lm_head_stats_reference(hidden, weight, bias, exclude, temperature, chunk=chunk)
    return _lm_head_triton(hidden, weight, bias, exclude, temperature)


def _lm_head_triton(hidden, weight, bias, exclude, temperature, block_m: int = BLOCK_M, block_v: int = 64,
                    block_d: int = 64, split: int = SPLIT):
    import triton

    from refusion_kernels._triton import lm_head_combine, lm_head_kernel

    n, d = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    h = hidden.to(weight.dtype)
    block_d = min(block_d, max(16, triton.next_power_of_2(d)))
    split = max(block_v, -(-split // block_v) * block_v)
    splits = triton.cdiv(vocab, split)
    part_max, part_sum, part_best = torch.empty(3, splits, n, dtype=torch.float32, device=device)
    part_idx = torch.empty(splits, n, dtype=torch.long, device=device)
    lm_head_kernel[(triton.cdiv(n, block_m), splits)](
        h, weight, bias if bias is not None else weight, part_max, part_sum, part_best, part_idx,
        n, vocab, d, split, h.stride(0), h.stride(1), weight.stride(0), weight.stride(1),
        float(temperature), -1 if exclude is None else int(exclude), bias is not None,
        weight.dtype in (torch.float32, torch.float64), BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_D=block_d,
    )
    tokens = torch.empty(n, dtype=torch.long, device=device)
    best, lse = torch.empty(2, n, dtype=torch.float32, device=device)
    lm_head_combine[(triton.cdiv(n, 64),)](part_max, part_sum, part_best, part_idx, tokens, best, lse, n, splits,
                                           BLOCK=64)
    red = _reduce_dtype(weight.dtype)
    return tokens, best.to(red), lse.to(red)
