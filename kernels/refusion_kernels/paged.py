"""Attention of packed query tokens over keys/values kept on pages, without gathering each row's keys first.

``paged_attention(q, keys, values, pages, rows, spans, page_size, scale)``: ``q`` ``(T, heads, dim)`` holds the
queries of several sequences packed one after another; ``keys``/``values`` ``(slots, kv_heads, dim)`` are one layer
of a page pool seen as slots (page ``p``'s entry ``i`` is slot ``p * page_size + i``); ``pages`` ``(rows, width)``
holds each sequence's block table; query ``t`` belongs to sequence ``rows[t]`` and sees exactly the key columns
``c`` with ``spans[t, i, 0] <= c < spans[t, i, 1]`` for some ``i`` (``spans`` ``(T, n, 2)``; an empty span has
``lo == hi``; every query must see at least one column). Heads share kv heads in groups of ``heads // kv_heads``.
Returns ``(T, heads, dim)`` in ``q``'s dtype; the softmax is computed in float32.

The Triton kernel reads each visible column's key and value from its page in place (one program per query token
and head, an online softmax over blocks of columns), which is what a paged cache is for on a GPU; the torch
reference gathers every row's columns into a dense tensor and calls ``scaled_dot_product_attention`` under the
mask the spans describe, as the ``branch`` engine does on the CPU.
"""

from __future__ import annotations

import torch

from refusion_kernels.backend import choose


def _check(q, keys, values, pages, rows, spans) -> None:
    if q.dim() != 3 or keys.dim() != 3 or values.shape != keys.shape:
        raise ValueError(
            f"`q` must be (T, heads, dim) and `keys`/`values` (slots, kv_heads, dim); got {tuple(q.shape)}, "
            f"{tuple(keys.shape)} and {tuple(values.shape)}."
        )
    if q.shape[2] != keys.shape[2] or q.shape[1] % keys.shape[1]:
        raise ValueError(f"`q` heads/dim {tuple(q.shape[1:])} do not fit kv heads/dim {tuple(keys.shape[1:])}.")
    if rows.shape != (q.shape[0],) or spans.dim() != 3 or spans.shape[0] != q.shape[0] or spans.shape[2] != 2:
        raise ValueError("`rows` must be (T,) and `spans` (T, n, 2), one entry per query token")
    if pages.dim() != 2:
        raise ValueError(f"`pages` must be (rows, width); got {tuple(pages.shape)}.")


def visible_columns(spans: torch.Tensor, keys: int) -> torch.Tensor:
    """``(T, keys)`` boolean: the columns each query's spans make visible."""
    cols = torch.arange(keys, device=spans.device)[None, None, :]
    inside = (cols >= spans[:, :, :1]) & (cols < spans[:, :, 1:])
    return inside.any(dim=1)


def paged_attention_reference(q, keys, values, pages, rows, spans, page_size: int, scale: float) -> torch.Tensor:
    """The torch reference: gather each query's row, then ``scaled_dot_product_attention`` (same contract)."""
    _check(q, keys, values, pages, rows, spans)
    n_keys = int(spans[:, :, 1].max())
    cols = torch.arange(n_keys, device=q.device)
    width = pages.shape[1] * page_size
    slots = pages[:, (cols // page_size).clamp(max=pages.shape[1] - 1)].long() * page_size + cols % page_size
    slots = torch.where(cols < width, slots, 0)
    per_query = slots[rows.long()]  # (T, keys)
    k = keys[per_query].transpose(1, 2)  # (T, kv_heads, keys, dim)
    v = values[per_query].transpose(1, 2)
    mask = visible_columns(spans, n_keys)[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None].float(),
        k.float(),
        v.float(),
        attn_mask=mask,
        scale=scale,
        enable_gqa=keys.shape[1] != q.shape[1],
    )
    return out[:, :, 0].to(q.dtype)


def paged_attention(
    q, keys, values, pages, rows, spans, page_size: int, scale: float, *, backend: str | None = None
) -> torch.Tensor:
    """Attention of packed queries over paged keys/values (see the module docstring)."""
    if choose(q, backend) == "torch":
        return paged_attention_reference(q, keys, values, pages, rows, spans, page_size, scale)
    _check(q, keys, values, pages, rows, spans)
    import triton

    from refusion_kernels._triton import paged_attention_kernel

    tokens, heads, dim = q.shape
    out = torch.empty_like(q)
    pages_i = pages.to(device=q.device, dtype=torch.int32).contiguous()
    rows_i = rows.to(device=q.device, dtype=torch.int32).contiguous()
    spans_i = spans.to(device=q.device, dtype=torch.int32).contiguous()
    paged_attention_kernel[(tokens, heads)](
        q,
        keys,
        values,
        out,
        pages_i,
        rows_i,
        spans_i,
        float(scale),
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        values.stride(0),
        values.stride(1),
        out.stride(0),
        out.stride(1),
        pages_i.stride(0),
        dim,
        GROUP=heads // keys.shape[1],
        SPANS=spans.shape[1],
        PAGE=page_size,
        BLOCK_N=64,
        BLOCK_D=triton.next_power_of_2(dim),
    )
    return out
