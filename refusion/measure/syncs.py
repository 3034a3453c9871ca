"""Count the synchronisations of a decode on a CUDA device: the points where the host really waits for the GPU.

:class:`CudaSyncs` turns on torch's sync debug mode
(``torch.cuda.set_sync_debug_mode("warn")``), under which every CUDA call
that makes the host wait warns: a copy between the device and pageable host
memory in either direction (``item``, ``tolist``, ``cpu()``, ``bool()``,
``tensor.to("cuda")`` of host data), ops whose output size depends on the
data (``nonzero``, boolean indexing, ...) and stream synchronisations. It
counts those warnings per engine step (:meth:`DecodeLoop.step
<refusion.decoding.loop.DecodeLoop.step>`) and per call site. Where
:class:`~refusion.measure.host_reads.HostReads` follows device data on the
CPU and counts the reads a GPU would make, this counts what the GPU did,
uploads of host data included. Needs CUDA; one context at a time, and it
sees every thread's synchronisations.
"""

from __future__ import annotations

import collections
import sys
import threading
import warnings
from typing import Any

import torch

from refusion.measure.host_reads import PerStep, StepReads, call_site

#: what torch's sync debug mode warns
_MESSAGE = "called a synchronizing CUDA operation"


class CudaSyncs(PerStep):
    """``with CudaSyncs() as syncs:`` count CUDA synchronisations (see the module docstring).

    Afterwards: :attr:`total`, :attr:`steps` (one
    :class:`~refusion.measure.host_reads.StepReads` per engine step, its
    ``reads`` the step's synchronisations; the per-step rates of
    :class:`~refusion.measure.host_reads.PerStep`), :attr:`sites` and
    :meth:`summary`.
    Raises ``RuntimeError`` on entry where CUDA is not available.
    """

    def __init__(self):
        self.total = 0
        self.sites: collections.Counter[str] = collections.Counter()
        self.steps: list[StepReads] = []
        self._in_step = False
        self._step = 0
        self._undo: list = []

    def summary(self, sites: int = 10) -> dict[str, Any]:
        """Every figure as plain JSON-ready values."""
        return {
            "total": self.total,
            "steps": len(self.steps),
            "step_syncs": self.step_reads,
            "outside_steps": self.total - self.step_reads,
            "per_step": self.per_step,
            "max_per_step": max((s.reads for s in self.steps), default=0),
            "per_sequence_step": self.per_sequence_step,
            "top_sites": [{"count": c, "site": s} for s, c in self.sites.most_common(sites)],
        }

    def _seen(self, message, category, filename, lineno, file=None, line=None) -> None:
        if _MESSAGE not in str(message):
            return self._show(message, category, filename, lineno, file, line)
        self.total += 1
        frame: Any = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename == warnings.__file__:  # the warnings machinery
            frame = frame.f_back
        self.sites[call_site(frame)] += 1
        if self._in_step:
            self._step += 1
        return None

    def __enter__(self) -> CudaSyncs:
        from refusion.decoding.loop import DecodeLoop

        if not torch.cuda.is_available():
            raise RuntimeError("CudaSyncs counts CUDA synchronisations and needs CUDA")
        probe, original_step = self, DecodeLoop.step

        def step(runner, *args, **kwargs):
            if probe._in_step:
                return original_step(runner, *args, **kwargs)
            live, probe._step, probe._in_step = len(runner), 0, True
            try:
                return original_step(runner, *args, **kwargs)
            finally:
                probe._in_step = False
                probe.steps.append(StepReads(live, probe._step, 0, 0))

        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("always", message=".*" + _MESSAGE)
        self._show, warnings.showwarning = warnings.showwarning, self._seen
        setattr(DecodeLoop, "step", step)  # noqa: B010 (a method patched for the probe's lifetime)
        self._undo.append(lambda: setattr(DecodeLoop, "step", original_step))
        self._thread = threading.get_ident()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.set_sync_debug_mode("default")
        while self._undo:
            self._undo.pop()()
        self._warnings.__exit__(*exc)
