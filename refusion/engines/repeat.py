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

The calls of several sequences share one forward: every extend of every
sequence is a row, its sequence's context repeated into it (right-padded to
the longest context), then its branch and its tokens, under a 2-D padding
mask (a sequence whose pending entries must be encoded before its branches
first gets them encoded, with the other such sequences, in one forward). A
sequence alone, or every sequence with ``batch_invariant=True``, runs as
above.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from refusion.cache.stores import DynamicStore
from refusion.decoding.context import SequenceCache
from refusion.decoding.protocol import Extend, ExtendOutput, ModelCall
from refusion.engines.base import Engine, SequenceState
from refusion.plugins import hookimpl


class RepeatEngine(Engine):
    """One ``DynamicCache`` per sequence; branches by repeating the context (causal models)."""

    name = "repeat"
    priority = 10

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
        if len(calls) == 1 or self.batch_invariant or self._layers is None:
            return {state: self._run_one(state, call) for state, call in calls.items()}
        return self._run_batch(calls)

    @functools.cached_property
    def _layers(self) -> int | None:
        """The model's layers of keys/values (``None``: it does not say, and sequences run one by one)."""
        try:
            return int(self.model.kv_shape()[0])
        except NotImplementedError:
            return None

    def _run_batch(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        """Every extend of every sequence as one row of one padded forward (see the module docstring)."""
        from transformers import DynamicCache

        def rooted(call: ModelCall) -> bool:
            return len(call.extends) == 1 and len(call.extends[0].parent) == 0

        self._flush_batch([state for state, call in calls.items() if state.context.pending and not rooted(call)])
        device = self.device
        rows: list[tuple[SequenceState, Extend, int]] = []  # (sequence, extend, pending tokens fed before it)
        for state, call in calls.items():
            pending = state.context.pending if rooted(call) else 0
            rows.extend((state, e, pending) for e in call.extends)
        contexts = [state.context.encoded for state, _, _ in rows]
        width_c = max(contexts)
        width_b = max(len(e.parent) for _, e, _ in rows)
        width_q = max(p + len(e.tokens) for _, e, p in rows)
        k = len(rows)
        ids = torch.full((k, width_q), self.model.mask_token_id, dtype=torch.long, device=device)
        pos = torch.zeros((k, width_q), dtype=torch.long, device=device)
        mask = torch.zeros((k, width_c + width_b + width_q), dtype=torch.long, device=device)
        for row, (state, e, pending) in enumerate(rows):
            cache = state.context
            tokens = torch.cat((cache.tokens[cache.encoded :], e.tokens.cpu())) if pending else e.tokens.cpu()
            positions = torch.cat((cache.positions[cache.encoded :], e.positions.cpu())) if pending else e.positions
            q = len(tokens)
            ids[row, :q] = tokens.to(device)
            pos[row, :q] = positions.to(device)
            pos[row, q:] = pos[row, q - 1]
            mask[row, : contexts[row]] = 1
            mask[row, width_c : width_c + len(e.parent)] = 1
            mask[row, width_c + width_b : width_c + width_b + q] = 1
        branch_kv = _padded_branch_kv(tuple(e for _, e, _ in rows), width_b) if width_b else None
        layers = []
        for index in range(self._layers or 0):
            keys, values = self._contexts(rows, index, width_c)
            if branch_kv is not None:
                keys = torch.cat((keys, branch_kv[index, 0]), dim=2)
                values = torch.cat((values, branch_kv[index, 1]), dim=2)
            layers.append((keys, values))
        batch_cache = DynamicCache(layers)
        scores = self.run_network(ids, pos, mask, batch_cache)
        fed: dict[SequenceState, int] = {}
        for state, e, pending in rows:
            fed[state] = fed.get(state, 0) + pending + len(e.tokens)
        self.served(
            fed,
            padded=k * width_q - sum(fed.values()),
            pairs=k * width_q * (width_c + width_b + width_q),
            keys=k * (width_c + width_b),
        )
        out_layers = [(layer.keys, layer.values) for layer in batch_cache.layers]
        outputs: dict[SequenceState, list[ExtendOutput]] = {}
        start = width_c + width_b
        for row, (state, e, pending) in enumerate(rows):
            cache = state.context
            self._copied(state, 2 * contexts[row] + width_b, width_b + width_q)  # the repeat, then the cat
            if pending:  # the pending entries join the sequence's own cache
                dynamic = cache.store.cache
                for index, (keys, values) in enumerate(out_layers):
                    dynamic.update(
                        keys[row : row + 1, :, start : start + pending],
                        values[row : row + 1, :, start : start + pending],
                        index,
                    )
                cache.mark_encoded(scores[row, pending - 1])
            q = len(e.tokens)
            outputs.setdefault(state, []).append(
                ExtendOutput(
                    e,
                    scores[row, pending : pending + q],
                    out_layers,
                    row,
                    start + pending,
                    self.epoch,
                    self.epoch.value,
                )
            )
        return {state: tuple(outs) for state, outs in outputs.items()}

    def _contexts(self, rows: list, index: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s cached keys and values of each row's sequence, right-padded to ``width``:
        ``(rows, kv_heads, width, head_dim)`` each."""
        known = next(
            (
                state.context.store.cache.layers[index]
                for state, _, _ in rows
                if state.context.encoded and state.context.store.cache.layers[index].is_initialized
            ),
            None,
        )
        if known is None:  # nothing cached yet in any row
            _, heads, dim, dtype = self.model.kv_shape()
            empty = torch.zeros((len(rows), heads, width, dim), dtype=dtype, device=self.device)
            return empty, empty.clone()
        heads, dim = known.keys.shape[1], known.keys.shape[3]
        keys = known.keys.new_zeros((len(rows), heads, width, dim))
        values = known.values.new_zeros((len(rows), heads, width, dim))
        for row, (state, _, _) in enumerate(rows):
            n = state.context.encoded
            if n:
                layer = state.context.store.cache.layers[index]
                keys[row, :, :n] = layer.keys[0, :, :n]
                values[row, :, :n] = layer.values[0, :, :n]
        return keys, values

    def _flush_batch(self, states: list[SequenceState]) -> None:
        """Encode the pending context entries of ``states`` in one forward (each as one padded row)."""
        if len(states) <= 1:
            for state in states:
                self.flush(state)
            return
        from transformers import DynamicCache

        device = self.device
        contexts = [state.context.encoded for state in states]
        width_c = max(contexts)
        width_q = max(state.context.pending for state in states)
        k = len(states)
        ids = torch.full((k, width_q), self.model.mask_token_id, dtype=torch.long, device=device)
        pos = torch.zeros((k, width_q), dtype=torch.long, device=device)
        mask = torch.zeros((k, width_c + width_q), dtype=torch.long, device=device)
        rows = [(state, None, 0) for state in states]
        for row, state in enumerate(states):
            cache = state.context
            q = cache.pending
            ids[row, :q] = cache.tokens[cache.encoded :].to(device)
            pos[row, :q] = cache.positions[cache.encoded :].to(device)
            pos[row, q:] = pos[row, q - 1]
            mask[row, : contexts[row]] = 1
            mask[row, width_c : width_c + q] = 1
        layers = [self._contexts(rows, index, width_c) for index in range(self._layers or 0)]
        batch_cache = DynamicCache(layers)
        scores = self.run_network(ids, pos, mask, batch_cache)
        fed = {state: state.context.pending for state in states}
        self.served(
            fed, padded=k * width_q - sum(fed.values()), pairs=k * width_q * (width_c + width_q), keys=k * width_c
        )
        for row, state in enumerate(states):
            cache = state.context
            q = cache.pending
            self._copied(state, 2 * contexts[row], q)
            dynamic = cache.store.cache
            for index, layer in enumerate(batch_cache.layers):
                dynamic.update(
                    layer.keys[row : row + 1, :, width_c : width_c + q],
                    layer.values[row : row + 1, :, width_c : width_c + q],
                    index,
                )
            cache.mark_encoded(scores[row, q - 1])

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
