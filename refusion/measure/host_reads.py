"""Count host reads of accelerator data during a decode: the points where the CPU waits for the GPU.

A *host read* is a call that brings device data back to Python: ``item``,
``tolist``, ``bool()``, ``int()``, ``float()``, use as an index
(``__index__``), ``cpu``/``numpy``/``__array__``/``.to(<host device>)``,
formatting, ``in``, ``torch.equal``/``allclose``, and the ops whose output
size depends on the data (``nonzero``, ``argwhere``, one-argument ``where``,
``masked_select``, ``unique``, indexing with a boolean tensor: kind
``"bool-index"``). On a GPU each is a synchronisation point.

On a CUDA (any non-CPU) device every such call on a device tensor counts. On
the CPU every tensor is on the host, so :class:`HostReads` simulates where
tensors would live:

* *network data* (:attr:`HostReads.by_kind`): the hooked network's
  parameters and buffers, every tensor created during a network call (inside
  :meth:`Engine.run_network <refusion.engines.base.Engine.run_network>` or a hooked
  module's forward), what ``Engine.run_network`` returns, and every tensor a torch
  function or method computes from those (outputs, and the target of an
  in-place op or ``__setitem__``);
* *placed* tensors (:attr:`HostReads.placed`, with ``placed=True``): made by
  the code itself on the device (``device=`` or ``.to(device)``), not from
  network data. Inside the context the ``.device`` of a device-resident
  tensor reads ``cpu:0`` (so the model's ``device`` does too), and every call
  is given plain ``cpu`` back: ``torch.zeros(n, device=x.device)`` is placed
  when ``x`` is device-resident and host data when ``x`` is not, as on a GPU.

The result of ``cpu()``/``numpy()``/``.to(<host device>)`` of device data is
host data: counted once, returned untagged (an alias on the CPU, so a decode
gives the same tokens measured or not).

Reads are attributed to engine steps (:meth:`DecodeLoop.step
<refusion.decoding.loop.DecodeLoop.step>`) and to call sites (the first frame in
refusion, plus the innermost frame when that is elsewhere, e.g. transformers).
Only the thread that entered the context is observed; ``Engine.run_network`` and
``DecodeLoop.step`` are wrapped on their classes for the context's duration.
Limits: reads inside C++ that never reach Python (a tensor passed where a
Python number is expected) are not seen; a device given as a string other
than ``"cpu"`` is not followed.
"""

from __future__ import annotations

import collections
import itertools
import os
import sys
import threading
from collections.abc import Iterable
from typing import Any

import attrs
import torch
from torch.overrides import TorchFunctionMode

#: method/function names that read a tensor's values into Python
READS = frozenset(
    {
        "item",
        "tolist",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__format__",
        "__contains__",
        "__array__",
        "cpu",
        "numpy",
        "nonzero",
        "argwhere",
        "equal",
        "allclose",
        "is_nonzero",
        "masked_select",
        "unique",
        "unique_consecutive",
        "bincount",
    }
)
#: reads whose result is host data that aliases the input on the CPU (returned untagged)
_TO_HOST = frozenset({"cpu", "numpy"})
#: Python operators that write into their first argument
_IN_PLACE = frozenset(
    {
        "__setitem__",
        "__iadd__",
        "__isub__",
        "__imul__",
        "__itruediv__",
        "__ifloordiv__",
        "__imod__",
        "__ipow__",
        "__iand__",
        "__ior__",
        "__ixor__",
        "__ilshift__",
        "__irshift__",
        "__imatmul__",
    }
)
_NET, _PLACED = 2, 1
#: what ``.device`` of a device-resident CPU tensor reads inside the context, and what calls are given instead
_ACCELERATOR, _HOST = torch.device("cpu", 0), torch.device("cpu")
_DEVICE_PROPERTY = torch.Tensor.device
_ids = itertools.count(1)
_HERE = os.path.abspath(__file__)
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_REFUSION_DIR = os.path.dirname(os.path.dirname(_HERE)) + os.sep
_ROOTS = (_REFUSION_DIR, os.sep + "refusion_kernels" + os.sep)


def _is_accelerator(device: Any) -> bool:
    return isinstance(device, torch.device) and device.type == "cpu" and device.index is not None


@attrs.define
class StepReads:
    """One engine step: ``sequences`` live at its start, host ``reads`` (and ``placed`` reads), network ``forwards``."""

    sequences: int
    reads: int
    placed: int
    forwards: int


class PerStep:
    """Rates per engine step of a counter that keeps one :class:`StepReads` per step in ``steps``."""

    steps: list[StepReads]

    @property
    def step_reads(self) -> int:
        """Reads made during engine steps (the rest happened while admitting or finishing sequences)."""
        return sum(s.reads for s in self.steps)

    @property
    def per_step(self) -> float:
        """Mean reads per engine step."""
        return self.step_reads / len(self.steps) if self.steps else 0.0

    @property
    def per_sequence_step(self) -> float:
        """Reads per live sequence per engine step: total step reads / sum over steps of live sequences."""
        rows = sum(s.sequences for s in self.steps)
        return self.step_reads / rows if rows else 0.0


class HostReads(PerStep, TorchFunctionMode):
    """``with HostReads(model) as reads:`` count host reads of device data (see the module docstring).

    ``model``: an adapter (its ``model`` network is hooked), a ``torch.nn.Module``,
    or ``None`` (then only ``Engine.run_network`` marks network outputs, and CUDA
    tensors count by their device). Afterwards: :attr:`total` and
    :attr:`by_kind` (reads of network data), :attr:`placed` (reads of tensors
    the code placed on the device itself, by kind), :attr:`steps` (one
    :class:`StepReads` per engine step), :attr:`forwards`, :attr:`sites`
    (``(kind, site) -> count``; ``placed_sites`` likewise) and :meth:`summary`. One context at a time.
    """

    def __init__(self, model: Any = None, *, placed: bool = True):
        super().__init__()
        self.model = model
        self.track_placed = placed
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.placed: collections.Counter[str] = collections.Counter()
        self.sites: collections.Counter[tuple[str, str]] = collections.Counter()
        self.placed_sites: collections.Counter[tuple[str, str]] = collections.Counter()
        self.steps: list[StepReads] = []
        self.forwards = 0
        self._attr = f"_refusion_host_reads_{next(_ids)}"  # a fresh tag per context: old tags never count
        self._inside = 0  # depth of network calls in progress (everything created then is device data)
        self._in_step = False
        self._undo: list = []

    # -- results -------------------------------------------------------------------------
    @property
    def total(self) -> int:
        """Reads of data the network computed (or derived from it)."""
        return sum(self.by_kind.values())

    @property
    def placed_total(self) -> int:
        return sum(self.placed.values())

    def top_sites(self, n: int = 15, *, placed: bool = False) -> list[tuple[int, str, str]]:
        """The ``n`` most frequent ``(count, kind, site)`` of network-data reads (``placed``: of placed-tensor
        reads)."""
        sites = self.placed_sites if placed else self.sites
        return [(c, kind, site) for (kind, site), c in sites.most_common(n)]

    def summary(self, sites: int = 15) -> dict[str, Any]:
        """Every figure as plain JSON-ready values."""
        steps = len(self.steps)
        return {
            "total": self.total,
            "by_kind": dict(self.by_kind),
            "steps": steps,
            "forwards": self.forwards,
            "step_forwards": sum(s.forwards for s in self.steps),
            "step_reads": self.step_reads,
            "outside_steps": self.total - self.step_reads,
            "per_step": self.per_step,
            "max_per_step": max((s.reads for s in self.steps), default=0),
            "per_sequence_step": self.per_sequence_step,
            "placed_total": self.placed_total,
            "placed_by_kind": dict(self.placed),
            "placed_per_step": sum(s.placed for s in self.steps) / steps if steps else 0.0,
            "top_sites": [{"count": c, "kind": k, "site": s} for c, k, s in self.top_sites(sites)],
            "top_placed_sites": [{"count": c, "kind": k, "site": s} for c, k, s in self.top_sites(sites, placed=True)],
        }

    # -- tagging ---------------------------------------------------------------------------
    def _level(self, value: Any) -> int:
        """Tag level of a tensor, or the highest among a list/tuple of them (one level deep)."""
        if isinstance(value, torch.Tensor):
            if value.device.type not in ("cpu", "meta"):
                return _NET
            return getattr(value, self._attr, 0)
        if isinstance(value, (list, tuple)):
            best = 0
            for item in value:
                if isinstance(item, torch.Tensor):
                    level = getattr(item, self._attr, 0) if item.device.type in ("cpu", "meta") else _NET
                    if level > best:
                        best = level
            return best
        return 0

    def _tag(self, value: Any, level: int) -> None:
        if isinstance(value, torch.Tensor):
            if getattr(value, self._attr, 0) < level:
                setattr(value, self._attr, level)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor) and getattr(item, self._attr, 0) < level:
                    setattr(item, self._attr, level)

    def tag(self, value: Any) -> Any:
        """Mark the tensors of ``value`` (a tensor, a list/tuple of them, a ``Scores``, a model output) as network
        data."""
        if isinstance(value, (torch.Tensor, list, tuple)):
            self._tag(value, _NET)
        elif isinstance(value, dict):  # transformers ModelOutput
            for item in value.values():
                self._tag(item, _NET)
        else:
            for name in ("hidden", "_logits"):  # refusion.decoding.scores.Scores
                self._tag(getattr(value, name, None), _NET)
        return value

    # -- the mode ----------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":  # attribute access: only `.device` of a device-resident CPU tensor changes
            if (
                self.track_placed
                and getattr(func, "__self__", None) is _DEVICE_PROPERTY
                and args
                and args[0].device.type == "cpu"
                and getattr(args[0], self._attr, 0)
            ):
                return _ACCELERATOR
            return func(*args, **kwargs)
        placing = False
        if self.track_placed:  # give the calls plain `cpu` back, noting that the code asked for the device
            if _is_accelerator(kwargs.get("device")):
                kwargs, placing = dict(kwargs, device=_HOST), True
            if name == "to" and len(args) > 1 and _is_accelerator(args[1]):
                args, placing = (args[0], _HOST, *args[2:]), True
        level = 0
        for value in args:
            got = self._level(value)
            if got > level:
                level = got
        if kwargs:
            for value in kwargs.values():
                got = self._level(value)
                if got > level:
                    level = got
        kind = self._read_kind(name, args, kwargs, level, placing)
        if kind is not None:
            self._count(kind, level)
        out = func(*args, **kwargs)
        if kind in _TO_HOST or (name == "to" and kind is not None):
            if isinstance(out, torch.Tensor) and out is args[0]:
                out = out.view_as(out)  # on the CPU `cpu()` returns its input: give back an untagged alias
            return out
        if self._inside:
            level = _NET
        elif placing and not level:
            level = _PLACED
            if isinstance(out, torch.Tensor) and any(out is a for a in args):
                out = out.view_as(out)  # `.to(device)` of host data: the host tensor stays host data
        if level:
            self._tag(out, level)
            if (name.endswith("_") and not name.startswith("__")) or name in _IN_PLACE or "out" in kwargs:
                self._tag(args[0] if args else kwargs.get("out"), level)  # in place: the target holds device data
        return out

    def _read_kind(self, name: str, args: tuple, kwargs: dict, level: int, placing: bool) -> str | None:
        if name in READS:
            return name if level else None
        if name in ("__getitem__", "__setitem__", "index_put_", "index_put") and len(args) > 1:
            index = args[1] if isinstance(args[1], (tuple, list)) else (args[1],)
            for item in index:
                if isinstance(item, torch.Tensor) and item.dtype == torch.bool and self._level(item):
                    if name == "__setitem__" and not isinstance(args[2] if len(args) > 2 else None, torch.Tensor):
                        return None  # t[mask] = scalar runs as masked_fill_: no size to read
                    return "bool-index"
            return None
        if name == "where" and len(args) == 1 and not kwargs and level:
            return "nonzero"
        if name == "repeat_interleave" and kwargs.get("output_size") is None:
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if isinstance(repeats, torch.Tensor) and self._level(repeats):
                return "repeat_interleave"
        if name == "to" and not placing and args and self._level(args[0]):
            target = kwargs.get("device", args[1] if len(args) > 1 else None)
            if isinstance(target, str) and target.startswith("cpu"):
                return "cpu"
            if (
                isinstance(target, torch.device)
                and target.type == "cpu"
                and (self.track_placed or args[0].device.type != "cpu")
            ):
                return "cpu"  # to the device of host data: a copy to the host
        return None

    def _count(self, kind: str, level: int) -> None:
        if level >= _NET:
            self.by_kind[kind] += 1
            self.sites[(kind, call_site(sys._getframe(2)))] += 1
            if self._in_step:
                self._step_reads += 1
        else:
            self.placed[kind] += 1
            self.placed_sites[(kind, call_site(sys._getframe(2)))] += 1
            if self._in_step:
                self._step_placed += 1

    # -- hooks on the network, the engine and the driver ---------------------------------------
    def _network(self, run):
        """``run()`` as one network call: everything created meanwhile is device data."""
        outermost = not self._inside
        self._inside += 1
        try:
            out = run()
        finally:
            self._inside -= 1
        if outermost:
            self.forwards += 1
            if self._in_step:
                self._step_forwards += 1
        return out

    def _unmark(self, weights: list) -> None:
        for t in weights:
            delattr(t, self._attr)

    def __enter__(self) -> HostReads:
        from refusion.decoding.loop import DecodeLoop
        from refusion.engines.base import Engine

        self._thread = threading.get_ident()
        probe = self
        original_scores, original_step = Engine.run_network, DecodeLoop.step

        def scores(engine, *args, **kwargs):
            if threading.get_ident() != probe._thread:
                return original_scores(engine, *args, **kwargs)
            return probe.tag(probe._network(lambda: original_scores(engine, *args, **kwargs)))

        def step(runner, *args, **kwargs):
            if probe._in_step or threading.get_ident() != probe._thread:
                return original_step(runner, *args, **kwargs)
            live = len(runner)
            probe._step_reads = probe._step_placed = probe._step_forwards = 0
            probe._in_step = True
            try:
                return original_step(runner, *args, **kwargs)
            finally:
                probe._in_step = False
                probe.steps.append(StepReads(live, probe._step_reads, probe._step_placed, probe._step_forwards))

        setattr(Engine, "run_network", scores)  # noqa: B010 - patched for the probe's lifetime, put back by _undo
        setattr(DecodeLoop, "step", step)  # noqa: B010

        def restore() -> None:
            setattr(Engine, "run_network", original_scores)  # noqa: B010
            setattr(DecodeLoop, "step", original_step)  # noqa: B010

        self._undo.append(restore)
        for module in _modules(self.model):
            self._undo.append(module.register_forward_pre_hook(self._pre_hook).remove)
            self._undo.append(module.register_forward_hook(self._post_hook, always_call=True).remove)
            weights = [t for t in itertools.chain(module.parameters(), module.buffers()) if not hasattr(t, self._attr)]
            for t in weights:  # the weights live on the device
                setattr(t, self._attr, _NET)
            self._undo.append(lambda weights=weights: self._unmark(weights))
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        while self._undo:
            self._undo.pop()()

    def _pre_hook(self, module, args):
        if threading.get_ident() == self._thread:
            self._inside += 1

    def _post_hook(self, module, args, output):
        if threading.get_ident() != self._thread:
            return None
        self._inside -= 1
        if not self._inside:
            self.forwards += 1
            if self._in_step:
                self._step_forwards += 1
        self.tag(output)
        return None


def _modules(model: Any) -> list[torch.nn.Module]:
    """The network modules to hook: the module itself, an adapter's ``model`` and its separate backbone."""
    if model is None:
        return []
    if isinstance(model, torch.nn.Module):
        return [model]
    found = []
    network = getattr(model, "model", None)
    if isinstance(network, torch.nn.Module):
        found.append(network)
        backbone = getattr(network, "base_model", None)
        if isinstance(backbone, torch.nn.Module) and backbone is not network:
            found.append(backbone)
    return found


def _short(filename: str) -> str:
    path = os.path.abspath(filename)
    if path.startswith(_REFUSION_DIR):
        return "refusion/" + path[len(_REFUSION_DIR) :]
    for marker in ("site-packages" + os.sep, os.sep + "refusion_kernels" + os.sep, os.sep + "benchmarks" + os.sep):
        at = path.rfind(marker)
        if at >= 0:
            return path[at + (len(marker) if marker.startswith("site") else 1) :]
    return os.path.basename(path)


def call_site(frame: Any) -> str:
    """``file:line (function)`` of the first refusion frame, with the innermost other frame when it differs."""
    innermost = None
    while frame is not None:
        filename = frame.f_code.co_filename
        path = os.path.abspath(filename)
        if path != _HERE and not path.startswith(_TORCH_DIR):
            where = f"{_short(filename)}:{frame.f_lineno} ({frame.f_code.co_name})"
            if any(root in path for root in _ROOTS):
                return where if innermost is None or innermost == where else f"{where} <- {innermost}"
            if innermost is None:
                innermost = where
        frame = frame.f_back
    return innermost or "?"


def format_table(rows: Iterable[dict[str, Any]]) -> str:
    """A text table of :meth:`HostReads.summary` dicts that also carry ``label`` and ``batch``."""
    lines = [
        (
            f"{'case':<40} {'batch':>5} {'steps':>6} {'reads':>7} {'/step':>7} {'/seq/step':>9} {'outside':>7} "
            f"{'placed/step':>11}  by kind"
        )
    ]
    for row in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(row["by_kind"].items(), key=lambda kv: -kv[1]))
        lines.append(
            f"{row['label']:<40} {row['batch']:>5} {row['steps']:>6} {row['total']:>7} {row['per_step']:>7.2f} "
            f"{row['per_sequence_step']:>9.3f} {row['outside_steps']:>7} {row['placed_per_step']:>11.2f}  {kinds}"
        )
    return "\n".join(lines)
