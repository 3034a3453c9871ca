"""Runs the :class:`~refusion.cache.calls.ModelCall` s of one sequence on a transformers cache.

This is the reference decoder's way (kept as the ``repeat`` engine, batch 1):

* one extend of the empty branch (plans, global verification, AR steps): a
  single forward on the sequence's ``DynamicCache``, cropped back afterwards;
  pending context entries are encoded in the same forward;
* several extends, or an extend of a non-empty branch (parallel infilling): the
  committed context is repeated once per extend (transformers'
  ``batch_repeat`` idea), each row gets its branch's keys/values, padded, with
  a 2-D padding mask; one batched forward serves all branches.

Both copy the cached context (``torch.cat`` in ``DynamicCache.update``, and
the repeat), which ``copies`` counts. :mod:`refusion.cache.batched` is
the engine that does not.
"""

from __future__ import annotations

import torch

from refusion.cache.calls import Epoch, Extend, ExtendOutput, ModelCall
from refusion.cache.sequence import SequenceCache
from refusion.cache.stores import CopyStats, bytes_per_token
from refusion.models.base import ModelAdapter


class RepeatExecutor:
    """Executes model calls for one sequence whose store is a :class:`~refusion.cache.stores.DynamicStore`."""

    def __init__(self, adapter: ModelAdapter, cache: SequenceCache):
        self.adapter = adapter
        self.cache = cache
        self.epoch = Epoch()
        self.copies = CopyStats()

    @property
    def _dynamic(self):
        return self.cache.store.cache

    def _count(self, context: int, new: int) -> None:
        """Count a forward's copies: ``context`` cached entries re-copied, ``new`` entries written."""
        layer = self._dynamic.layers[0]
        if layer.is_initialized and layer.keys.numel():
            _, heads, _, dim = layer.keys.shape
            token = bytes_per_token(len(self._dynamic.layers), heads, dim, layer.keys.dtype)
            self.copies.context += context * token
            self.copies.new += new * token

    @torch.no_grad()
    def run(self, call: ModelCall) -> tuple[ExtendOutput, ...]:
        self.epoch.value += 1
        extends = call.extends
        if len(extends) == 1 and len(extends[0].parent) == 0:
            return (self._extend_context(extends[0]),)
        if self.cache.pending:
            self.flush()
        return self._extend_branches(extends)

    @torch.no_grad()
    def flush(self) -> None:
        """Encode pending context entries (one forward)."""
        cache = self.cache
        if not cache.pending:
            return
        device = self.adapter.device
        ids = cache.tokens[cache.encoded :].to(device)
        pos = cache.positions[cache.encoded :].to(device)
        mask = torch.ones(1, len(cache), dtype=torch.long, device=device)
        logits = self.adapter.forward(ids[None], pos[None], mask, self._dynamic, logits_to_keep=1)
        self._count(cache.encoded, cache.pending)
        cache.mark_encoded(logits[0, -1])

    def _extend_context(self, extend: Extend) -> ExtendOutput:
        cache = self.cache
        device = self.adapter.device
        pending = cache.pending
        q = len(extend.tokens)
        ids = torch.cat((cache.tokens[cache.encoded :].to(device), extend.tokens.to(device)))
        pos = torch.cat((cache.positions[cache.encoded :].to(device), extend.positions.to(device)))
        start = cache.encoded + pending
        mask = torch.ones(1, start + q, dtype=torch.long, device=device)
        keep = q + 1 if pending else 0
        logits = self.adapter.forward(ids[None], pos[None], mask, self._dynamic, logits_to_keep=keep)[0]
        self._count(cache.encoded, pending + q)  # DynamicCache.update concatenates: all of it is copied
        layers = [(layer.keys, layer.values) for layer in self._dynamic.layers]
        self._dynamic.crop(-q)
        if pending:
            cache.mark_encoded(logits[0])
            logits = logits[1:]
        return ExtendOutput(extend, logits, layers, 0, start, self.epoch, self.epoch.value)

    def _extend_branches(self, extends: tuple[Extend, ...]) -> tuple[ExtendOutput, ...]:
        from transformers import DynamicCache

        cache = self.cache
        device = self.adapter.device
        k = len(extends)
        context = cache.encoded
        branch_lens = [len(e.parent) for e in extends]
        query_lens = [len(e.tokens) for e in extends]
        width_b, width_q = max(branch_lens), max(query_lens)

        ids = torch.full((k, width_q), self.adapter.mask_token_id, dtype=torch.long, device=device)
        pos = torch.zeros((k, width_q), dtype=torch.long, device=device)
        mask = torch.zeros((k, context + width_b + width_q), dtype=torch.long, device=device)
        mask[:, :context] = 1
        for row, e in enumerate(extends):
            q = query_lens[row]
            ids[row, :q] = e.tokens.to(device)
            pos[row, :q] = e.positions.to(device)
            pos[row, q:] = pos[row, q - 1]
            mask[row, context : context + branch_lens[row]] = 1
            mask[row, context + width_b : context + width_b + q] = 1

        layers = []
        branch_kv = _padded_branch_kv(extends, width_b) if width_b else None
        for index, layer in enumerate(self._dynamic.layers):
            keys = layer.keys.expand(k, -1, -1, -1)
            values = layer.values.expand(k, -1, -1, -1)
            if branch_kv is not None:
                keys = torch.cat((keys, branch_kv[index, 0]), dim=2)
                values = torch.cat((values, branch_kv[index, 1]), dim=2)
            else:
                keys, values = keys.contiguous(), values.contiguous()
            layers.append((keys, values))
        batch_cache = DynamicCache(layers)
        logits = self.adapter.forward(ids, pos, mask, batch_cache)
        self._count(k * (2 * context + width_b), k * (width_b + width_q))  # the repeat, then the cat in update
        out_layers = [(layer.keys, layer.values) for layer in batch_cache.layers]
        return tuple(
            ExtendOutput(e, logits[row, : query_lens[row]], out_layers, row, context + width_b, self.epoch, self.epoch.value)
            for row, e in enumerate(extends)
        )


def _padded_branch_kv(extends: tuple[Extend, ...], width: int) -> torch.Tensor:
    """Branch keys/values as ``(layers, 2, k, kv_heads, width, head_dim)``, zero-padded on the right."""
    first = next(e.parent.kv for e in extends if e.parent.kv is not None).data
    layers, _, heads, _, dim = first.shape
    out = first.new_zeros((layers, 2, len(extends), heads, width, dim))
    for row, e in enumerate(extends):
        if e.parent.kv is not None:
            out[:, :, row, :, : len(e.parent)] = e.parent.kv.data
    return out


__all__ = ["RepeatExecutor"]
