"""The ``branch`` engine: many sequences, parallel branches as attention masks, keys/values on pages.

Each :meth:`BranchEngine.run` is one model forward serving one pending
:class:`~refusion.decoding.protocol.ModelCall` of every given sequence. Each sequence
owns a block table of pages (:mod:`refusion.cache.paged`): its encoded context
sits in columns ``0:len`` and is never copied. For the call, every row
lays out its queries - pending context tokens, then the tokens of each
extend - and the keys/values of the branches those extends continue are
written once into scratch columns right after its context. A boolean mask lets each query see its own
context, the pending tokens, its branch's scratch span and, causally, the
tokens of its own extend: branches of one sequence share the cached prefix
instead of repeating it.

On transformers models the forward is *packed* (:mod:`refusion.engines.ragged`):
all rows' queries form one row of tokens, so no sequence is padded to another
(a verify call is never padded to another row's plan), and attention gathers
each row's keys from its pages. Other adapters get rows padded to the widest
with a 4-D mask over a dense copy of the rows' contexts made for the forward.

Writes are O(new tokens): the model writes the fed tokens' keys/values into
their pages in place; committing copies only the committed tokens;
truncation is a length change. Sequences join (:meth:`~BranchEngine.admit`)
when the pages they may need fit the engine's memory budget
(:meth:`~BranchEngine.admission`) and leave (:meth:`~BranchEngine.release`)
between forwards, giving their pages back: no other sequence's entries move.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch

from refusion.cache.budget import default_kv_memory
from refusion.cache.paged import PagedKV, PagedStore, TableReader
from refusion.cache.pages import PAGE_SIZE, PagePool
from refusion.cache.prefix import PrefixCache
from refusion.cache.sequence import SequenceCache
from refusion.decoding.protocol import ExtendOutput, ModelCall
from refusion.engines.base import Engine, SequenceState
from refusion.models.base import exclusive
from refusion.plugins import hookimpl

CUSTOM_MASK_ATTENTION = ("sdpa", "eager")


class _ScratchCache:
    """The cache object the network sees during one padded call: writes new keys/values at slots
    ``start:start+q`` of a dense ``(layers, 2, rows, heads, capacity, dim)`` tensor."""

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
    """A sequence of the branch engine: its context lives in the pages of ``store.table``.

    ``prompt``: its prompt ids while its full pages may still be published to the engine's prefix cache
    (``None`` once they were, or when the engine keeps none)."""

    store: PagedStore
    prompt: torch.Tensor | None = None


def attention_implementation(model: Any) -> str:
    from refusion.engines.ragged import own_attention

    return own_attention(getattr(getattr(model, "model", None), "config", None))


class BranchEngine(Engine):
    """Runs one model call per sequence in a single forward (causal models that state their KV shape).

    Keys and values live in pages of ``page_size`` tokens (:mod:`refusion.cache.paged`), at most ``kv_memory`` bytes
    of them (default: :func:`~refusion.cache.budget.default_kv_memory` of the device). A sequence is admitted when
    the pages it may need fit beside the running ones' (:meth:`admission`); a running sequence is never refused a
    page short of the device running out of memory. ``prefix_cache``: reuse the keys and values of prompts' full
    pages across sequences (:mod:`refusion.cache.prefix`): a sequence whose prompt starts like an earlier one's
    starts its table with those pages (its tokens are not fed, nothing is copied), its own prompt's pages are
    published once encoded, and pages only the cache holds are evicted when the budget needs them. Not with
    ``batch_invariant``: a reused prefix was computed in another forward's shape.
    """

    name = "branch"
    priority = 20

    def __init__(
        self,
        model: Any,
        *,
        packed: bool | None = None,
        batch_invariant: bool = False,
        prefix_cache: bool = False,
        kv_memory: int | None = None,
        page_size: int = PAGE_SIZE,
        paged_kernel: bool | None = None,
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
        if kv_memory is not None:
            check_integer("kv_memory", kv_memory, 1)
        check_integer("page_size", page_size, 1)
        self.prefix_cache = bool(prefix_cache)
        reason = supports(model)
        if packed and reason:
            raise ConfigError(f"`packed` forwards cannot run on {type(model).__name__}: {reason}.", param="packed")
        #: packed forwards (no padding; HF models with attention functions) or padded rows with a 4-D mask
        self.packed = reason is None if packed is None else packed
        #: packed forwards attend with the paged Triton kernel (each row's keys read from its pages in place)
        #: instead of gathering them for ``scaled_dot_product_attention``
        self.paged_kernel = self._paged_kernel(paged_kernel, batch_invariant)
        layers, heads, dim, dtype = model.kv_shape()
        budget = kv_memory if kv_memory is not None else default_kv_memory(self.device)
        pool = PagePool.for_budget(
            layers, heads, dim, budget, page_size=page_size, dtype=dtype, device=self.device, counters=self.counters
        )
        #: the prompts' pages shared across sequences, when ``prefix_cache``
        self.prefixes: PrefixCache | None = PrefixCache(pool) if self.prefix_cache else None
        #: the pages every sequence's keys and values live in (the pool grows to the budget as they are taken)
        self.kv = PagedKV(pool, self.prefixes)
        #: pages each live sequence was admitted for
        self.reserved: dict[SequenceState, int] = {}

    def _paged_kernel(self, wanted: bool | None, batch_invariant: bool) -> bool:
        """Whether packed forwards use the paged kernel: by default on CUDA where Triton runs; ``True`` forces it
        (Triton's interpreter on the CPU), refused with ``batch_invariant`` (its rows attend one call each)."""
        from refusion.errors import ConfigError
        from refusion.validators import check_boolean
        from refusion_kernels import triton_available

        if wanted is None:
            return (
                self.packed and not batch_invariant and torch.device(self.device).type == "cuda" and triton_available()
            )
        check_boolean("paged_kernel", wanted)
        if wanted and (batch_invariant or not self.packed or not triton_available()):
            why = (
                "`batch_invariant` attends each row in a call of its own"
                if batch_invariant
                else "forwards are not packed on this model"
                if not self.packed
                else "Triton cannot run here (no GPU, TRITON_INTERPRET unset)"
            )
            raise ConfigError(f"`paged_kernel` cannot be used: {why}.", param="paged_kernel")
        return wanted

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

    # -- admission -------------------------------------------------------------------
    def reservation(self, prompt_length: int, region_length: int) -> int:
        """Pages a sequence is admitted for: its prompt and region, and the region again for the branches and
        drafts a forward feeds past its context (plus one page for the partial ones)."""
        return self.kv.pages_for(prompt_length + 2 * region_length) + 1

    def kv_pages(self) -> tuple[int, int]:
        return self.kv.pool.used, self.kv.pool.limit

    def admission(self, prompt_length: int, region_length: int, *, alone: bool = False) -> str | None:
        need = self.reservation(prompt_length, region_length)
        limit = self.kv.pool.limit
        held = 0 if alone else sum(self.reserved.values())
        if held + need <= limit:
            return None
        page = self.kv.pool.page_bytes
        return (
            f"a prompt of {prompt_length} tokens generating {region_length} needs {need} pages of keys/values "
            f"({need * page} bytes); {limit - held} of the budget's {limit} are free (raise `kv_memory`)"
        )

    # -- rows ----------------------------------------------------------------------
    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        counters = self.new_counters()
        store = PagedStore(self.kv, counters)
        cache = SequenceCache(store, prompt, torch.arange(prompt.shape[0]))
        state = BranchSequence(cache, counters, prompt.shape[0], region_length)
        state.store = store
        self.reserved[state] = self.reservation(prompt.shape[0], region_length)
        if self.prefixes is not None:
            try:
                self._reuse_prefix(state, prompt)
            except BaseException:
                self.release(state)  # the sequence was never admitted: its pages are free again
                raise
        return state

    # -- prefixes shared across sequences ----------------------------------------------
    def _reuse_prefix(self, state: BranchSequence, prompt: torch.Tensor) -> None:
        """Start the new sequence's table with the cached pages of ``prompt``'s longest cached prefix (shared, not
        copied); mark them encoded."""
        prefixes = cast(PrefixCache, self.prefixes)
        hit = prefixes.match(prompt)
        state.prompt = prompt
        prefixes.expect(state, prompt)
        if hit.tokens:
            self.kv.share(state.store.table, hit.pages)
            state.context.reuse(hit.tokens)

    def awaited_prefix(self, prompt: torch.Tensor) -> int:
        return self.prefixes.awaited(prompt) if self.prefixes is not None else 0

    def _publish(self, states: list[BranchSequence]) -> None:
        """Publish the prompt pages of the sequences whose prompts are encoded now (by reference)."""
        if self.prefixes is None:
            return
        for state in states:
            table = state.store.table
            if state.prompt is None or table.length < state.prompt_length:
                continue
            full = state.prompt_length // self.kv.page_size
            self.prefixes.publish(state.prompt, table.pages[:full])
            table.shared = max(table.shared, full)  # the cache holds them now: copied before any rewrite
            self.prefixes.forget(state)
            state.prompt = None

    def release(self, state: SequenceState) -> None:
        if state.released:
            return
        super().release(state)
        if self.prefixes is not None:
            self.prefixes.forget(state)
        self.reserved.pop(state, None)
        cast(BranchSequence, state).store.detach()

    # -- running -------------------------------------------------------------------
    @torch.no_grad()
    def run(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        """One forward for the given sequences' calls; returns their outputs by sequence."""
        self.epoch.value += 1
        states = list(cast("Mapping[BranchSequence, ModelCall]", calls))
        for state in states:  # the last forward's scratch pages (its outputs are not read any more)
            self.kv.trim(state.store.table)
        rows = [_Row.of(state, calls[state]) for state in states]
        if self.packed:
            return self._run_packed(rows)
        if self.batch_invariant and len(rows) > 1:  # padding to the widest row changes each row's sums
            return {s: out for row in rows for s, out in self._run_padded([row]).items()}
        return self._run_padded(rows)

    def run_columns(self, states: list[BranchSequence], tokens: torch.Tensor, counts: torch.Tensor) -> Any:
        """One packed forward for whole-batch decode loops (:mod:`refusion.decoding.columnar`).

        Row ``i`` feeds ``tokens[i, :counts[i]]`` (host tensors: ids ``(rows, width)``, counts ``(rows,)``)
        right after its cached entries, causally, at positions equal to their columns (a left-to-right cache:
        entry ``j`` at position ``j``). Returns the :class:`~refusion.decoding.scores.Scores` of the packed
        tokens, row after row. Nothing is committed: :meth:`keep_columns` says how many of each row's fed tokens
        stay cached. Counts the forward in the engine's totals only (the loop counts its rows' own).
        """
        starts = np.array([state.store.table.length for state in states], dtype=np.int64)
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
        rows in ``states`` order) belongs to row ``row_of[t]``, sits at ``positions[t]`` and is written at column
        ``columns[t]`` of its sequence; it sees its row's first ``contexts[row]`` columns and the columns ``lows[t]
        .. columns[t]`` (a chain fed after the context: ``lows`` the chain's first column; parallel branches: each
        its own first column). Returns the :class:`~refusion.decoding.scores.Scores` of the tokens, in order.
        Lengths are not changed (:meth:`hold_columns`); counts the forward in the engine's totals only.
        """
        from refusion.engines.ragged import RaggedLayout

        self.epoch.value += 1
        kv, device = self.kv, self.device
        n = len(states)
        tables = [state.store.table for state in states]
        per_row = np.bincount(row_of, minlength=n)
        n_max = int(per_row.max())
        keys = int(columns.max()) + 1
        size = kv.page_size
        last_written: np.ndarray = np.zeros(n, dtype=np.int64)
        np.maximum.at(last_written, row_of, columns)
        held = np.fromiter((len(table.pages) for table in tables), np.int64, n) * size
        for r in np.nonzero(held <= last_written)[0].tolist():  # rows whose writes reach past their pages
            kv.ensure(tables[r], int(last_written[r]) + 1, states[r].counters)
        if any(table.shared for table in tables):  # pages others hold too: copied before they are written
            first_written: np.ndarray = np.full(n, keys, dtype=np.int64)
            np.minimum.at(first_written, row_of, columns)
            for r, table in enumerate(tables):
                if table.shared and first_written[r] < table.shared * size:
                    kv.own_from(table, int(first_written[r]), states[r].counters)
        first = np.cumsum(per_row) - per_row
        local = np.arange(len(row_of)) - first[row_of]
        base = kv.first_slot(tables[0], keys) if n == 1 else None
        if self.paged_kernel:  # each token's two spans: its row's context, and its chain or branch
            spans = np.stack(
                [np.stack([np.zeros_like(lows), contexts[row_of]], 1), np.stack([lows, columns + 1], 1)], 1
            )
            layout = self._kernel_layout(tables, keys, n, n_max, row_of, columns, spans)
        elif (
            base is not None
            and np.array_equal(columns, np.arange(columns[0], columns[0] + len(columns)))
            and (lows == contexts[0]).all()
        ):  # one causal chain right after the context, on consecutive pages
            count = len(columns)
            mask = None if count == 1 else torch.ones(count, keys, dtype=torch.bool, device=device).tril(keys - count)
            span = (int(columns[0]), keys)
            layout = RaggedLayout(
                1, n_max, None, None, None, None if mask is None else mask[None, None], keys, base=base, span=span
            )
        else:
            low: np.ndarray = np.zeros((n, n_max), dtype=np.int64)
            high: np.ndarray = np.zeros((n, n_max), dtype=np.int64)  # padding queries see column 0 only
            low[row_of, local], high[row_of, local] = lows, columns
            on = functools.partial(torch.as_tensor, device=device)
            if torch.device(device).type == "cpu":  # the host is the device: numpy is quicker on arrays this small
                visible = torch.from_numpy(_visible(contexts[:n], low, high, np.arange(keys))).to(device)
            else:  # only the intervals travel; the mask is made on the device
                visible = _visible(on(contexts[:n]), on(low), on(high), torch.arange(keys, device=device))
            if base is not None:
                reads, writes = None, on(base + columns)
            else:
                slots = kv.slot_index(tables, keys)
                reads, writes = on(slots), on(slots[row_of, columns])
            layout = RaggedLayout(
                n,
                n_max,
                None if n == 1 else on(row_of * n_max + local),
                on(row_of),
                on(columns),
                visible[:, None],
                keys,
                writes=writes,
                reads=reads,
                base=base,
            )
        scores = self._packed_forward(ids, torch.from_numpy(positions), layout)
        pairs = int((columns - lows + 1).sum() + contexts[row_of].sum())
        self.counted(n, int(ids.shape[0]), pairs=pairs, keys=int(contexts.sum()))
        return scores

    def _kernel_layout(self, tables, keys, n, n_max, row_of, columns, spans) -> Any:
        """The layout of a forward attended by the paged kernel: no gathered slots, no dense mask."""
        from refusion.engines.ragged import RaggedLayout

        kv, on = self.kv, functools.partial(torch.as_tensor, device=self.device)
        pages = kv.page_table(tables, keys)
        size = kv.page_size
        writes = pages[row_of, columns // size] * size + columns % size
        return RaggedLayout(
            n,
            n_max,
            None,
            on(row_of),
            on(columns),
            None,
            keys,
            writes=on(writes),
            pages=on(pages),
            spans=on(spans),
            page_size=size,
        )

    def keep_columns(self, states: list[BranchSequence], kept: list[int]) -> None:
        """After :meth:`run_columns`: the first ``kept[i]`` fed tokens of row ``i`` stay cached (the rest of what
        it fed is dropped: a length change and its pages given back, no copy)."""
        size = self.kv.page_size
        for state, k in zip(states, kept):
            table = state.store.table
            table.length += k
            if len(table.pages) * size >= table.length + size:  # a page past the kept columns
                self.kv.trim(table)
        self._publish(states)

    def hold_columns(self, states: list[BranchSequence], used: list[int]) -> None:
        """Row ``i`` (``states`` order) uses its first ``used[i]`` columns: what lies there is kept (a loop's
        uncommitted branches included); the pages past them are given back."""
        for state, u in zip(states, used):
            table = state.store.table
            table.length = u
            self.kv.trim(table)
        self._publish(states)

    def _write_parents(self, rows: list[_Row]) -> None:
        """Write every row's parent branches' keys/values into its scratch columns, right after its context."""
        for row in rows:
            for parent in row.parents:
                self.kv.write(
                    row.state.store.table, row.context + row.parent_at[id(parent)], parent.kv.data, row.state.counters
                )

    def _run_packed(self, rows: list[_Row]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        """Every row's queries packed into one row of tokens; each row's scratch and queries after its own
        context, on its own pages."""
        from refusion.engines.ragged import RaggedLayout

        kv, device = self.kv, self.device
        n_rows = len(rows)
        tables = [row.state.store.table for row in rows]
        for row, table in zip(rows, tables):
            kv.ensure(table, row.context + row.width + row.n, row.state.counters)
        self._write_parents(rows)
        n_max = max(row.n for row in rows)
        keys = max(row.context + row.width + row.n for row in rows)

        ids = torch.cat([row.ids() for row in rows]) if n_rows > 1 else rows[0].ids()
        pos = torch.cat([row.pos() for row in rows]) if n_rows > 1 else rows[0].pos()
        # each packed token's row, its index within the row, and each row's first query column
        row_of = torch.cat([torch.full((row.n,), r, dtype=torch.long) for r, row in enumerate(rows)])
        local = torch.cat([torch.arange(row.n) for row in rows])
        q0 = torch.tensor([row.context + row.width for row in rows])
        if self.paged_kernel:
            column = (q0[row_of] + local).numpy()
            spans = _packed_spans(rows, row_of, local, q0).numpy()
            layout = self._kernel_layout(tables, keys, n_rows, n_max, row_of.numpy(), column, spans)
        elif n_rows == 1:  # one row: its tokens take consecutive columns; a causal mask unless branches are involved
            row = rows[0]
            start = row.context + row.width
            if row.width == 0 and len(row.call.extends) == 1:
                mask = (
                    None
                    if row.n == 1
                    else torch.ones(row.n, keys, dtype=torch.bool, device=device).tril(keys - row.n)[None, None]
                )
            else:
                mask = _packed_mask(rows, row_of, local, q0, n_max, keys, device)
            base = kv.first_slot(tables[0], keys)
            if base is not None:
                layout = RaggedLayout(1, n_max, None, None, None, mask, keys, base=base, span=(start, keys))
            else:
                slots = kv.slot_index(tables, keys)
                on = functools.partial(torch.as_tensor, device=device)
                layout = RaggedLayout(
                    1, n_max, None, None, None, mask, keys, writes=on(slots[0, start:keys]), reads=on(slots)
                )
        else:
            mask = _packed_mask(rows, row_of, local, q0, n_max, keys, device)
            column = q0[row_of] + local
            slots = torch.from_numpy(kv.slot_index(tables, keys))
            layout = RaggedLayout(
                n_rows,
                n_max,
                (row_of * n_max + local).to(device),
                row_of.to(device),
                column.to(device),
                mask,
                keys,
                writes=slots[row_of, column].to(device),
                reads=slots.to(device),
            )
        scores = self._packed_forward(ids, pos, layout)
        self.served(
            {row.state: row.n for row in rows},
            pairs=sum(row.n * (row.context + row.width + row.n) for row in rows),
            keys=sum(row.context + row.width for row in rows),
        )
        outputs: dict[SequenceState, tuple[ExtendOutput, ...]] = {}
        start = 0
        for row, table in zip(rows, tables):
            state, cache = row.state, row.state.context
            state.counters.copied(new=row.n * kv.token_bytes)  # the model's in-place writes of the fed tokens
            base = row.context + row.width
            if row.pending:
                if row.width:  # the pending entries go right after the context, before the parents' scratch
                    kv.write(table, row.context, kv.entries(table, base, base + row.pending), state.counters)
                table.length = row.context + row.pending
                cache.mark_encoded(scores[start + row.pending - 1])
            reader = TableReader(kv, table)
            outputs[state] = tuple(
                ExtendOutput(e, scores[start + a : start + b], reader, 0, base + a, self.epoch, self.epoch.value)
                for e, (a, b) in zip(row.call.extends, row.spans)
            )
            start += row.n
        self._publish([row.state for row in rows])
        return outputs

    def _packed_forward(self, ids: torch.Tensor, positions: torch.Tensor, layout: Any) -> Any:
        """The network over packed tokens ``ids`` at ``positions`` (1-D, host) under ``layout`` (a
        :class:`~refusion.engines.ragged.RaggedLayout`), keys/values written into the pages; its Scores."""
        from refusion.engines.ragged import RaggedCache, switched

        device = self.device
        with exclusive(self.model), switched(self.model.model.config):  # no other forward may see the switched config
            return self.run_network(
                ids[None].to(device),
                positions[None].to(device),
                {"full_attention": layout, "sliding_attention": layout},
                RaggedCache(self.kv.pool.slots, layout),
            )[0]

    def _run_padded(self, rows: list[_Row]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        """Adapters without attention functions: rows padded to the widest, one 4-D mask, over a dense copy of the
        rows' contexts made for this forward (scratch after the longest context); the fed entries that stay are
        written back to the pages."""
        kv, device = self.kv, self.device
        n_rows = len(rows)
        start = max(row.context for row in rows)
        width = max(row.width for row in rows)
        q_max = max(row.n for row in rows)
        query_at = start + width
        layers, two, _, heads, dim = kv.pool.slots.shape
        dense = kv.pool.data.new_zeros((layers, two, n_rows, heads, query_at + q_max, dim))
        for r, row in enumerate(rows):
            if row.context:
                dense[:, :, r, :, : row.context] = kv.entries(row.state.store.table, 0, row.context)
        self._write_dense_parents(dense, rows, start)

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

        scratch = _ScratchCache(dense, n_rows, query_at, q_max)
        scores = self.run_network(ids.to(device), pos.to(device), self._mask_for_model(mask.to(device)), scratch)
        fed: dict[SequenceState, int] = {row.state: row.n for row in rows}
        self.served(
            fed,
            padded=n_rows * q_max - sum(fed.values()),
            pairs=n_rows * q_max * (query_at + q_max),
            keys=n_rows * query_at,
        )
        outputs: dict[SequenceState, tuple[ExtendOutput, ...]] = {}
        for r, row in enumerate(rows):
            state, cache = row.state, row.state.context
            state.counters.copied(new=row.n * kv.token_bytes)
            if row.pending:
                table = state.store.table
                kv.write(table, row.context, dense[:, :, r, :, query_at : query_at + row.pending], state.counters)
                table.length = row.context + row.pending
                cache.mark_encoded(scores[r, row.pending - 1])
            outputs[state] = tuple(
                ExtendOutput(e, scores[r, a:b], dense, r, query_at + a, self.epoch, self.epoch.value)
                for e, (a, b) in zip(row.call.extends, row.spans)
            )
        self._publish([row.state for row in rows])
        return outputs

    def _write_dense_parents(self, dense: torch.Tensor, rows: list[_Row], start: int) -> None:
        """Scatter every row's parent branches' keys/values into the dense copy's scratch columns after ``start``
        (one kernel call)."""
        src, row_idx, col_idx = [], [], []
        for r, row in enumerate(rows):
            for parent in row.parents:
                n = len(parent)
                src.append(parent.kv.data)
                row_idx.append(torch.full((n,), r, dtype=torch.long))
                col_idx.append(torch.arange(n) + start + row.parent_at[id(parent)])
                row.state.counters.copied(new=n * self.kv.token_bytes)
        if src:
            from refusion_kernels import scatter_kv

            scatter_kv(dense, torch.cat(src, dim=3), torch.cat(row_idx), torch.cat(col_idx))

    def _mask_for_model(self, mask: torch.Tensor) -> torch.Tensor:
        """sdpa takes the boolean mask; eager attention needs an additive float mask."""
        if attention_implementation(self.model) == "eager":
            dtype = self.kv.pool.data.dtype
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


def _visible(contexts: Any, low: Any, high: Any, columns: Any) -> Any:
    """``(rows, n_max, keys)``: whether key column ``c`` is visible to each query: inside its row's first
    ``contexts[row]`` columns or inside ``[low, high]`` (numpy arrays or tensors alike)."""
    cols = columns[None, None, :]
    return (cols < contexts[:, None, None]) | ((cols >= low[:, :, None]) & (cols <= high[:, :, None]))


def _packed_spans(rows: list[_Row], row_of, local, q0) -> torch.Tensor:
    """``(T, 4, 2)`` host tensor: the column spans ``[lo, hi)`` each packed query sees: its row's context, the
    pending tokens, its branch's parent span and, causally, its own extend (empty spans: ``lo == hi``)."""
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
    lows = torch.stack([torch.zeros_like(base), base, par_lo, base + span_lo], 1)
    highs = torch.stack([context, base + pend_hi, par_hi, base + local + 1], 1)
    return torch.stack([lows, highs], 2)


def _packed_mask(rows: list[_Row], row_of, local, q0, n_max: int, keys: int, device: Any) -> torch.Tensor:
    """``(rows, 1, n_max, keys)`` on ``device``: the columns each packed query's spans (:func:`_packed_spans`) make
    visible; padding queries see column 0 only. The spans travel to the device, the mask is made there."""
    spans = _packed_spans(rows, row_of, local, q0).to(device)
    cols = torch.arange(keys, device=device)[None, None, :]
    visible = ((cols >= spans[:, :, :1]) & (cols < spans[:, :, 1:])).any(dim=1)
    mask = torch.zeros(len(rows) * n_max, keys, dtype=torch.bool, device=device)
    mask[:, 0] = True
    mask[(row_of * n_max + local).to(device)] = visible
    return mask.view(len(rows), 1, n_max, keys)


@hookimpl
def register_engines(register):
    register(BranchEngine)
