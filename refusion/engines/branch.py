"""The ``branch`` engine: many sequences, parallel branches as attention masks, one preallocated cache.

Each :meth:`BranchEngine.run` is one model forward serving one pending
:class:`~refusion.protocol.ModelCall` of every given sequence. Each sequence
owns a row of a :class:`~refusion.cache.stores.PreallocatedKV`: its encoded
context sits in slots ``0:len`` and is never copied. For the call, every row
packs its queries - pending context tokens, then the tokens of each extend -
and the keys/values of the branches those extends continue are written once
into a scratch area after the longest context. A 4-D boolean mask lets each
query see its own context, the pending tokens, its branch's scratch span and,
causally, the tokens of its own extend: branches of one sequence share the
cached prefix instead of repeating it.

Writes are O(new tokens): the model writes the fed tokens' keys/values into the
scratch slots in place; committing copies only the committed tokens
(``refusion_kernels.scatter_kv``); truncation is a length change. Sequences
join (:meth:`~BranchEngine.admit`) and leave (:meth:`~BranchEngine.release`)
between forwards; the live rows are kept contiguous by moving the last row
into a freed one.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from refusion.cache.sequence import SequenceCache
from refusion.cache.stores import PreallocatedKV, RowStore
from refusion.engines.base import Engine, SequenceState
from refusion.plugins import hookimpl
from refusion.protocol import ExtendOutput, ModelCall

CUSTOM_MASK_ATTENTION = ("sdpa", "eager")


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


class BranchSequence(SequenceState):
    """A sequence of the branch engine: its context lives in row ``store.row`` of the shared buffer."""

    store: RowStore


def attention_implementation(model: Any) -> str:
    config = getattr(getattr(model, "model", None), "config", None)
    return getattr(config, "_attn_implementation", None) or "sdpa"


class BranchEngine(Engine):
    """Runs one model call per sequence in a single forward (causal models that state their KV shape).

    ``rows`` is the initial number of rows of the buffer; it doubles when a
    sequence is admitted and none is free.
    """

    name = "branch"
    priority = 20

    def __init__(self, model: Any, *, rows: int = 1):
        super().__init__(model)
        self.initial_rows = max(1, int(rows))
        self.buffer: PreallocatedKV | None = None
        self.by_row: dict[int, BranchSequence] = {}

    @classmethod
    def unsupported(cls, model: Any) -> str | None:
        caps = model.capabilities
        if not caps.causal or not caps.kv_cache:
            return "it needs a causal model with a key/value cache"
        try:
            model.kv_shape()
        except NotImplementedError:
            return "the model adapter does not state its key/value shape (`kv_shape`)"
        impl = attention_implementation(model)
        if impl not in CUSTOM_MASK_ATTENTION:
            return f"attention implementation {impl!r} cannot apply custom 4-D masks (sdpa and eager can)"
        return None

    # -- rows ----------------------------------------------------------------------
    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        need = prompt.shape[0] + region_length
        if self.buffer is None:
            layers, heads, dim, dtype = self.model.kv_shape()
            self.buffer = PreallocatedKV(layers, self.initial_rows, heads, need, dim, dtype=dtype,
                                         device=self.model.device, counters=self.counters)
        row = self.buffer.allocate(need)
        counters = self.new_counters()
        store = RowStore(self.buffer, row, counters)
        state = BranchSequence(SequenceCache(store, prompt, torch.arange(prompt.shape[0])), counters,
                               prompt.shape[0], region_length)
        state.store = store
        self.by_row[row] = state
        return state

    def release(self, state: SequenceState) -> None:
        if state.released:
            return
        super().release(state)
        store: RowStore = state.store
        row = store.row
        store.detach()
        del self.by_row[row]
        self.buffer.free(row)
        last = max(self.by_row, default=-1)
        if last > row:  # keep the live rows contiguous: the last one moves into the hole
            moved = self.by_row.pop(last)
            self.buffer.move(last, row, moved.counters)
            moved.store.row = row
            self.by_row[row] = moved

    def _place(self, states: list[BranchSequence]) -> None:
        """Make ``states`` occupy rows ``0:len(states)`` (swapping rows when a caller runs a subset)."""
        for target, state in enumerate(states):
            row = state.store.row
            if row == target:
                continue
            other = self.by_row.get(target)
            buf = self.buffer
            if other is None:  # a free row
                buf.move(row, target, state.counters)
                del self.by_row[row]
            else:  # swap the two rows through a copy of one of them
                n_other = buf.lengths[target]
                saved = buf.data[:, :, target, :, :n_other].clone()
                n = buf.lengths[row]
                buf.data[:, :, target, :, :n] = buf.data[:, :, row, :, :n]
                buf.data[:, :, row, :, :n_other] = saved
                buf.lengths[target], buf.lengths[row] = n, n_other
                state.counters.copied(context=n * buf.token_bytes)
                other.counters.copied(context=2 * n_other * buf.token_bytes)
                other.store.row = row
                self.by_row[row] = other
            state.store.row = target
            self.by_row[target] = state

    # -- running -------------------------------------------------------------------
    @torch.no_grad()
    def run(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        """One forward for the given sequences' calls; returns their outputs by sequence."""
        self.epoch.value += 1
        states: list[BranchSequence] = sorted(calls, key=lambda s: s.store.row)
        self._place(states)
        device = self.model.device
        buf = self.buffer
        rows = len(states)
        caches = [s.context for s in states]
        lengths = [c.encoded for c in caches]
        start = max(lengths)

        # Lay out each row: unique parent branches (keys/values written to scratch), then the queries.
        plans = []
        for cache, state in zip(caches, states):
            parents, parent_at, width = [], {}, 0
            for e in calls[state].extends:
                if len(e.parent) and id(e.parent) not in parent_at:
                    parent_at[id(e.parent)] = width
                    parents.append(e.parent)
                    width += len(e.parent)
            pending = cache.pending
            spans, q = [], pending
            for e in calls[state].extends:
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
                states[row].counters.copied(new=n * buf.token_bytes)
        if parent_src:
            from refusion_kernels import scatter_kv

            scatter_kv(buf.data, torch.cat(parent_src, dim=3), torch.cat(parent_rows), torch.cat(parent_cols))

        ids = torch.full((rows, q_max), self.model.mask_token_id, dtype=torch.long)
        pos = torch.zeros((rows, q_max), dtype=torch.long)
        mask = torch.zeros((rows, 1, q_max, query_at + q_max), dtype=torch.bool)
        causal = torch.tril(torch.ones(q_max, q_max, dtype=torch.bool))
        for row, (cache, state) in enumerate(zip(caches, states)):
            parents, parent_at, _w, pending, spans, q = plans[row]
            m = mask[row, 0]
            m[:q, : lengths[row]] = True  # the encoded context
            m[:, query_at : query_at + q_max] = torch.eye(q_max, dtype=torch.bool)  # padding rows see themselves
            if pending:
                ids[row, :pending] = cache.tokens[cache.encoded :]
                pos[row, :pending] = cache.positions[cache.encoded :]
                m[:pending, query_at : query_at + pending] = causal[:pending, :pending]
                m[pending:q, query_at : query_at + pending] = True
            for e, (a, b) in zip(calls[state].extends, spans):
                ids[row, a:b] = e.tokens.cpu()
                pos[row, a:b] = e.positions.cpu()
                m[a:b, query_at + a : query_at + b] = causal[: b - a, : b - a]
                if len(e.parent):
                    p0 = start + parent_at[id(e.parent)]
                    m[a:b, p0 : p0 + len(e.parent)] = True

        scratch = _ScratchCache(buf.data, rows, query_at, q_max)
        scores = self.model.scores(ids.to(device), pos.to(device), self._mask_for_model(mask.to(device)), scratch)
        fed = {state: plans[row][5] for row, state in enumerate(states)}
        self.served(fed, padded=rows * q_max - sum(fed.values()))
        for row, state in enumerate(states):  # the model's in-place writes of the fed tokens
            state.counters.copied(new=plans[row][5] * buf.token_bytes)

        outputs: dict[SequenceState, tuple[ExtendOutput, ...]] = {}
        layers = [(buf.data[layer, 0, :rows], buf.data[layer, 1, :rows]) for layer in range(buf.data.shape[0])]
        for row, (cache, state) in enumerate(zip(caches, states)):
            parents, parent_at, _w, pending, spans, q = plans[row]
            if pending:
                moved = buf.data[:, :, row, :, query_at : query_at + pending].clone()
                buf.write(row, lengths[row], moved, state.counters)
                buf.lengths[row] = lengths[row] + pending
                cache.mark_encoded(scores[row, pending - 1])
            outputs[state] = tuple(
                ExtendOutput(e, scores[row, a:b], layers, row, query_at + a, self.epoch, self.epoch.value)
                for e, (a, b) in zip(calls[state].extends, spans)
            )
        return outputs

    def _mask_for_model(self, mask: torch.Tensor) -> torch.Tensor:
        """sdpa takes the boolean mask; eager attention needs an additive float mask."""
        if attention_implementation(self.model) == "eager":
            dtype = self.buffer.data.dtype
            return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
        return mask


@hookimpl
def register_engines(register):
    register(BranchEngine)
