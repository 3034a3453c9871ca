"""The ``repeat`` engine: the reference decoder's way, a transformers cache per sequence.

Every sequence keeps a ``DynamicCache``; calls run one sequence at a time:

* one extend of the empty branch (plans, global verification, AR steps): a
  single forward on the sequence's cache, cropped back afterwards; pending
  context entries are encoded in the same forward;
* several extends, or an extend of a non-empty branch (parallel infilling): the
  committed context is repeated once per extend (transformers'
  ``batch_repeat`` idea), each row gets its branch's keys/values, padded, with
  a 2-D padding mask; one batched forward serves all branches.

Both copy the cached context (``torch.cat`` in ``DynamicCache.update``, and
the repeat), which the counters record. :mod:`refusion.engines.branch` is the
engine that does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from refusion.cache.sequence import SequenceCache
from refusion.cache.stores import DynamicStore
from refusion.decoding.protocol import Extend, ExtendOutput, ModelCall
from refusion.engines.base import Engine, SequenceState
from refusion.plugins import hookimpl


class RepeatEngine(Engine):
    """One ``DynamicCache`` per sequence; branches by repeating the context (causal models)."""

    name = "repeat"
    priority = 10
    mixes_sequences = False  # one sequence per forward

    @classmethod
    def unsupported(cls, model: Any) -> str | None:
        caps = model.capabilities
        if not caps.causal:
            return "it needs a causal model (use the 'canvas' engine for bidirectional ones)"
        if not caps.kv_cache:
            return "it needs a model whose keys/values can be cached"
        return None

    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        counters = self.new_counters()
        store = DynamicStore(self.model.new_cache(), counters)
        context = SequenceCache(store, prompt, torch.arange(prompt.shape[0]))
        return SequenceState(context, counters, prompt.shape[0], region_length)

    @torch.no_grad()
    def run(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        self.epoch.value += 1
        return {state: self._run_one(state, call) for state, call in calls.items()}

    def _run_one(self, state: SequenceState, call: ModelCall) -> tuple[ExtendOutput, ...]:
        extends = call.extends
        if len(extends) == 1 and len(extends[0].parent) == 0:
            return (self._extend_context(state, extends[0]),)
        if state.context.pending:
            self.flush(state)
        return self._extend_branches(state, extends)

    def _copied(self, state: SequenceState, context: int, new: int) -> None:
        token = state.context.store.token_bytes()
        state.counters.copied(context=context * token, new=new * token)

    def flush(self, state: SequenceState) -> None:
        """Encode the sequence's pending context entries (one forward)."""
        cache = state.context
        if not cache.pending:
            return
        device = self.device
        ids = cache.tokens[cache.encoded :].to(device)
        pos = cache.positions[cache.encoded :].to(device)
        mask = torch.ones(1, len(cache), dtype=torch.long, device=device)
        fed = cache.pending
        scores = self.run_network(ids[None], pos[None], mask, cache.store.cache)
        self.served({state: fed}, pairs=fed * len(cache), keys=cache.encoded)
        self._copied(state, cache.encoded, fed)
        cache.mark_encoded(scores[0, -1])

    def _extend_context(self, state: SequenceState, extend: Extend) -> ExtendOutput:
        cache = state.context
        dynamic = cache.store.cache
        device = self.device
        pending = cache.pending
        q = len(extend.tokens)
        ids = torch.cat((cache.tokens[cache.encoded :].to(device), extend.tokens.to(device)))
        pos = torch.cat((cache.positions[cache.encoded :].to(device), extend.positions.to(device)))
        start = cache.encoded + pending
        mask = torch.ones(1, start + q, dtype=torch.long, device=device)
        scores = self.run_network(ids[None], pos[None], mask, dynamic)[0]
        self.served({state: pending + q}, pairs=(pending + q) * (start + q), keys=cache.encoded)
        self._copied(state, cache.encoded, pending + q)  # DynamicCache.update concatenates: all of it is copied
        layers = [(layer.keys, layer.values) for layer in dynamic.layers]
        dynamic.crop(-q)
        if pending:
            cache.mark_encoded(scores[pending - 1])
            scores = scores[pending:]
        return ExtendOutput(extend, scores, layers, 0, start, self.epoch, self.epoch.value)

    def _extend_branches(self, state: SequenceState, extends: tuple[Extend, ...]) -> tuple[ExtendOutput, ...]:
        from transformers import DynamicCache

        cache = state.context
        device = self.device
        k = len(extends)
        context = cache.encoded
        branch_lens = [len(e.parent) for e in extends]
        query_lens = [len(e.tokens) for e in extends]
        width_b, width_q = max(branch_lens), max(query_lens)

        ids = torch.full((k, width_q), self.model.mask_token_id, dtype=torch.long, device=device)
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
        for index, layer in enumerate(cache.store.cache.layers):
            keys = layer.keys.expand(k, -1, -1, -1)
            values = layer.values.expand(k, -1, -1, -1)
            if branch_kv is not None:
                keys = torch.cat((keys, branch_kv[index, 0]), dim=2)
                values = torch.cat((values, branch_kv[index, 1]), dim=2)
            else:
                keys, values = keys.contiguous(), values.contiguous()
            layers.append((keys, values))
        batch_cache = DynamicCache(layers)
        scores = self.run_network(ids, pos, mask, batch_cache)
        self.served(
            {state: sum(query_lens)},
            padded=k * width_q - sum(query_lens),
            pairs=k * width_q * (context + width_b + width_q),
            keys=k * (context + width_b),
        )
        self._copied(state, k * (2 * context + width_b), k * (width_b + width_q))  # the repeat, then the cat
        out_layers = [(layer.keys, layer.values) for layer in batch_cache.layers]
        return tuple(
            ExtendOutput(
                e, scores[row, : query_lens[row]], out_layers, row, context + width_b, self.epoch, self.epoch.value
            )
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


@hookimpl
def register_engines(register):
    register(RepeatEngine)
