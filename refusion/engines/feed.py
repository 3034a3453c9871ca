"""What one forward feeds the network: tokens of many lanes, each with the column it writes and the columns it sees.

A *lane* is one block table of keys/values (:class:`~refusion.cache.paged.BlockTable`) and the sequence it serves:
a sequence has one lane, a guided one a second (its unconditional canvas), a call with several canvases one per
canvas. Every token of a forward belongs to a lane, sits at a position id, writes its keys/values at a column of the
lane's table and attends to the columns that its *spans* make visible: up to a few half-open column ranges
``[lo, hi)``. Causal chains, branches beside a shared context, bidirectional canvases, block-causal windows and
leave-one-out rows are all spans, so one forward can hold every kind at once and an engine only lays its calls out
(:meth:`~refusion.engines.paged.PagedEngine.lay_out`) and runs the network
(:meth:`~refusion.engines.paged.PagedEngine.forward`). ``writes`` are keys/values put into a lane's columns before
the forward (a branch's parent, computed by an earlier forward). Knows nothing about decoding or models.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def causal_spans(columns: np.ndarray, low: int | np.ndarray = 0) -> np.ndarray:
    """``(n, 1, 2)`` spans: each token sees the columns from ``low`` up to its own (a causal chain)."""
    columns = np.asarray(columns, dtype=np.int64)
    out: np.ndarray = np.empty((len(columns), 1, 2), dtype=np.int64)
    out[:, 0, 0] = low
    out[:, 0, 1] = columns + 1
    return out


def full_spans(n: int, lo: int, hi: int) -> np.ndarray:
    """``(n, 1, 2)`` spans: every token sees columns ``lo .. hi - 1`` (a bidirectional window)."""
    out: np.ndarray = np.empty((n, 1, 2), dtype=np.int64)
    out[:, 0, 0] = lo
    out[:, 0, 1] = hi
    return out


class Feed:
    """The tokens of one forward, lane by lane (see the module docstring).

    :meth:`lane` registers a lane (a table and the sequence state whose counters it reports to) and returns its
    index; :meth:`add` appends a run of tokens of one lane and returns the packed index of its first token (the
    row of its output in the forward's Scores); :meth:`write` puts keys/values into a lane's columns before the
    forward. A lane's tokens must be added in one run per producer (tokens of one lane stay consecutive).
    """

    def __init__(self) -> None:
        #: ``(state, table)`` of each lane, in the order they were registered
        self.lanes: list[tuple[Any, Any]] = []
        self._index: dict[int, int] = {}
        #: ``(lane, ids, positions, columns, spans)`` runs in packed order (``lane`` per token for :meth:`add_runs`)
        self.parts: list[tuple[int | np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        #: ``(lane, column, kv (layers, 2, heads, n, dim))`` entries written before the forward
        self.writes: list[tuple[int, int, Any]] = []
        self.size = 0
        self._last_lane = -1
        self._closed: set[int] = set()

    def __len__(self) -> int:
        return self.size

    def lane(self, state: Any, table: Any) -> int:
        """The index of the lane of ``table`` (registered on first use), whose sequence is ``state``."""
        key = id(table)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.lanes)
            self.lanes.append((state, table))
        return index

    def add(self, lane: int, ids: Any, positions: Any, columns: Any, spans: np.ndarray) -> int:
        """Feed ``ids`` at ``positions`` (1-D, ``n`` each), writing at ``columns`` of lane ``lane`` and seeing the
        ``(n, s, 2)`` column ``spans``; returns the packed index of the first token."""
        if lane != self._last_lane:
            if lane in self._closed:
                raise RuntimeError("internal error: a lane's tokens must be fed consecutively")
            self._closed.add(self._last_lane)
            self._last_lane = lane
        ids = np.asarray(ids, dtype=np.int64)
        at = self.size
        self.parts.append(
            (
                lane,
                ids,
                np.asarray(positions, dtype=np.int64),
                np.asarray(columns, dtype=np.int64),
                np.asarray(spans, dtype=np.int64),
            )
        )
        self.size += len(ids)
        return at

    def add_runs(
        self, lanes: Any, counts: Any, ids: Any, positions: Any, columns: Any, spans: np.ndarray
    ) -> np.ndarray:
        """:meth:`add` for many lanes at once: run ``r`` feeds ``counts[r]`` tokens of lane ``lanes[r]`` (distinct
        lanes), the runs' tokens concatenated in ``ids``, ``positions``, ``columns``, ``spans``; returns the packed
        index of each run's first token."""
        lanes = np.asarray(lanes, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        if not len(lanes):
            return np.zeros(0, dtype=np.int64)
        order = lanes.tolist()
        if (
            len(set(order)) != len(order)
            or self._closed.intersection(order)
            or (order[0] != self._last_lane and self._last_lane in order)
        ):
            raise RuntimeError("internal error: a lane's tokens must be fed consecutively")
        self._closed.add(self._last_lane)
        self._closed.update(order[:-1])
        self._last_lane = order[-1]
        starts = self.size + np.concatenate(([0], np.cumsum(counts)[:-1]))
        ids = np.asarray(ids, dtype=np.int64)
        self.parts.append(
            (
                np.repeat(lanes, counts),
                ids,
                np.asarray(positions, dtype=np.int64),
                np.asarray(columns, dtype=np.int64),
                np.asarray(spans, dtype=np.int64),
            )
        )
        self.size += len(ids)
        return starts.astype(np.int64)

    def checkpoint(self) -> tuple:
        """A mark to :meth:`rollback` to (what a producer added after it is dropped, e.g. when it failed midway)."""
        return (len(self.parts), len(self.writes), self.size, len(self.lanes), self._last_lane, set(self._closed))

    def rollback(self, mark: tuple) -> None:
        """Forget every run, write and lane added since :meth:`checkpoint` returned ``mark``."""
        parts, writes, size, lanes, last, closed = mark
        del self.parts[parts:], self.writes[writes:]
        for _, table in self.lanes[lanes:]:
            del self._index[id(table)]
        del self.lanes[lanes:]
        self.size, self._last_lane, self._closed = size, last, closed

    def write(self, lane: int, column: int, kv: Any) -> None:
        """Put ``kv`` ``(layers, 2, heads, n, dim)`` at columns ``column ..`` of lane ``lane`` before the forward."""
        self.writes.append((lane, column, kv))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``ids, positions, lane_of, columns, spans`` of the packed tokens (spans padded to the widest run with
        empty ``[0, 0)`` spans)."""
        parts = self.parts
        if len(parts) == 1:
            lane, ids, positions, columns, spans = parts[0]
            return ids, positions, self._lane_of(lane, len(ids)), columns, spans
        width = max(p[4].shape[1] for p in parts)
        spans = np.zeros((self.size, width, 2), dtype=np.int64)
        at = 0
        for p in parts:
            n = len(p[1])
            spans[at : at + n, : p[4].shape[1]] = p[4]
            at += n
        lane_of = np.concatenate([self._lane_of(p[0], len(p[1])) for p in parts])
        return (
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
            lane_of,
            np.concatenate([p[3] for p in parts]),
            spans,
        )

    @staticmethod
    def _lane_of(lane: int | np.ndarray, n: int) -> np.ndarray:
        """The lane of each of a run's ``n`` tokens (a run of :meth:`add_runs` stores them already)."""
        if isinstance(lane, np.ndarray):
            return lane
        return np.full(n, lane, dtype=np.int64)
