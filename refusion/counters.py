"""What decoding costs, counted in one place.

:class:`Counters` holds every cost figure: forwards, tokens fed, padding,
key/value bytes copied and written, and, when asked, the shape of every
forward and LM-head pass (what the GPU cost model reads) and the CPU time
spent inside the network. Two things feed it: the engines (every engine
counts each forward it runs with :meth:`Engine.served`, one
:class:`Counters` per sequence and one for the engine's totals), and
:class:`observe`, which hooks a network that refusion does not drive itself
(transformers' ``generate`` as the AR baseline) or times the network under
an engine. bench, traces, the cost model, the server's metrics and the
benchmarks all read these counters.
"""

from __future__ import annotations

import time
from typing import Any

import attrs


@attrs.frozen
class ForwardShape:
    """One network forward: ``rows`` sequences, ``tokens`` fed (padding included), ``pairs`` query-key pairs
    attended, ``keys`` key/value tokens read from the cache."""

    rows: int
    tokens: int
    pairs: int
    keys: int


@attrs.define(eq=False)
class Counters:
    """Costs of a sequence's decode, or an engine's (or a benchmark's) totals.

    ``forwards``: network forwards (for a sequence: the forwards that served
    it). ``fed_tokens``: query tokens fed to the network (for a sequence: its
    own, padding excluded). ``padded_tokens``: padding fed alongside (engine
    totals only). ``kv_context_bytes``: bytes of already-cached keys/values
    copied again (the cost that grows with the context); ``kv_new_bytes``:
    bytes of new keys/values written. ``parent`` (an engine's totals) also
    receives every byte counted here. ``shapes`` and ``head_rows`` (``None``
    unless recording, see :meth:`record`) list every forward's
    :class:`ForwardShape` and every LM-head pass's rows; ``network_seconds``
    is the CPU time inside the network while :class:`observe` times it.
    """

    forwards: int = 0
    fed_tokens: int = 0
    padded_tokens: int = 0
    kv_context_bytes: int = 0
    kv_new_bytes: int = 0
    parent: Counters | None = attrs.field(default=None, repr=False)
    #: query tokens of each forward, in order (a sequence's counters keep it; the decoder's trace reads it)
    fed_log: list[int] = attrs.field(factory=list, repr=False)
    shapes: list[ForwardShape] | None = attrs.field(default=None, repr=False)
    head_rows: list[int] | None = attrs.field(default=None, repr=False)
    network_seconds: float = 0.0

    def forward(self, fed: int, *, log: bool = False, shape: ForwardShape | None = None) -> None:
        """Count one forward that fed ``fed`` query tokens (``log``: also append ``fed`` to :attr:`fed_log`;
        ``shape``: record it while recording)."""
        self.forwards += 1
        self.fed_tokens += fed
        if log:
            self.fed_log.append(fed)
        if shape is not None and self.shapes is not None:
            self.shapes.append(shape)

    def head_pass(self, rows: int) -> None:
        """Record an LM-head pass over ``rows`` hidden states (while recording)."""
        if self.head_rows is not None:
            self.head_rows.append(rows)

    def copied(self, context: int = 0, new: int = 0) -> None:
        """Count ``context`` bytes of cached keys/values re-copied and ``new`` bytes written."""
        self.kv_context_bytes += context
        self.kv_new_bytes += new
        if self.parent is not None:
            self.parent.copied(context, new)

    def record(self, on: bool = True) -> None:
        """Start (or stop) recording forward shapes and LM-head rows (they start empty)."""
        self.shapes, self.head_rows = ([], []) if on else (None, None)

    @property
    def kv_bytes(self) -> dict[str, int]:
        return {"context": self.kv_context_bytes, "new": self.kv_new_bytes}

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers, the same keys for every engine."""
        return {
            "forwards": self.forwards,
            "fed_tokens": self.fed_tokens,
            "padded_tokens": self.padded_tokens,
            "kv_bytes": self.kv_bytes,
        }


class observe:
    """``with observe(model, counters, count=True, timing=False):`` feed ``counters`` from a network's hooks.

    ``model`` is a :class:`~refusion.models.base.ModelAdapter` or a transformers
    model. ``count``: every forward of the backbone (``base_model``, which
    every forward goes through, whether the caller runs the whole model or the
    backbone and its LM head apart) is counted, with its fed tokens: use it
    where no engine counts (transformers' ``generate``). ``timing``: the CPU
    time of every backbone forward, of the network's own output layer and of
    every pass of the adapter's lazy LM head (given an adapter) is added to
    ``counters.network_seconds``, and the lazy head's passes are recorded
    into ``counters`` too. What is left of a run's time is the decoder's own
    work.
    """

    def __init__(self, model: Any, counters: Counters, *, count: bool = True, timing: bool = False):
        network = getattr(model, "model", model) if not hasattr(model, "register_forward_pre_hook") else model
        self.backbone = getattr(network, "base_model", network)
        self.output = network.get_output_embeddings() if hasattr(network, "get_output_embeddings") else None
        found = getattr(model, "head", None) if network is not model else None
        self.head = found[1] if found else None
        self.counters, self.count, self.timing = counters, count, timing
        self._handles: list[Any] = []
        self._start: list[float] = []

    def __enter__(self) -> Counters:
        self._handles.append(self.backbone.register_forward_pre_hook(self._enter, with_kwargs=True))
        self._handles.append(self.backbone.register_forward_hook(self._exit))
        if self.timing and self.output is not None and self.output is not self.backbone:
            self._handles.append(self.output.register_forward_pre_hook(self._time_start))
            self._handles.append(self.output.register_forward_hook(self._exit))
        if self.head is not None and self.timing:
            self.head.observers.append(self)
        return self.counters

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.head is not None and self in self.head.observers:
            self.head.observers.remove(self)

    def _enter(self, module: Any, args: Any, kwargs: Any) -> None:
        if self.count:
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.counters.forward(int(ids.numel()) if hasattr(ids, "numel") else 0)
        if self.timing:
            self._start.append(time.process_time())

    def _time_start(self, module: Any, args: Any) -> None:
        self._start.append(time.process_time())

    def _exit(self, module: Any, args: Any, output: Any) -> None:
        if self.timing and self._start:
            self.counters.network_seconds += time.process_time() - self._start.pop()

    def head_pass(self, rows: int, seconds: float) -> None:
        """Called by the LM head after each pass it makes while observed."""
        self.counters.head_pass(rows)
        self.counters.network_seconds += seconds
