"""Fused LM head: per row, argmax token, its logit and the log-sum-exp, without the ``(n, vocab)`` logits.

``lm_head_stats(hidden, weight, bias=None, exclude=None, temperature=1.0, targets=None)``
receives ``hidden`` of shape ``(n, d)`` and the output projection ``weight``
``(vocab, d)`` (optionally ``bias`` ``(vocab,)``) and returns three ``(n,)``
tensors: ``tokens``, the argmax of ``logits = hidden @ weight.T + bias`` over
the vocabulary skipping the id ``exclude``; ``best``, ``logits[token] /
temperature``; ``lse``, ``logsumexp(logits / temperature)`` over the whole
vocabulary; with ``targets`` (``(n,)`` token ids, -1 for none) a fourth,
``logits[target] / temperature`` (0 where the target is -1). The greedy
confidence is ``exp(best - lse)``.

Every number is the one the plain path computes from the materialised
logits of the same rows (``Scores.stats`` of ``F.linear(hidden, weight,
bias)``): the logits are rounded to the weight's dtype, as the model's own
head returns them, then reduced in float32 (float64 for float64 weights),
dividing by ``temperature``; ties go to the lowest id. The torch path
projects rows in groups (at most ``chunk`` logits, about 2M, at a time),
each over the whole vocabulary, the last group padded with zero rows to the
group's size, so each row is reduced exactly as its materialised logits
would be. The Triton kernel (CUDA; float64 weights take the torch path)
splits the vocabulary into :data:`SPLIT`-token pieces, one program per piece
and block of :data:`BLOCK_M` rows, never writes logits to memory, rounds each
logit to the weight's dtype and multiplies float32 weights in IEEE float32
(not TF32), and reduces the pieces in a second, fixed-order pass; its dot
products are summed in another order than cuBLAS's, so its logits may differ
from the plain path's in the last bit before rounding (in bfloat16/float16
that rarely survives the rounding).
"""

from __future__ import annotations

import torch

from refusion_kernels.backend import choose
from refusion_kernels.underflow import floor_for_exp

#: logits computed at a time by the torch path (rows x vocabulary)
CHUNK = 1 << 21
#: vocabulary tokens per program of the Triton kernel (a fixed width: a row's sums do not depend on the row count)
SPLIT = 1024
#: rows per program of the Triton kernel
BLOCK_M = 16


def _reduce_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _reduce(x: torch.Tensor, exclude, temperature, targets, lse: bool = True):
    """The statistics of logits ``x`` (``(n, vocab)``, owned: edited in place), as ``Scores.stats`` computes them
    (``lse=False``: the argmax and its logit only, the third entry ``None``)."""
    vocab = x.shape[-1]
    x = x.to(_reduce_dtype(x.dtype))
    if temperature != 1.0:
        x = x / temperature
    picked = None
    if targets is not None:
        picked = x.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1).masked_fill(targets < 0, 0.0)
    if exclude is not None and 0 <= exclude < vocab:
        excluded = x[:, exclude].clone()
        x[:, exclude] = float("-inf")
        best, tokens = x.max(dim=-1)
        x[:, exclude] = excluded
    else:
        best, tokens = x.max(dim=-1)
    total = torch.logsumexp(floor_for_exp(x, inplace=True), dim=-1) if lse else None
    return (tokens, best, total) if targets is None else (tokens, best, total, picked)


def lm_head_stats_reference(
    hidden, weight, bias=None, exclude=None, temperature=1.0, *, targets=None, chunk: int | None = None, lse=True
):
    """The torch path: rows projected in groups of at most ``chunk`` logits, each over the whole vocabulary; same
    contract as :func:`lm_head_stats` (``lse=False``: no log-sum-exp is computed, its entry is ``None``)."""
    n, vocab = hidden.shape[0], weight.shape[0]
    h = hidden.to(weight.dtype)
    group = max(8, (chunk or CHUNK) // max(vocab, 1))
    if n <= group:  # one projection of exactly these rows
        return _reduce(torch.nn.functional.linear(h, weight, bias), exclude, temperature, targets, lse)
    parts = []
    for start in range(0, n, group):
        rows = h[start : start + group]
        count = rows.shape[0]
        if count < group:  # every projection has the same number of rows
            rows = torch.cat((rows, rows.new_zeros((group - count, rows.shape[1]))))
        wanted = None if targets is None else targets[start : start + group]
        if wanted is not None and count < group:
            wanted = torch.cat((wanted, wanted.new_full((group - count,), -1)))
        out = _reduce(torch.nn.functional.linear(rows, weight, bias), exclude, temperature, wanted, lse)
        parts.append(tuple(None if t is None else t[:count] for t in out))
    return tuple(None if column[0] is None else torch.cat(column) for column in zip(*parts))


def lm_head_stats(
    hidden,
    weight,
    bias=None,
    exclude=None,
    temperature=1.0,
    *,
    targets=None,
    backend: str | None = None,
    chunk: int | None = None,
    lse: bool = True,
):
    """Argmax token, its tempered logit and the tempered log-sum-exp per row (and the targets' tempered logits when
    ``targets`` is given); see the module docstring.

    ``chunk`` bounds the logits the torch path holds at a time (default
    :data:`CHUNK`); a row's result does not depend on it, nor on the number
    of rows (given a matrix product whose rows do not depend on it, see
    ``refusion.engines.invariant.probe_rows``). The Triton kernel reduces
    each row in the same order whatever the row count and ignores it.
    ``lse=False`` lets the torch path skip the log-sum-exp (its entry is then
    ``None``; the Triton kernel computes it anyway).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"`hidden` (n, d) and `weight` (vocab, d) must agree; got {tuple(hidden.shape)} and {tuple(weight.shape)}."
        )
    if not temperature > 0:
        raise ValueError(f"`temperature` must be > 0; got {temperature!r}.")
    if targets is not None and (targets.dim() != 1 or targets.shape[0] != hidden.shape[0]):
        raise ValueError(f"`targets` must hold one token id per row ({hidden.shape[0]}); got {tuple(targets.shape)}.")
    wanted = choose(weight, backend)
    if wanted == "torch" or hidden.shape[0] == 0 or (weight.dtype == torch.float64 and backend != "triton"):
        return lm_head_stats_reference(
            hidden, weight, bias, exclude, temperature, targets=targets, chunk=chunk, lse=lse
        )
    return _lm_head_triton(hidden, weight, bias, exclude, temperature, targets)


def _lm_head_triton(
    hidden,
    weight,
    bias,
    exclude,
    temperature,
    targets=None,
    block_m: int = BLOCK_M,
    block_v: int = 64,
    block_d: int = 64,
    split: int = SPLIT,
):
    import triton

    from refusion_kernels._triton import lm_head_combine, lm_head_kernel

    n, d = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    h = hidden.to(weight.dtype)
    block_d = min(block_d, max(16, triton.next_power_of_2(d)))
    split = max(block_v, -(-split // block_v) * block_v)
    splits = triton.cdiv(vocab, split)
    part_max, part_sum, part_best, part_picked = torch.empty(4, splits, n, dtype=torch.float32, device=device)
    part_idx = torch.empty(splits, n, dtype=torch.long, device=device)
    wanted = targets.to(device=device, dtype=torch.long) if targets is not None else part_idx
    lm_head_kernel[(triton.cdiv(n, block_m), splits)](
        h,
        weight,
        bias if bias is not None else weight,
        part_max,
        part_sum,
        part_best,
        part_idx,
        wanted,
        part_picked,
        n,
        vocab,
        d,
        split,
        h.stride(0),
        h.stride(1),
        weight.stride(0),
        weight.stride(1),
        float(temperature),
        -1 if exclude is None else int(exclude),
        bias is not None,
        targets is not None,
        weight.dtype in (torch.float32, torch.float64),
        BLOCK_M=block_m,
        BLOCK_V=block_v,
        BLOCK_D=block_d,
    )
    tokens = torch.empty(n, dtype=torch.long, device=device)
    best, lse, picked = torch.empty(3, n, dtype=torch.float32, device=device)
    lm_head_combine[(triton.cdiv(n, 64),)](
        part_max,
        part_sum,
        part_best,
        part_idx,
        part_picked,
        tokens,
        best,
        lse,
        picked,
        n,
        splits,
        targets is not None,
        BLOCK=64,
    )
    red = _reduce_dtype(weight.dtype)
    out = (tokens, best.to(red), lse.to(red))
    return out if targets is None else (*out, picked.to(red))
