"""The forward every paged engine runs: tokens of many lanes, keys/values on pages, visibility as column spans.

:class:`PagedEngine` is the model runner under the ``branch``, ``canvas`` and ``block`` engines. They differ only in
how they lay a sequence's call out (:meth:`PagedEngine.lay_out`: which tokens, at which columns of the sequence's
block table, seeing which columns); the forward is this one. A :class:`~refusion.engines.feed.Feed` holds the tokens
of every lane of the step, whatever produced them (a sequence's program, a whole-batch algorithm), and
:meth:`PagedEngine.forward` runs them in one network call:

* room first: the pages every lane writes are taken from the engine's
  :class:`~refusion.cache.manager.KVManager` before the forward (copied first where shared with a prefix), then
  the feed's ``writes`` (a branch's parent keys/values) are put in their columns;
* on transformers networks that take attention functions the tokens are *packed* (:mod:`refusion.engines.ragged`):
  one row of ``T`` tokens for the linear layers, attention per lane over its pages, each token under the mask its
  spans make (or the paged Triton kernel reading the spans itself on CUDA);
* other adapters get the lanes padded to the widest, a dense copy of their columns and a 4-D mask built from the
  same spans; the fed tokens' keys/values are written back to their pages afterwards.

Either way the result is the :class:`~refusion.decoding.scores.Scores` of the fed tokens in packed order, and the
forward is counted once, with each lane's sequence's fed tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from refusion.cache.budget import default_kv_memory
from refusion.cache.manager import KVManager
from refusion.cache.pages import PAGE_SIZE
from refusion.decoding.protocol import ExtendOutput, ModelCall
from refusion.engines.base import Engine, SequenceState
from refusion.engines.feed import Feed
from refusion.models.base import exclusive

#: attention implementations that take custom 4-D masks (the padded path)
CUSTOM_MASK_ATTENTION = ("sdpa", "eager")

#: what :meth:`PagedEngine.lay_out` returns: called with the forward's Scores, it finishes the call (the sequence's
#: context updated) and returns the outputs of its extends
Finisher = Callable[[Any], tuple[ExtendOutput, ...]]


def attention_implementation(model: Any) -> str:
    """The network's own attention implementation (also while a forward has it switched)."""
    from refusion.engines.ragged import own_attention

    return own_attention(getattr(getattr(model, "model", None), "config", None))


class PagedSequence(SequenceState):
    """A sequence of a paged engine: its lane's block table (``table``) and the engine's manager (``kvm``).

    ``prompt``: its prompt ids while its full pages may still be published to the prefix cache (``None`` once
    they were, or when the engine keeps none)."""

    table: Any = None
    kvm: KVManager
    prompt: torch.Tensor | None = None


class PagedEngine(Engine):
    """Runs one forward for every lane of a :class:`~refusion.engines.feed.Feed` (see the module docstring).

    Keys and values live in pages of ``page_size`` tokens, at most ``kv_memory`` bytes of them (default:
    :func:`~refusion.cache.budget.default_kv_memory` of the device), owned by :attr:`kvm`. ``packed``: packed
    forwards (default where the network takes attention functions); ``paged_kernel``: attend with the paged Triton
    kernel (default on CUDA where Triton runs). Subclasses say what they run (:meth:`unsupported`), how many pages
    a sequence reserves (:meth:`reservation`) and lay calls out (:meth:`lay_out`).
    """

    #: whether prompts' pages can be shared across sequences (their keys/values depend on the prompt only)
    reuses_prefixes = False
    lays_out = True

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
        if prefix_cache and not self.reuses_prefixes:
            raise ConfigError(
                f"`prefix_cache` needs an engine whose prompts' keys/values depend on the prompt only; engine "
                f"{self.name!r} cannot share them (the 'branch' engine does, for causal models).",
                param="prefix_cache",
            )
        if kv_memory is not None:
            check_integer("kv_memory", kv_memory, 1)
        check_integer("page_size", page_size, 1)
        self.prefix_cache = bool(prefix_cache)
        reason = supports(model)
        if packed and reason:
            raise ConfigError(f"`packed` forwards cannot run on {type(model).__name__}: {reason}.", param="packed")
        #: packed forwards (no padding; HF models with attention functions) or padded lanes with a 4-D mask
        self.packed = reason is None if packed is None else packed
        #: packed forwards attend with the paged Triton kernel (each lane's keys read from its pages in place)
        self.paged_kernel = self._paged_kernel(paged_kernel, batch_invariant)
        layers, heads, dim, dtype = model.kv_shape()
        budget = kv_memory if kv_memory is not None else default_kv_memory(self.device)
        #: every page of keys/values this engine's sequences keep
        self.kvm = KVManager(
            layers,
            heads,
            dim,
            dtype,
            self.device,
            budget=budget,
            page_size=page_size,
            prefix_cache=self.prefix_cache,
            counters=self.counters,
        )
        #: the block tables over the pool (reads and writes of columns)
        self.kv = self.kvm.kv
        self.prefixes = self.kvm.prefixes

    def _paged_kernel(self, wanted: bool | None, batch_invariant: bool) -> bool:
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
    def paged_unsupported(cls, model: Any) -> str | None:
        """What every paged engine needs of a model: its key/value shape, and custom masks where not packed."""
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
        """Pages a sequence is admitted for: its prompt and region, and the region again for the branches, drafts
        and verification rows a forward feeds past its context (plus one page for the partial ones)."""
        return self.kvm.pages_for(prompt_length + 2 * region_length) + 1

    def kv_pages(self) -> tuple[int, int]:
        return self.kvm.usage()

    def admission(self, prompt_length: int, region_length: int, *, alone: bool = False) -> str | None:
        reason = self.kvm.admission(self.reservation(prompt_length, region_length), alone=alone)
        if reason is None:
            return None
        return f"a prompt of {prompt_length} tokens generating {region_length}: {reason}"

    @property
    def reserved(self) -> dict:
        """Pages each live sequence was admitted for."""
        return self.kvm.reserved

    def _admitted(self, state: PagedSequence, prompt: torch.Tensor) -> PagedSequence:
        """Give a new sequence its lane and reservation; reuse its prompt's cached prefix where the engine can."""
        state.kvm = self.kvm
        if state.table is None:
            state.table = self.kvm.table()
        self.kvm.reserve(state, self.reservation(prompt.shape[0], state.region_length))
        if self.prefixes is not None:
            try:
                reused = self.kvm.reuse_prefix(state, state.table, prompt)
                state.prompt = prompt
                if reused:
                    state.context.reuse(reused)
            except BaseException:
                self.release(state)
                raise
        return state

    def awaited_prefix(self, prompt: torch.Tensor) -> int:
        return self.kvm.awaited_prefix(prompt)

    def _publish(self, states: Any) -> None:
        """Publish the prompt pages of the sequences whose prompts are encoded now (by reference)."""
        if self.prefixes is None:
            return
        for state in states:
            prompt = getattr(state, "prompt", None)
            if prompt is None or state.table.length < state.prompt_length:
                continue
            self.kvm.publish(state, state.table, prompt)
            state.prompt = None

    def release(self, state: SequenceState) -> None:
        if state.released:
            return
        super().release(state)
        self.kvm.forget(state)
        self.kvm.unreserve(state)
        for table in self.tables_of(state):
            self.kvm.free(table)

    def tables_of(self, state: SequenceState) -> list[Any]:
        """Every block table ``state`` holds (its lane; a subclass adds guided or extra lanes)."""
        table = getattr(state, "table", None)
        return [] if table is None else [table]

    def keep_columns(self, states: list[Any], kept: list[int]) -> None:
        """After a forward of a batched form: the first ``kept[i]`` tokens row ``i`` fed after its context stay
        cached (the rest of what it fed is dropped: a length change and its pages given back, no copy)."""
        size = self.kv.page_size
        for state, k in zip(states, kept):
            table = state.table
            table.length += k
            if len(table.pages) * size >= table.length + size:  # a page past the kept columns
                self.kvm.trim(table)
        self._publish(states)

    def hold_columns(self, states: list[Any], used: list[int]) -> None:
        """Row ``i`` (``states`` order) uses its first ``used[i]`` columns: what lies there is kept (a loop's
        uncommitted branches included); the pages past them are given back."""
        for state, u in zip(states, used):
            table = state.table
            table.length = u
            self.kvm.trim(table)
        self._publish(states)

    # -- laying out and running ----------------------------------------------------------
    def lay_out(self, state: SequenceState, call: ModelCall, feed: Feed) -> Finisher:
        """Add ``state``'s ``call`` to ``feed``; return what finishes it once the forward ran (see :data:`Finisher`).

        Must add each lane's tokens in one run and must not change the sequence's committed context before the
        finisher runs."""
        raise NotImplementedError

    @torch.no_grad()
    def run(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        """One forward for the given sequences' calls (:meth:`lay_out` each, :meth:`forward`, finish each)."""
        feed = Feed()
        finishers = [(state, self.lay_out(state, call, feed)) for state, call in calls.items()]
        scores = self.forward(feed)
        return {state: finish(scores) for state, finish in finishers}

    @torch.no_grad()
    def forward(self, feed: Feed, *, count_rows: bool = True) -> Any:
        """One network forward over every token of ``feed``; returns their Scores in packed order.

        Lengths of the lanes' tables are not changed (the producers of the tokens do that); the forward is counted
        once, with each lane's sequence's fed tokens (``count_rows=False``: in the engine's totals only).
        """
        self.epoch.value += 1
        ids, positions, lane_of, columns, spans = feed.arrays()
        lanes = feed.lanes
        tables = [table for _, table in lanes]
        n = len(lanes)
        kvm, kv = self.kvm, self.kv
        size = kv.page_size
        last: np.ndarray = np.full(n, -1, dtype=np.int64)
        np.maximum.at(last, lane_of, columns)
        first: np.ndarray = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, lane_of, columns)
        for lane, column, data in feed.writes:
            last[lane] = max(last[lane], column + data.shape[3] - 1)
            first[lane] = min(first[lane], column)
        seen = spans[:, :, 1].max(1)  # each token's last visible column + 1
        row_keys: np.ndarray = np.zeros(n, dtype=np.int64)
        np.maximum.at(row_keys, lane_of, seen)
        row_keys = np.maximum(row_keys, last + 1)
        held = np.fromiter((len(table.pages) for table in tables), np.int64, n) * size
        for r in np.nonzero(held <= last)[0].tolist():  # lanes whose writes reach past their pages
            kvm.ensure(tables[r], int(last[r]) + 1, lanes[r][0].counters)
        for r, table in enumerate(tables):  # pages others hold too (a shared prefix) are copied before a write
            if table.shared and first[r] < table.shared * size:
                kv.own_from(table, int(first[r]), lanes[r][0].counters)
        for lane, column, data in feed.writes:
            kv.write(tables[lane], column, data, lanes[lane][0].counters)
        keys = int(row_keys.max())
        per_lane = np.bincount(lane_of, minlength=n)
        start = np.cumsum(per_lane) - per_lane
        local = np.arange(len(lane_of)) - start[lane_of]
        if self.packed:
            scores = self._packed(ids, positions, lane_of, local, columns, spans, tables, keys, int(per_lane.max()))
        else:
            scores = self._padded(ids, positions, lane_of, local, columns, spans, tables, keys, int(per_lane.max()))
        pairs = int(np.clip(spans[:, :, 1] - spans[:, :, 0], 0, None).sum())
        padded = 0 if self.packed else n * int(per_lane.max()) - len(ids)
        if not count_rows:
            self.counted(n, len(ids), padded, pairs=pairs, keys=int(row_keys.sum()))
            return scores
        fed: dict[SequenceState, int] = {}
        for (state, _), count in zip(lanes, per_lane.tolist()):
            fed[state] = fed.get(state, 0) + count
        self.served(fed, padded, pairs=pairs, keys=int(row_keys.sum()))
        for state, count in fed.items():
            state.counters.copied(new=count * kv.token_bytes)  # the network's writes of the fed tokens
        return scores

    # -- the packed forward ----------------------------------------------------------------
    def _packed(self, ids, positions, lane_of, local, columns, spans, tables, keys: int, n_max: int) -> Any:
        from refusion.engines.ragged import RaggedLayout

        kv, device = self.kv, self.device
        n = len(tables)
        on = functools.partial(torch.as_tensor, device=device)
        last_visible = spans[:, :, 1].max(1) - 1
        if self.paged_kernel:
            pages = kv.page_table(tables, keys)
            size = kv.page_size
            writes = pages[lane_of, columns // size] * size + columns % size
            layout = RaggedLayout(
                n,
                n_max,
                None,
                on(lane_of),
                on(last_visible),
                None,
                keys,
                writes=on(writes),
                pages=on(pages),
                spans=on(spans),
                page_size=size,
            )
            return self._network(ids, positions, layout)
        base = kv.first_slot(tables[0], keys) if n == 1 else None
        if base is not None:  # one lane on consecutive pages: a slice of the pool, no gather
            mask = _mask(spans, keys, device)
            if mask is not None and len(ids) == 1 and bool(mask.all()):
                mask = None
            consecutive = bool((np.diff(columns) == 1).all()) if len(columns) > 1 else True
            layout = RaggedLayout(
                1,
                n_max,
                None,
                on(lane_of),
                on(last_visible),
                None if mask is None else mask[None, None],
                keys,
                writes=None if consecutive else on(base + columns),
                base=base,
                span=(int(columns[0]), int(columns[0]) + len(columns)) if consecutive else None,
            )
            return self._network(ids, positions, layout)
        slots = kv.slot_index(tables, keys)
        visible = _mask(spans, keys, device)
        dest = lane_of * n_max + local
        mask = torch.zeros(n * n_max, keys, dtype=torch.bool, device=device)
        mask[:, 0] = True  # padding queries see column 0
        mask[on(dest)] = visible
        layout = RaggedLayout(
            n,
            n_max,
            None if n == 1 else on(dest),
            on(lane_of),
            on(last_visible),
            mask.view(n, 1, n_max, keys),
            keys,
            writes=on(slots[lane_of, columns]),
            reads=on(slots),
        )
        return self._network(ids, positions, layout)

    def _network(self, ids: np.ndarray, positions: np.ndarray, layout: Any) -> Any:
        """The network over packed tokens under ``layout``, keys/values written into the pages; its Scores."""
        from refusion.engines.ragged import RaggedCache, switched

        device = self.device
        with exclusive(self.model), switched(self.model.model.config, layout):
            return self.run_network(
                torch.from_numpy(ids)[None].to(device),
                torch.from_numpy(positions)[None].to(device),
                {"full_attention": layout, "sliding_attention": layout},
                RaggedCache(self.kv.pool.slots, layout),
            )[0]

    # -- the padded forward (adapters without attention functions) -------------------------------
    def _padded(self, ids, positions, lane_of, local, columns, spans, tables, keys: int, n_max: int) -> Any:
        """Lanes padded to the widest over a dense copy of their columns ``0:keys``, one 4-D mask from the spans;
        the fed tokens' keys/values are written back to their pages."""
        if self.batch_invariant and len(tables) > 1:  # padding to the widest lane changes each lane's sums
            return self._padded_one_by_one(ids, positions, lane_of, local, columns, spans, tables)
        kv, device = self.kv, self.device
        n = len(tables)
        slots = kv.slot_index(tables, keys)
        layers, two, _, heads, dim = kv.pool.slots.shape
        pool = kv.pool.slots  # (layers, 2, slots, heads, dim)
        dense = pool[:, :, torch.from_numpy(slots).to(pool.device)].permute(0, 1, 2, 4, 3, 5).contiguous()
        # dense: (layers, 2, lanes, heads, keys, dim)
        grid_ids = torch.full((n, n_max), int(self.model.mask_token_id), dtype=torch.long)
        grid_pos = torch.zeros((n, n_max), dtype=torch.long)
        at = (torch.from_numpy(lane_of), torch.from_numpy(local))
        grid_ids[at] = torch.from_numpy(ids)
        grid_pos[at] = torch.from_numpy(positions)
        visible = _mask(spans, keys, "cpu")
        mask = torch.zeros(n, n_max, keys, dtype=torch.bool)
        mask[:, :, 0] = True
        mask[at] = visible
        scratch = _DenseCache(dense, torch.from_numpy(lane_of), torch.from_numpy(local), torch.from_numpy(columns))
        out = self.run_network(
            grid_ids.to(device), grid_pos.to(device), self._mask_for_model(mask[:, None].to(device)), scratch
        )
        written = torch.from_numpy(slots[lane_of, columns]).to(pool.device)
        # advanced indices apart put the token axis first: (T, layers, 2, heads, dim)
        fed = dense[:, :, at[0].to(dense.device), :, torch.from_numpy(columns).to(dense.device)]
        pool.index_copy_(2, written, fed.permute(1, 2, 0, 3, 4).to(pool.dtype))
        return out[at[0].to(device), at[1].to(device)]

    def _padded_one_by_one(self, ids, positions, lane_of, local, columns, spans, tables) -> Any:
        """Batch-invariant padded forwards: each lane in a forward of its own (the Scores concatenated)."""
        outs = []
        for r in range(len(tables)):
            rows = lane_of == r
            if not rows.any():
                continue
            keys = int(max(spans[rows][:, :, 1].max(), columns[rows].max() + 1))
            outs.append(
                self._padded(
                    ids[rows],
                    positions[rows],
                    np.zeros(int(rows.sum()), dtype=np.int64),
                    local[rows],
                    columns[rows],
                    spans[rows],
                    [tables[r]],
                    keys,
                    int(rows.sum()),
                )
            )
        from refusion.decoding.scores import Scores

        return outs[0] if len(outs) == 1 else Scores.cat(outs)

    def _mask_for_model(self, mask: torch.Tensor) -> torch.Tensor:
        """sdpa takes the boolean mask; eager attention needs an additive float mask."""
        if attention_implementation(self.model) == "eager":
            dtype = self.kv.pool.data.dtype
            return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
        return mask


class _DenseCache:
    """The cache object a padded forward's network sees: writes each fed token's keys/values at its lane's column
    of a dense ``(layers, 2, lanes, heads, keys, dim)`` copy and returns the lanes' columns."""

    def __init__(self, dense: torch.Tensor, lane_of: torch.Tensor, local: torch.Tensor, columns: torch.Tensor):
        self.dense, self.lane_of, self.local, self.columns = dense, lane_of, local, columns

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        out = []
        for which, states in ((0, key_states), (1, value_states)):
            target = self.dense[layer_idx, which]  # (lanes, heads, keys, dim)
            device = target.device
            fed = states[self.lane_of.to(states.device), :, self.local.to(states.device)]  # (T, heads, dim)
            target[self.lane_of.to(device), :, self.columns.to(device)] = fed.to(target.dtype)
            out.append(target)
        return out[0], out[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def _mask(spans: np.ndarray, keys: int, device: Any) -> Any:
    """``(T, keys)`` boolean on ``device``: whether each token sees each column (inside one of its spans)."""
    if torch.device(device).type == "cpu":
        cols = np.arange(keys)[None, None, :]
        visible = ((cols >= spans[:, :, :1]) & (cols < spans[:, :, 1:])).any(1)
        return torch.from_numpy(visible).to(device)
    on = torch.as_tensor(spans, device=device)
    cols = torch.arange(keys, device=device)[None, None, :]
    return ((cols >= on[:, :, :1]) & (cols < on[:, :, 1:])).any(1)
