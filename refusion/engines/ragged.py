"""Packed ("ragged") forwards for the branch engine: no sequence is padded to another's width.

The query tokens of all sequences of a forward are packed into one row of
``T`` tokens, so embeddings, projections, MLPs and the LM head see exactly the
tokens fed. Only attention needs the rows apart: a transformers attention
function registered here (``refusion-ragged``) scatters the packed queries
into ``(rows, n_max)``, attends each row to its own keys under a boolean mask
built on the device, and packs the result back. Keys and values live on pages
(:mod:`refusion.cache.paged`): :class:`RaggedCache` writes the fed tokens'
entries straight into their pages' slots, then gathers each row's keys into
``(rows, keys)`` with one ``index_select`` per layer (one row on consecutive
pages is a plain slice of the pool, no copy).

Under a batch-invariant engine (:mod:`refusion.engines.invariant`) each row
attends with exactly its own queries and keys instead, one call per row, so
that its result does not depend on the other rows' lengths.

The model's attention implementation is switched to ``refusion-ragged`` only
for the duration of the engine's forward (and the function falls back to
the model's own implementation when called without a layout).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any

import attrs
import torch
import torch.nn.functional as F

NAME = "refusion-ragged"


@attrs.frozen(eq=False)
class RaggedLayout:
    """Where each packed query token belongs and what it may attend to.

    ``rows``: number of sequences; ``n_max``: most queries of one row;
    ``dest`` ``(T,)``: flat index ``row * n_max + i`` of each packed token;
    ``row_of`` / ``col_of`` ``(T,)``: its row and the last column it sees; ``mask``
    ``(rows, 1, n_max, keys)`` boolean, or ``None`` when a single query sees
    every key; ``keys``: key columns used. ``writes`` ``(T,)``: the pool slot
    of each fed token; ``reads`` ``(rows, keys)``: the pool slot of each row's
    key columns, or ``None`` when ``base`` is given: one row whose columns are
    slots ``base + column``. ``span``: for that row, when its fed tokens take
    consecutive columns, ``(start, stop)`` (written with one slice).
    """

    rows: int
    n_max: int
    dest: torch.Tensor | None
    row_of: torch.Tensor | None
    col_of: torch.Tensor | None
    mask: torch.Tensor | None
    keys: int
    writes: torch.Tensor | None = None
    reads: torch.Tensor | None = None
    base: int | None = None
    span: tuple[int, int] | None = None
    #: the paged kernel's inputs instead of ``reads``/``mask``: block tables ``(rows, width)``, each token's
    #: visible column spans ``(T, n, 2)`` and the page size (:func:`refusion_kernels.paged_attention`)
    pages: torch.Tensor | None = None
    spans: torch.Tensor | None = None
    page_size: int = 0


class RaggedCache:
    """The cache object the network sees: writes each fed token's keys/values into its slot of the pool, returns
    each row's keys/values ``(rows, kv_heads, keys, dim)``.

    ``slots``: the pool seen as ``(layers, 2, slots, kv_heads, dim)``
    (:attr:`PagePool.slots <refusion.cache.pages.PagePool.slots>`).
    """

    def __init__(self, slots: torch.Tensor, layout: RaggedLayout):
        self.slots, self.layout = slots, layout

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layout = self.layout
        out = []
        for which, states in ((0, key_states), (1, value_states)):
            pool = self.slots[layer_idx, which]  # (slots, heads, dim)
            fed = states[0].transpose(0, 1).to(pool.dtype)  # (T, heads, dim)
            if layout.base is not None and layout.span is not None:
                start, stop = layout.span
                pool[layout.base + start : layout.base + stop] = fed
            else:
                pool.index_copy_(0, layout.writes, fed)
            if layout.spans is not None:  # the paged kernel reads the pool itself
                out.append(pool)
                continue
            if layout.base is not None:
                rows = pool[layout.base : layout.base + layout.keys][None]
            else:
                assert layout.reads is not None  # a layout gives a base or the slots to read
                heads, dim = pool.shape[1:]
                rows = pool.index_select(0, layout.reads.view(-1)).view(layout.rows, layout.keys, heads, dim)
            out.append(rows.transpose(1, 2))
        return out[0], out[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


_CURRENT = threading.local()


def ragged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for packed queries ``(1, heads, T, dim)`` against per-row keys ``(rows, kv_heads, keys, dim)``.

    The layout arrives as the attention mask, or, for networks whose mask creation drops a mask it does not know
    (transformers' bidirectional ones), from the forward that :func:`switched` is running in this thread."""
    layout = attention_mask
    if not isinstance(layout, RaggedLayout):
        layout = getattr(_CURRENT, "layout", None)
    if not isinstance(layout, RaggedLayout):  # an ordinary call of the model while switched: its own attention
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from transformers.models.llama.modeling_llama import eager_attention_forward

        inner = getattr(module.config, "_refusion_inner_attention", "sdpa")
        fn = ALL_ATTENTION_FUNCTIONS.get_interface(inner, eager_attention_forward)
        return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    heads, dim = query.shape[1], query.shape[3]
    gqa = key.shape[1] != heads
    from refusion.engines.invariant import current

    if layout.spans is not None:  # keys/values are the pool's slots: the paged kernel reads each row's in place
        from refusion_kernels import paged_attention

        scale = scaling if scaling is not None else dim**-0.5
        q = query[0].transpose(0, 1)
        out = paged_attention(
            q, key, value, layout.pages, layout.row_of, layout.spans, layout.page_size, scale, backend="triton"
        )
        return out[None], None
    invariance = current()
    if invariance is not None:
        return _attend_per_row(query, key, value, layout, invariance.spans(layout), scaling, gqa), None
    if layout.rows == 1:
        q = query
    else:
        flat = query.new_zeros(layout.rows * layout.n_max, heads, dim)
        flat[layout.dest] = query[0].transpose(0, 1)
        q = flat.view(layout.rows, layout.n_max, heads, dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=layout.mask, scale=scaling, enable_gqa=gqa)
    if layout.rows == 1:
        return out.transpose(1, 2), None
    packed = out.transpose(1, 2).reshape(layout.rows * layout.n_max, heads, dim)[layout.dest]
    return packed[None], None


def _attend_per_row(query, key, value, layout: RaggedLayout, spans, scaling, gqa) -> torch.Tensor:
    """Batch-invariant attention: each row with exactly its own queries and keys, under an explicit mask.

    ``spans`` holds ``(start, stop, keys)`` per row (:meth:`Invariance.spans
    <refusion.engines.invariant.Invariance.spans>`); the call a row makes is
    the same whatever else is packed with it, alone included. Returns
    ``(1, T, heads, dim)``.
    """
    outs = []
    for r, (start, stop, keys) in enumerate(spans):
        n = stop - start
        if layout.mask is None:  # one query that sees every key
            mask = torch.ones(1, 1, n, keys, dtype=torch.bool, device=query.device)
        else:
            mask = layout.mask[r : r + 1, :, :n, :keys]
        outs.append(
            F.scaled_dot_product_attention(
                query[:, :, start:stop],
                key[r : r + 1, :, :keys],
                value[r : r + 1, :, :keys],
                attn_mask=mask,
                scale=scaling,
                enable_gqa=gqa,
            )
        )
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    return out.transpose(1, 2)


_registered = False


def register() -> None:
    """Register the attention function with transformers (once per process)."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, ragged_attention)
        _registered = True


@contextmanager
def switched(config: Any, layout: RaggedLayout | None = None):
    """The model's attention implementation is ``refusion-ragged`` inside this block, its own again after; ``layout``
    is the packed forward's (read by :func:`ragged_attention` in this thread when the mask does not carry it)."""
    register()
    inner = config._attn_implementation
    config._refusion_inner_attention = inner
    config._attn_implementation_internal = NAME
    previous = getattr(_CURRENT, "layout", None)
    _CURRENT.layout = layout
    try:
        yield inner
    finally:
        _CURRENT.layout = previous
        config._attn_implementation_internal = inner


def own_attention(config: Any) -> str:
    """The network's own attention implementation, also while another thread's forward has it switched."""
    current = getattr(config, "_attn_implementation", None) or "sdpa"
    return getattr(config, "_refusion_inner_attention", current) if current == NAME else current


def supports(model: Any) -> str | None:
    """Why packed forwards cannot run on ``model`` (an HF adapter), or ``None``."""
    network = getattr(model, "model", None)
    config = getattr(network, "config", None)
    if config is None or not getattr(network, "_supports_attention_backend", False):
        return "the network does not take custom attention functions (transformers' attention interface)"
    if getattr(config, "use_sliding_window", False) or "sliding_attention" in (
        getattr(config, "layer_types", None) or []
    ):
        return "sliding-window attention layers are not supported"
    if getattr(model, "head", None) is None:
        return "the network's LM head could not be separated from its backbone"
    return None
