"""The batched engine: many sequences, parallel branches as attention masks, one preallocated cache.

Each model forward serves one pending :class:`~refusion.cache.calls.ModelCall`
of every live sequence. Sequence ``b`` owns row ``b`` of a
:class:`~refusion.cache.stores.PreallocatedKV`: its encoded context sits in
slots ``0:len_b`` and is never copied. For the call, every row packs its
queries - pending context tokens, then the tokens of each extend - and the
keys/values of the branches those extends continue are written once into a
scratch area after the longest context. A 4-D boolean mask lets each query see
its own context, the pending tokens, its branch's scratch span and, causally,
the tokens of its own extend: branches of one sequence share the cached prefix
instead of repeating it.

Writes are O(new tokens): the model writes the fed tokens' keys/values into the
scratch slots in place; committing copies only the committed tokens
(``refusion_kernels.scatter_kv``); truncation is a length change.
"""

from __future__ import annotations

from typing import Mapping

import torch

from refusion.cache.calls import Epoch, ExtendOutput, ModelCall
from refusion.cache.sequence import SequenceCache
from refusion.cache.stores import PreallocatedKV, RowStore
from refusion.models.base import ModelAdapter


class _ScratchCache:
    """The cache object the network sees during one call: writes new keys/values at slots ``start:start+q``."""

    def __init__(self, data: torch.Tensor, rows: int, start: int, q: int):
        self.data, self.rows, self.start, self.q = data, rows, start, q

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        s, e = self.start, self.start + self.q
        keys = self.data[layer_idx, 0, : self.rows]
        values = self.data[layer_idx, 1, : self.rows]
        keys[:, :, s:e] = key_states
        values[:, :, s:e] = value_states
        return keys[:, :, :e], values[:, :, :e]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.start


class BranchExecutor:
    """Runs one model call per live sequence in a single forward.

    ``caches`` maps a sequence key to its :class:`SequenceCache`, whose store
    must be a :class:`RowStore` of ``buffer``. Rows of finished sequences are
    reclaimed by moving live rows down (``compact``) so that every forward uses
    a contiguous block of rows.
    """

    def __init__(self, adapter: ModelAdapter, buffer: PreallocatedKV, caches: Mapping[object, SequenceCache]):
        self.adapter = adapter
        self.buffer = buffer
        self.caches = dict(caches)
        self.epoch = Epoch()
        self.forwards = 0

    @property
    def copies(self):
        return self.buffer.copies

    def compact(self, live: list[object]) -> None:
        """Move the rows of ``live`` sequences to rows ``0:len(live)``, keeping their order.

        Live sequences only ever move down into rows of finished ones (rows
        keep the sequences' order), whose stores are detached first: they keep
        their length but no longer own a row.
        """
        for target, key in enumerate(live):
            store: RowStore = self.caches[key].store
            if store.row == target:
                continue
            for other in self.caches.values():
                if other.store.row == target:
                    other.store.detach()
            n = len(store)
            self.buffer.data[:, :, target, :, :n] = self.buffer.data[:, :, store.row, :, :n]
            self.buffer.copies.context += n * self.buffer.token_bytes
            self.buffer.lengths[target] = n
            store.row = target

    @torch.no_grad()
    def run(self, calls: Mapping[object, ModelCall]) -> dict[object, tuple[ExtendOutput, ...]]:
        """One forward for the given sequences' calls; returns their outputs by sequence key."""
        self.epoch.value += 1
        self.forwards += 1
        live = list(calls)
        self.compact(live)
        device = self.adapter.device
        buf = self.buffer
        rows = len(live)
        caches = [self.caches[k] for k in live]
        lengths = [c.encoded for c in caches]
        start = max(lengths)

        # Lay out each row: unique parent branches (keys/values written to scratch), then the queries.
        plans = []
        for cache, key in zip(caches, live):
            parents, parent_at, width = [], {}, 0
            for e in calls[key].extends:
                if len(e.parent) and id(e.parent) not in parent_at:
                    parent_at[id(e.parent)] = width
                    parents.append(e.parent)
                    width += len(e.parent)
            pending = cache.pending
            spans, q = [], pending
            for e in calls[key].extends:
                spans.append((q, q + len(e.tokens)))
                q += len(e.tokens)
            plans.append((parents, parent_at, width, pending, spans, q))
        width = max(p[2] for p in plans)
        q_max = max(p[5] for p in plans)
        query_at = start + width
        buf.ensure_capacity(query_at + q_max)

        parent_src, parent_rows, parent_cols = [], [], []
        for row, (parents, parent_at, *_rest) in enumerate(plans):
            for parent in parents:
                n = len(parent)
                parent_src.append(parent.kv.data)
                parent_rows.append(torch.full((n,), row, dtype=torch.long))
                parent_cols.append(torch.arange(n) + start + parent_at[id(parent)])
        if parent_src:
            from refusion_kernels import scatter_kv

            src = torch.cat(parent_src, dim=3)
            scatter_kv(buf.data, src, torch.cat(parent_rows), torch.cat(parent_cols))
            buf.copies.new += src.shape[3] * buf.token_bytes

        ids = torch.full((rows, q_max), self.adapter.mask_token_id, dtype=torch.long)
        pos = torch.zeros((rows, q_max), dtype=torch.long)
        mask = torch.zeros((rows, 1, q_max, query_at + q_max), dtype=torch.bool)
        causal = torch.tril(torch.ones(q_max, q_max, dtype=torch.bool))
        for row, (cache, key) in enumerate(zip(caches, live)):
            parents, parent_at, _w, pending, spans, q = plans[row]
            m = mask[row, 0]
            m[:q, : lengths[row]] = True  # the encoded context
            m[:, query_at : query_at + q_max] = torch.eye(q_max, dtype=torch.bool)  # padding rows see themselves
            if pending:
                ids[row, :pending] = cache.tokens[cache.encoded :]
                pos[row, :pending] = cache.positions[cache.encoded :]
                m[:pending, query_at : query_at + pending] = causal[:pending, :pending]
                m[pending:q, query_at : query_at + pending] = True
            for e, (a, b) in zip(calls[key].extends, spans):
                ids[row, a:b] = e.tokens.cpu()
                pos[row, a:b] = e.positions.cpu()
                m[a:b, query_at + a : query_at + b] = causal[: b - a, : b - a]
                if len(e.parent):
                    p0 = start + parent_at[id(e.parent)]
                    m[a:b, p0 : p0 + len(e.parent)] = True

        scratch = _ScratchCache(buf.data, rows, query_at, q_max)
        logits = self.adapter.forward(ids.to(device), pos.to(device), self._mask_for_model(mask.to(device)), scratch)
        buf.copies.new += rows * q_max * buf.token_bytes  # the model's in-place writes of the fed tokens

        outputs: dict[object, tuple[ExtendOutput, ...]] = {}
        layers = [(buf.data[layer, 0, :rows], buf.data[layer, 1, :rows]) for layer in range(buf.data.shape[0])]
        for row, (cache, key) in enumerate(zip(caches, live)):
            parents, parent_at, _w, pending, spans, q = plans[row]
            if pending:
                moved = buf.data[:, :, row, :, query_at : query_at + pending].clone()
                buf.write(row, lengths[row], moved)
                buf.lengths[row] = lengths[row] + pending
                cache.mark_encoded(logits[row, pending - 1])
            outputs[key] = tuple(
                ExtendOutput(e, logits[row, a:b], layers, row, query_at + a, self.epoch, self.epoch.value)
                for e, (a, b) in zip(calls[key].extends, spans)
            )
        return outputs

    def _mask_for_model(self, mask: torch.Tensor) -> torch.Tensor:
        """sdpa takes the boolean mask; eager attention needs an additive float mask."""
        impl = getattr(getattr(self.adapter, "model", None), "config", None)
        if getattr(impl, "_attn_implementation", "sdpa") == "eager":
            dtype = self.buffer.data.dtype
            return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
        return mask
