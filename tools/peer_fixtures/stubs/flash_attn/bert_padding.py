"""CPU stand-in for flash_attn.bert_padding (plain torch)."""

import torch
import torch.nn.functional as F


def index_first_axis(tensor, indices):
    return tensor[indices]


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """(B, L, ...) + (B, L) mask -> (tokens, indices, cu_seqlens, max_seqlen, used_seqlens)."""
    keep = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = keep.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, int(seqlens.max().item()), used


def pad_input(hidden_states, indices, batch, seqlen):
    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], dtype=hidden_states.dtype, device=hidden_states.device)
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
