"""Scatter of committed tokens' keys/values into a preallocated cache, in place.

``scatter_kv(cache, src, rows, cols)``: ``cache`` has shape
``(layers, 2, batch, kv_heads, capacity, head_dim)``; ``src`` holds ``t`` tokens'
keys/values, shape ``(layers, 2, kv_heads, t, head_dim)``; token ``i`` is written
to batch row ``rows[i]`` at cache slot ``cols[i]``. Nothing else of the cache is
read or written, so committing costs O(t), whatever the cached length. The
destination slots must be distinct and must not overlap the source.
"""

from __future__ import annotations

import torch

from refusion_kernels.backend import choose


def _check(cache: torch.Tensor, src: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> None:
    if cache.dim() != 6 or src.dim() != 5:
        raise ValueError(f"`cache` must be 6-D and `src` 5-D; got {tuple(cache.shape)} and {tuple(src.shape)}.")
    L, two, _, H, _, D = cache.shape
    if src.shape[:3] != (L, two, H) or src.shape[4] != D:
        raise ValueError(f"`src` shape {tuple(src.shape)} does not fit cache shape {tuple(cache.shape)}.")
    if rows.shape != (src.shape[3],) or cols.shape != rows.shape:
        raise ValueError("`rows` and `cols` must have one entry per source token")


def scatter_kv_reference(cache: torch.Tensor, src: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> None:
    """The torch reference: same contract as :func:`scatter_kv`."""
    _check(cache, src, rows, cols)
    cache[:, :, rows, :, cols, :] = src.permute(3, 0, 1, 2, 4).to(cache.dtype)


def scatter_kv(
    cache: torch.Tensor, src: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, *, backend: str | None = None
) -> None:
    """Write ``src`` token ``i`` to ``cache[:, :, rows[i], :, cols[i], :]`` (see the module docstring)."""
    rows = rows.to(device=cache.device, dtype=torch.long)
    cols = cols.to(device=cache.device, dtype=torch.long)
    if src.shape[3] == 0:
        return
    if choose(cache, backend) == "torch":
        scatter_kv_reference(cache, src, rows, cols)
        return
    _check(cache, src, rows, cols)
    _scatter_triton(cache, src.to(cache.dtype), rows, cols)


def _scatter_triton(cache, src, rows, cols):
    import triton

    from refusion_kernels._triton import scatter_kernel

    L, two, B, H, cap, D = cache.shape
    t = src.shape[3]
    c = cache.view(L * two, B, H, cap, D) if cache.is_contiguous() else cache.reshape(L * two, B, H, cap, D)
    if c.data_ptr() != cache.data_ptr():
        raise ValueError("`cache` must be viewable as (layers*2, batch, heads, capacity, dim) without a copy")
    s = src.reshape(L * two, H, t, D)
    scatter_kernel[(t, L * two * H)](
        s,
        c,
        rows,
        cols,
        H,
        D,
        s.stride(0),
        s.stride(1),
        s.stride(2),
        s.stride(3),
        c.stride(0),
        c.stride(1),
        c.stride(2),
        c.stride(3),
        c.stride(4),
        BLOCK_D=triton.next_power_of_2(D),
    )
