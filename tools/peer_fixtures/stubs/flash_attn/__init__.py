"""CPU stand-in for the parts of `flash_attn` that SDAR's modeling file imports (plain torch; not the real library).

Semantics follow flash-attn 2.x: tensors are (batch, seqlen, heads, head_dim); K/V may have fewer heads (GQA);
a causal mask is aligned to the bottom-right corner when seqlen_q != seqlen_k.
"""

import math

import torch
import torch.nn.functional as F

__version__ = "0.0.0+peer-fixtures-cpu-stand-in"


def _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes):
    if softcap not in (None, 0, 0.0) or alibi_slopes is not None:
        raise NotImplementedError("flash_attn CPU stand-in: softcap / alibi are not supported")
    heads, kv_heads = q.shape[2], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} key/value heads")
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if kv_heads != heads:
        kh = kh.repeat_interleave(heads // kv_heads, dim=1)
        vh = vh.repeat_interleave(heads // kv_heads, dim=1)
    lq, lk = q.shape[1], k.shape[1]
    left, right = window_size if window_size is not None else (-1, -1)
    if causal:
        right = 0
    mask = None
    if left >= 0 or right >= 0:
        qpos = torch.arange(lq, device=q.device).unsqueeze(1) + (lk - lq)
        kpos = torch.arange(lk, device=q.device).unsqueeze(0)
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
        if right >= 0:
            mask &= kpos <= qpos + right
        if left >= 0:
            mask &= kpos >= qpos - left
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return out.transpose(1, 2).contiguous()


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    if return_attn_probs:
        raise NotImplementedError("flash_attn CPU stand-in: return_attn_probs is not supported")
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    if return_attn_probs or block_table is not None:
        raise NotImplementedError("flash_attn CPU stand-in: return_attn_probs / block_table are not supported")
    pieces = []
    for i in range(cu_seqlens_q.numel() - 1):
        qs, qe = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        ks, ke = int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        pieces.append(
            _attention(
                q[None, qs:qe],
                k[None, ks:ke],
                v[None, ks:ke],
                dropout_p,
                softmax_scale,
                causal,
                window_size,
                softcap,
                alibi_slopes,
            )[0]
        )
    return torch.cat(pieces, dim=0)


__all__ = ["flash_attn_func", "flash_attn_varlen_func"]
