"""The ``branch`` engine: many sequences, parallel branches as attention masks, one preallocated cache.

Each :meth:`BranchEngine.run` is one model forward serving one pending
:class:`~refusion.decoding.protocol.ModelCall` of every given sequence. Each sequence
owns a row of a :class:`~refusion.cache.stores.PreallocatedKV`: its encoded
context sits in slots ``0:len`` and is never copied. For the call, every row
lays out its queries - pending context tokens, then the tokens of each
extend - and the keys/values of the branches those extends continue are
written once into scratch columns. A boolean mask lets each query see its own
context, the pending tokens, its branch's scratch span and, causally, the
tokens of its own extend: branches of one sequence share the cached prefix
instead of repeating it.

On transformers models the forward is *packed* (:mod:`refusion.engines.ragged`):
all rows' queries form one row of tokens, so no sequence is padded to another
(a verify call is never padded to another row's plan); each row's scratch
sits right after its own context, so the buffer holds what the contexts need.
Other adapters get rows padded to the widest with a 4-D mask, the scratch
after the longest context.

Writes are O(new tokens): the model writes the fed tokens' keys/values into the
scratch slots in place; committing copies only the committed tokens
(``refusion_kernels.scatter_kv``); truncation is a length change. Sequences
join (:meth:`~BranchEngine.admit`) and leave (:meth:`~BranchEngine.release`)
between forwards; the live rows are kept contiguous by moving the last row
into a freed one.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch

from refusion.cache.pages import PAGE_SIZE, PagePool
from refusion.cache.prefix import PrefixCache
from refusion.cache.sequence import SequenceCache
from refusion.cache.stores import PreallocatedKV, RowStore
from refusion.decoding.protocol import ExtendOutput, ModelCall
from refusion.engines.base import Engine, SequenceState
from refusion.models.base import exclusive
from refusion.plugins import hookimpl

CUSTOM_MASK_ATTENTION = ("sdpa", "eager")
#: the prefix cache's default budget (its pool grows to it as prompts are published)
PREFIX_CACHE_BYTES = 256 << 20


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
    """A sequence of the branch engine: its context lives in row ``store.row`` of the shared buffer.

    ``prompt``: its prompt ids while its full pages may still be published to the engine's prefix cache
    (``None`` once they were, or when the engine keeps none)."""

    store: RowStore
    prompt: torch.Tensor | None = None


def attention_implementation(model: Any) -> str:
    from refusion.engines.ragged import own_attention

    return own_attention(getattr(getattr(model, "model", None), "config", None))


class BranchEngine(Engine):
    """Runs one model call per sequence in a single forward (causal models that state their KV shape).

    ``rows`` is the initial number of rows of the buffer; it doubles when a
    sequence is admitted and none is free. ``prefix_cache``: reuse the keys and
    values of prompts' full pages across sequences (:mod:`refusion.cache.prefix`),
    in a pool of at most ``prefix_cache_bytes`` (default
    :data:`PREFIX_CACHE_BYTES`) of ``page_size``-token pages; a sequence's
    reused prefix is copied into its row at admission (its tokens are not fed),
    its own prompt published once encoded. Not with ``batch_invariant``: a reused
    prefix was computed in another forward's shape.
    """

    name = "branch"
    priority = 20

    def __init__(
        self,
        model: Any,
        *,
        rows: int = 1,
        packed: bool | None = None,
        batch_invariant: bool = False,
        prefix_cache: bool = False,
        prefix_cache_bytes: int | None = None,
        page_size: int = PAGE_SIZE,
    ):
        super().__init__(model, batch_invariant=batch_invariant)
        from refusion.engines.ragged import supports
        from refusion.errors import ConfigError
        from refusion.validators import check_boolean, check_integer

        check_boolean("prefix_cache", prefix_cache)
        if prefix_cache and batch_invariant:
            raise ConfigError(
                "`prefix_cache` cannot be combined with `batch_invariant`: a reused prefix was computed in another "
                "forward's shape.",
                param="prefix_cache",
            )
        if prefix_cache_bytes is not None:
            check_integer("prefix_cache_bytes", prefix_cache_bytes, 1)
        check_integer("page_size", page_size, 1)
        self.prefix_cache = bool(prefix_cache)
        self.prefix_cache_bytes = PREFIX_CACHE_BYTES if prefix_cache_bytes is None else prefix_cache_bytes
        self.page_size = page_size
        #: the prompts' pages shared across sequences (made with the buffer), when ``prefix_cache``
        self.prefixes: PrefixCache | None = None

        self.initial_rows = max(1, int(rows))
        self.buffer: PreallocatedKV | None = None
        self.by_row: dict[int, BranchSequence] = {}
        reason = supports(model)
        if packed and reason:
            from refusion.errors import ConfigError

            raise ConfigError(f"`packed` forwards cannot run on {type(model).__name__}: {reason}.", param="packed")
        #: packed forwards (no padding; HF models with attention functions) or padded rows with a 4-D mask
        self.packed = reason is None if packed is None else packed

    @property
    def kv(self) -> PreallocatedKV:
        """The buffer every sequence's keys and values live in (made when the first sequence is admitted)."""
        if self.buffer is None:
            raise RuntimeError("the branch engine has no buffer before a sequence is admitted")
        return self.buffer

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
            self.buffer = PreallocatedKV(
                layers, self.initial_rows, heads, need, dim, dtype=dtype, device=self.device, counters=self.counters
            )
            if self.prefix_cache:
                pool = PagePool.for_budget(
                    layers,
                    heads,
                    dim,
                    self.prefix_cache_bytes,
                    page_size=self.page_size,
                    dtype=dtype,
                    device=self.device,
                    counters=self.counters,
                )
                self.prefixes = PrefixCache(pool)
        row = self.kv.allocate(need)
        counters = self.new_counters()
        store = RowStore(self.kv, row, counters)
        cache = SequenceCache(store, prompt, torch.arange(prompt.shape[0]))
        state = BranchSequence(cache, counters, prompt.shape[0], region_length)
        state.store = store
        self.by_row[row] = state
        if self.prefixes is not None:
            try:
                self._reuse_prefix(state, prompt)
            except BaseException:
                self.release(state)  # the sequence was never admitted: its row is free again
                raise
        return state

    # -- prefixes shared across sequences ----------------------------------------------
    def _reuse_prefix(self, state: BranchSequence, prompt: torch.Tensor) -> None:
        """Copy the cached pages of ``prompt``'s longest cached prefix into the new row; mark them encoded."""
        prefixes = cast(PrefixCache, self.prefixes)
        hit = prefixes.match(prompt)
        state.prompt = prompt
        prefixes.expect(state, prompt)
        if hit.tokens:
            buf, n = self.kv, hit.tokens
            buf.data[:, :, state.store.row, :, :n] = prefixes.pool.read(list(hit.pages), n)
            buf.lengths[state.store.row] = n
            state.counters.copied(context=n * buf.token_bytes)
            state.context.reuse(n)

    def awaited_prefix(self, prompt: torch.Tensor) -> int:
        return self.prefixes.awaited(prompt) if self.prefixes is not None else 0

    def _publish(self, states: list[BranchSequence]) -> None:
        """Publish the prompt pages of the sequences whose prompts are encoded now (rows in ``states`` order)."""
        if self.prefixes is None:
            return
        buf = self.kv
        for state in states:
            if state.prompt is None or buf.lengths[state.store.row] < state.prompt_length:
                continue
            self.prefixes.publish(state.prompt, functools.partial(self._row_entries, state.store.row))
            self.prefixes.forget(state)
            state.prompt = None

    def _row_entries(self, row: int, start: int, stop: int) -> torch.Tensor:
        """Keys/values of buffer row ``row``'s entries ``start:stop``, ``(layers, 2, heads, n, dim)`` (a view)."""
        return self.kv.data[:, :, row, :, start:stop]

    def release(self, state: SequenceState) -> None:
        if state.released:
            return
        super().release(state)
        if self.prefixes is not None:
            self.prefixes.forget(state)
        store = cast(BranchSequence, state).store
        row = store.row
        store.detach()
        del self.by_row[row]
        self.kv.free(row)
        last = max(self.by_row, default=-1)
        if last > row:  # keep the live rows contiguous: the last one moves into the hole
            moved = self.by_row.pop(last)
            self.kv.move(last, row, moved.counters)
            moved.store.row = row
            self.by_row[row] = moved

    def _place(self, states: list[BranchSequence]) -> None:
        """Make ``states`` occupy rows ``0:len(states)`` (swapping rows when a caller runs a subset)."""
        for target, state in enumerate(states):
            row = state.store.row
            if row == target:
                continue
            other = self.by_row.get(target)
            buf = self.kv
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
        states = sorted(cast("Mapping[BranchSequence, ModelCall]", calls), key=lambda s: s.store.row)
        self._place(states)
        rows = [_Row.of(state, calls[state]) for state in states]
        if self.packed:
            return self._run_packed(rows)
        if (
            self.batch_invariant and len(rows) > 1
        ):  # padding to the widest row changes each row's sums: one forward each
            self.kv.ensure_capacity(max(row.context + row.width + row.n for row in rows))
            return {s: out for r, row in enumerate(rows) for s, out in self._run_padded([row], first=r).items()}
        return self._run_padded(rows)

    def run_columns(self, states: list[BranchSequence], tokens: torch.Tensor, counts: torch.Tensor) -> Any:
        """One packed forward for whole-batch decode loops (:mod:`refusion.decoding.columnar`).

        Row ``i`` feeds ``tokens[i, :counts[i]]`` (host tensors: ids ``(rows, width)``, counts ``(rows,)``)
        right after its cached entries, causally, at positions equal to their columns (a left-to-right cache:
        entry ``j`` at position ``j``). Returns the :class:`~refusion.decoding.scores.Scores` of the packed
        tokens, row after row. Nothing is committed: :meth:`keep_columns` says how many of each row's fed tokens
        stay cached. Counts the forward in the engine's totals only (the loop counts its rows' own).
        """
        n = len(states)
        if any(state.store.row != i for i, state in enumerate(states)):
            self._place(states)
        starts = np.array(self.kv.lengths[:n], dtype=np.int64)
        fed = counts.numpy()
        valid = np.arange(tokens.shape[1])[None, :] < fed[:, None]
        row_of, local = np.nonzero(valid)
        column = starts[row_of] + local
        ids = tokens[torch.from_numpy(valid)]
        return self.run_flat(states, ids, row_of, column, column, starts[row_of], starts)

    def run_flat(
        self,
        states: list[BranchSequence],
        ids: torch.Tensor,
        row_of: np.ndarray,
        positions: np.ndarray,
        columns: np.ndarray,
        lows: np.ndarray,
        contexts: np.ndarray,
    ) -> Any:
        """One packed forward of whole-batch loops: token ``t`` (ids ``(T,)``, numpy arrays ``(T,)`` grouped by row,
        rows in ``states`` order) belongs to row ``row_of[t]``, sits at ``positions[t]`` and is written at buffer
        column ``columns[t]``; it sees its row's first ``contexts[row]`` columns and the columns ``lows[t] ..
        columns[t]`` (a chain fed after the context: ``lows`` the chain's first column; parallel branches: each
        its own first column). Returns the :class:`~refusion.decoding.scores.Scores` of the tokens, in order.
        Lengths are not changed (:meth:`hold_columns`); counts the forward in the engine's totals only.
        """
        from refusion.engines.ragged import RaggedLayout

        self.epoch.value += 1
        if any(state.store.row != i for i, state in enumerate(states)):
            self._place(states)
        n = len(states)
        per_row = np.bincount(row_of, minlength=n)
        n_max = int(per_row.max())
        keys = int(columns.max()) + 1
        self.kv.ensure_capacity(keys)
        device = self.device
        first = np.cumsum(per_row) - per_row
        local = np.arange(len(row_of)) - first[row_of]
        if (
            n == 1
            and np.array_equal(columns, np.arange(columns[0], columns[0] + len(columns)))
            and (lows == contexts[0]).all()
        ):  # one causal chain right after the context
            count = len(columns)
            mask = None if count == 1 else torch.ones(count, keys, dtype=torch.bool).tril(keys - count)[None, None]
            span = (int(columns[0]), keys)
            layout = RaggedLayout(1, n_max, None, None, None, None if mask is None else mask.to(device), keys, span)
        else:
            low: np.ndarray = np.zeros((n, n_max), dtype=np.int64)
            high: np.ndarray = np.zeros((n, n_max), dtype=np.int64)  # padding queries see column 0 only
            low[row_of, local], high[row_of, local] = lows, columns
            cols = np.arange(keys)[None, None, :]
            visible = (cols < contexts[:n, None, None]) | ((cols >= low[:, :, None]) & (cols <= high[:, :, None]))
            single = n == 1
            layout = RaggedLayout(
                n,
                n_max,
                None if single else torch.from_numpy(row_of * n_max + local).to(device),
                torch.from_numpy(row_of).to(device),
                torch.from_numpy(columns).to(device),
                torch.from_numpy(visible[:, None]).to(device),
                keys,
            )
        scores = self._packed_forward(ids, torch.from_numpy(positions), layout)
        pairs = int((columns - lows + 1).sum() + contexts[row_of].sum())
        self.counted(n, int(ids.shape[0]), pairs=pairs, keys=int(contexts.sum()))
        return scores

    def keep_columns(self, states: list[BranchSequence], kept: list[int]) -> None:
        """After :meth:`run_columns`: the first ``kept[i]`` fed tokens of row ``i`` stay cached (the rest of what
        it fed is dropped: a length change, no copy)."""
        lengths = self.kv.lengths
        for i, k in enumerate(kept):
            lengths[i] += k
        self._publish(states)

    def hold_columns(self, states: list[BranchSequence], used: list[int]) -> None:
        """Row ``i`` (``states`` order, as placed by the last :meth:`run_flat`) uses its first ``used[i]`` columns:
        what lies there is kept when rows move or the buffer grows (a loop's uncommitted branches included)."""
        lengths = self.kv.lengths
        for i, u in enumerate(used):
            lengths[i] = u
        self._publish(states)

    def _write_parents(self, rows: list[_Row], column_of, first: int = 0) -> None:
        """Scatter every row's parent branches' keys/values into its scratch columns (one kernel call); ``rows[r]``
        is buffer row ``first + r``."""
        src, row_idx, col_idx = [], [], []
        buf = self.kv
        for r, row in enumerate(rows):
            for parent in row.parents:
                n = len(parent)
                src.append(parent.kv.data)
                row_idx.append(torch.full((n,), first + r, dtype=torch.long))
                col_idx.append(torch.arange(n) + column_of(row) + row.parent_at[id(parent)])
                row.state.counters.copied(new=n * buf.token_bytes)
        if src:
            from refusion_kernels import scatter_kv

            scatter_kv(buf.data, torch.cat(src, dim=3), torch.cat(row_idx), torch.cat(col_idx))

    def _run_packed(self, rows: list[_Row]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        """Every row's queries packed into one row of tokens; each row's keys after its own context."""
        from refusion.engines.ragged import RaggedLayout

        buf = self.kv
        device = self.device
        n_rows = len(rows)
        buf.ensure_capacity(max(row.context + row.width + row.n for row in rows))
        self._write_parents(rows, lambda row: row.context)
        n_max = max(row.n for row in rows)
        keys = max(row.context + row.width + row.n for row in rows)

        ids = torch.cat([row.ids() for row in rows]) if n_rows > 1 else rows[0].ids()
        pos = torch.cat([row.pos() for row in rows]) if n_rows > 1 else rows[0].pos()
        if n_rows == 1:  # one row: its tokens take consecutive columns; a causal mask unless branches are involved
            row = rows[0]
            if row.width == 0 and len(row.call.extends) == 1:
                mask = (
                    None
                    if row.n == 1
                    else torch.ones(row.n, keys, dtype=torch.bool, device=device).tril(keys - row.n)[None, None]
                )
            else:
                local = torch.arange(row.n)
                mask = _packed_mask(
                    rows, torch.zeros_like(local), local, torch.tensor([row.context + row.width]), n_max, keys
                ).to(device)
            layout = RaggedLayout(1, n_max, None, None, None, mask, keys, (row.context + row.width, keys))
        else:
            row_of = torch.cat([torch.full((row.n,), r, dtype=torch.long) for r, row in enumerate(rows)])
            local = torch.cat([torch.arange(row.n) for row in rows])
            q0 = torch.tensor([row.context + row.width for row in rows])
            mask = _packed_mask(rows, row_of, local, q0, n_max, keys).to(device)
            layout = RaggedLayout(
                n_rows,
                n_max,
                (row_of * n_max + local).to(device),
                row_of.to(device),
                (q0[row_of] + local).to(device),
                mask,
                keys,
            )
        scores = self._packed_forward(ids, pos, layout)
        self.served(
            {row.state: row.n for row in rows},
            pairs=sum(row.n * (row.context + row.width + row.n) for row in rows),
            keys=sum(row.context + row.width for row in rows),
        )
        layers = buf.data
        outputs: dict[SequenceState, tuple[ExtendOutput, ...]] = {}
        start = 0
        for r, row in enumerate(rows):
            state, cache = row.state, row.state.context
            state.counters.copied(new=row.n * buf.token_bytes)  # the model's in-place writes of the fed tokens
            base = row.context + row.width
            if row.pending:
                if row.width:  # the pending entries go right after the context, before the parents' scratch
                    moved = buf.data[:, :, r, :, base : base + row.pending].clone()
                    buf.write(r, row.context, moved, state.counters)
                buf.lengths[r] = row.context + row.pending
                cache.mark_encoded(scores[start + row.pending - 1])
            outputs[state] = tuple(
                ExtendOutput(e, scores[start + a : start + b], layers, r, base + a, self.epoch, self.epoch.value)
                for e, (a, b) in zip(row.call.extends, row.spans)
            )
            start += row.n
        self._publish([row.state for row in rows])
        return outputs

    def _packed_forward(self, ids: torch.Tensor, positions: torch.Tensor, layout: Any) -> Any:
        """The network over packed tokens ``ids`` at ``positions`` (1-D, host) under ``layout`` (a
        :class:`~refusion.engines.ragged.RaggedLayout`), keys/values written into the buffer; its Scores."""
        from refusion.engines.ragged import RaggedCache, switched

        device = self.device
        with exclusive(self.model), switched(self.model.model.config):  # no other forward may see the switched config
            return self.run_network(
                ids[None].to(device),
                positions[None].to(device),
                {"full_attention": layout, "sliding_attention": layout},
                RaggedCache(self.kv.data, layout),
            )[0]

    def _run_padded(self, rows: list[_Row], first: int = 0) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        """Adapters without attention functions: rows padded to the widest, one 4-D mask, scratch after the longest
        context; ``rows[r]`` is buffer row ``first + r``."""
        buf = self.kv
        device = self.device
        n_rows = len(rows)
        start = max(row.context for row in rows)
        width = max(row.width for row in rows)
        q_max = max(row.n for row in rows)
        query_at = start + width
        buf.ensure_capacity(query_at + q_max)
        self._write_parents(rows, lambda row: start, first)

        ids = torch.full((n_rows, q_max), self.model.mask_token_id, dtype=torch.long)
        pos = torch.zeros((n_rows, q_max), dtype=torch.long)
        mask = torch.zeros((n_rows, 1, q_max, query_at + q_max), dtype=torch.bool)
        causal = torch.tril(torch.ones(q_max, q_max, dtype=torch.bool))
        for r, row in enumerate(rows):
            m = mask[r, 0]
            m[: row.n, : row.context] = True  # the encoded context
            m[:, query_at : query_at + q_max] = torch.eye(q_max, dtype=torch.bool)  # padding rows see themselves
            ids[r, : row.n] = row.ids()
            pos[r, : row.n] = row.pos()
            p = row.pending
            if p:
                m[:p, query_at : query_at + p] = causal[:p, :p]
                m[p : row.n, query_at : query_at + p] = True
            for e, (a, b) in zip(row.call.extends, row.spans):
                m[a:b, query_at + a : query_at + b] = causal[: b - a, : b - a]
                if len(e.parent):
                    p0 = start + row.parent_at[id(e.parent)]
                    m[a:b, p0 : p0 + len(e.parent)] = True

        scratch = _ScratchCache(buf.data[:, :, first:], n_rows, query_at, q_max)
        scores = self.run_network(ids.to(device), pos.to(device), self._mask_for_model(mask.to(device)), scratch)
        fed: dict[SequenceState, int] = {row.state: row.n for row in rows}
        self.served(
            fed,
            padded=n_rows * q_max - sum(fed.values()),
            pairs=n_rows * q_max * (query_at + q_max),
            keys=n_rows * query_at,
        )
        layers = buf.data
        outputs: dict[SequenceState, tuple[ExtendOutput, ...]] = {}
        for r, row in enumerate(rows):
            state, cache = row.state, row.state.context
            state.counters.copied(new=row.n * buf.token_bytes)
            if row.pending:
                moved = buf.data[:, :, first + r, :, query_at : query_at + row.pending].clone()
                buf.write(first + r, row.context, moved, state.counters)
                buf.lengths[first + r] = row.context + row.pending
                cache.mark_encoded(scores[r, row.pending - 1])
            outputs[state] = tuple(
                ExtendOutput(e, scores[r, a:b], layers, first + r, query_at + a, self.epoch, self.epoch.value)
                for e, (a, b) in zip(row.call.extends, row.spans)
            )
        self._publish([row.state for row in rows])
        return outputs

    def _mask_for_model(self, mask: torch.Tensor) -> torch.Tensor:
        """sdpa takes the boolean mask; eager attention needs an additive float mask."""
        if attention_implementation(self.model) == "eager":
            dtype = self.kv.data.dtype
            return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
        return mask


class _Row:
    """One sequence's part of a forward: its parents' scratch span, then its queries (pending tokens first)."""

    __slots__ = ("state", "call", "context", "pending", "parents", "parent_at", "width", "spans", "n")
    state: BranchSequence
    call: ModelCall
    context: int
    pending: int
    parents: list[Any]
    parent_at: dict[int, int]
    width: int
    spans: list[tuple[int, int]]
    n: int

    @classmethod
    def of(cls, state: BranchSequence, call: ModelCall) -> _Row:
        row = cls()
        row.state, row.call = state, call
        cache = state.context
        row.context, row.pending = cache.encoded, cache.pending
        row.parents, row.parent_at, row.width = [], {}, 0
        for e in call.extends:
            if len(e.parent) and id(e.parent) not in row.parent_at:
                row.parent_at[id(e.parent)] = row.width
                row.parents.append(e.parent)
                row.width += len(e.parent)
        row.spans, q = [], row.pending
        for e in call.extends:
            row.spans.append((q, q + len(e.tokens)))
            q += len(e.tokens)
        row.n = q
        return row

    def ids(self) -> torch.Tensor:
        cache = self.state.context
        parts = [cache.tokens[cache.encoded :]] if self.pending else []
        parts += [e.tokens.cpu() for e in self.call.extends]
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def pos(self) -> torch.Tensor:
        cache = self.state.context
        parts = [cache.positions[cache.encoded :]] if self.pending else []
        parts += [e.positions.cpu() for e in self.call.extends]
        return torch.cat(parts) if len(parts) > 1 else parts[0]


def _packed_mask(rows: list[_Row], row_of, local, q0, n_max: int, keys: int) -> torch.Tensor:
    """``(rows, 1, n_max, keys)``: context, pending, parent span and causal self-span of each packed query.

    Built from four column intervals per query token, compared against the
    key columns at once; padding queries see column 0 only.
    """
    span_lo, par_lo, par_hi, pend_hi = [], [], [], []
    for row in rows:
        if row.pending:  # pending tokens: context plus themselves, causally
            span_lo.append(torch.zeros(row.pending, dtype=torch.long))
            par_lo.append(torch.zeros(row.pending, dtype=torch.long))
            par_hi.append(torch.zeros(row.pending, dtype=torch.long))
            pend_hi.append(torch.zeros(row.pending, dtype=torch.long))
        for e, (a, b) in zip(row.call.extends, row.spans):
            q = b - a
            span_lo.append(torch.full((q,), a, dtype=torch.long))
            at = row.context + row.parent_at[id(e.parent)] if len(e.parent) else 0
            par_lo.append(torch.full((q,), at, dtype=torch.long))
            par_hi.append(torch.full((q,), at + len(e.parent), dtype=torch.long))
            pend_hi.append(torch.full((q,), row.pending, dtype=torch.long))
    span_lo, par_lo, par_hi, pend_hi = (torch.cat(x) for x in (span_lo, par_lo, par_hi, pend_hi))
    context = torch.tensor([row.context for row in rows])[row_of]
    base = q0[row_of]
    cols = torch.arange(keys)[None, :]
    visible = cols < context[:, None]
    visible |= (cols >= base[:, None]) & (cols < (base + pend_hi)[:, None])
    visible |= (cols >= par_lo[:, None]) & (cols < par_hi[:, None])
    visible |= (cols >= (base + span_lo)[:, None]) & (cols <= (base + local)[:, None])
    mask = torch.zeros(len(rows) * n_max, keys, dtype=torch.bool)
    mask[:, 0] = True
    mask[row_of * n_max + local] = visible
    return mask.view(len(rows), 1, n_max, keys)


@hookimpl
def register_engines(register):
    register(BranchEngine)
