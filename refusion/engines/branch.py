"""The ``branch`` engine: causal models, many sequences per forward, parallel branches as column spans.

Each sequence keeps its encoded context in the columns ``0:len`` of its block table of pages
(:mod:`refusion.cache.paged`, owned by the engine's :class:`~refusion.cache.manager.KVManager`); it is never
copied. A call is laid out after it (:meth:`BranchEngine.lay_out`): the pending context tokens (the prompt at the
first call, re-encodes later) at the next columns, causally; the keys/values of the branches its extends continue,
written once into scratch columns after them; then the tokens of each extend, each seeing the context, its branch's
scratch span and, causally, its own extend: branches of one sequence share the cached prefix instead of repeating
it. Every sequence of a step is laid out into one :class:`~refusion.engines.feed.Feed` and run in one forward
(:class:`~refusion.engines.paged.PagedEngine`).

Writes are O(new tokens): the network writes the fed tokens' keys/values into their pages in place; committing
copies only the committed tokens; truncation is a length change. Sequences join (:meth:`~BranchEngine.admit`) when
the pages they may need fit the engine's memory budget (:meth:`~BranchEngine.admission`) and leave
(:meth:`~BranchEngine.release`) between forwards, giving their pages back: no other sequence's entries move. With
``prefix_cache`` a prompt's full pages are shared across sequences (:mod:`refusion.cache.prefix`).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from refusion.cache.paged import PagedStore, TableReader
from refusion.decoding.context import SequenceCache
from refusion.decoding.protocol import ExtendOutput, ModelCall
from refusion.engines.base import SequenceState
from refusion.engines.feed import Feed, causal_spans
from refusion.engines.paged import CUSTOM_MASK_ATTENTION, Finisher, PagedEngine, PagedSequence
from refusion.engines.paged import attention_implementation as attention_implementation
from refusion.plugins import hookimpl

__all__ = ["CUSTOM_MASK_ATTENTION", "BranchEngine", "BranchSequence", "attention_implementation"]


class BranchSequence(PagedSequence):
    """A sequence of the branch engine: its context lives in the pages of ``store.table`` (``table``)."""

    store: PagedStore


class BranchEngine(PagedEngine):
    """Runs one model call per sequence, every sequence in a single forward (causal models that state their KV
    shape); see the module docstring and :class:`~refusion.engines.paged.PagedEngine` for the options."""

    name = "branch"
    priority = 20
    reuses_prefixes = True
    causal_lanes = True

    @classmethod
    def unsupported(cls, model: Any) -> str | None:
        caps = model.capabilities
        if not caps.causal or not caps.kv_cache:
            return "it needs a causal model with a key/value cache"
        return cls.paged_unsupported(model)

    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        counters = self.new_counters()
        table = self.kvm.table()
        store = PagedStore(self.kv, counters, table)
        cache = SequenceCache(store, prompt, torch.arange(prompt.shape[0]))
        state = BranchSequence(cache, counters, prompt.shape[0], region_length)
        state.store = store
        state.table = table
        return self._admitted(state, prompt)

    def release(self, state: SequenceState) -> None:
        if state.released:
            return
        super().release(state)
        cast(BranchSequence, state).store.detach()

    # -- a program's call -------------------------------------------------------------
    def lay_out(self, state: SequenceState, call: ModelCall, feed: Feed) -> Finisher:
        """Pending context tokens, then the parents' scratch, then each extend (see the module docstring)."""
        state = cast(BranchSequence, state)
        table = state.table
        self.kvm.trim(table)  # the last forward's scratch pages: its outputs are not read any more
        cache = state.context
        context, pending = cache.encoded, cache.pending
        lane = feed.lane(state, table)
        ids, positions, columns, spans = [], [], [], []
        if pending:
            cols = np.arange(context, context + pending)
            ids.append(cache.tokens[context:].numpy())
            positions.append(cache.positions[context:].numpy())
            columns.append(cols)
            spans.append(_widen(causal_spans(cols), 3))
        seen = context + pending  # what every extend sees before its branch
        column = seen
        parent_at: dict[int, int] = {}
        for e in call.extends:
            if len(e.parent) and id(e.parent) not in parent_at:
                parent_at[id(e.parent)] = column
                kv = e.parent.kv
                assert kv is not None  # a non-empty branch holds its keys/values
                feed.write(lane, column, kv.data)
                column += len(e.parent)
        starts = []
        for e in call.extends:
            n = len(e.tokens)
            cols = np.arange(column, column + n)
            span: np.ndarray = np.zeros((n, 3, 2), dtype=np.int64)
            span[:, 0, 1] = seen
            if len(e.parent):
                at = parent_at[id(e.parent)]
                span[:, 1] = (at, at + len(e.parent))
            span[:, 2, 0] = column
            span[:, 2, 1] = cols + 1
            ids.append(e.tokens.cpu().numpy())
            positions.append(e.positions.cpu().numpy())
            columns.append(cols)
            spans.append(span)
            starts.append(column)
            column += n
        at = feed.add(
            lane, np.concatenate(ids), np.concatenate(positions), np.concatenate(columns), np.concatenate(spans)
        )
        epoch = self.epoch

        def finish(scores: Any) -> tuple[ExtendOutput, ...]:
            if pending:
                table.length = context + pending
                cache.mark_encoded(scores[at + pending - 1])
            reader = TableReader(self.kv, table)
            outputs, offset = [], at + pending
            for e, start in zip(call.extends, starts):
                n = len(e.tokens)
                outputs.append(ExtendOutput(e, scores[offset : offset + n], reader, 0, start, epoch, epoch.value))
                offset += n
            self._publish([state])
            return tuple(outputs)

        return finish


def _widen(spans: np.ndarray, width: int) -> np.ndarray:
    """``spans`` ``(n, s, 2)`` padded to ``width`` spans with empty ones."""
    if spans.shape[1] == width:
        return spans
    out = np.zeros((spans.shape[0], width, 2), dtype=np.int64)
    out[:, : spans.shape[1]] = spans
    return out


@hookimpl
def register_engines(register):
    register(BranchEngine)
