"""Offline generation over JSON Lines: ``refusion batch INPUT --out OUTPUT`` and ``refusion.batch(...)``.

One request per input row (:mod:`refusion.batch.rows`), results appended to
the output as they finish (:mod:`refusion.batch.output`), a rerun resuming
where the last one stopped. Embedded by default: one process, one
continuous-batching generator (:mod:`refusion.batch.worker`,
:mod:`refusion.batch.embedded`); with ``ray=`` the rows run on Ray Data
(``refusion.batch.ray_data``, the ``[ray]`` extra). See ``docs/scaling.md``.

``refusion.batch`` is this package, and the package is callable:
``refusion.batch(...)`` is :func:`batch`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from refusion.batch.embedded import BatchSummary, run_batch
from refusion.batch.output import RESULT_FIELDS, ResultWriter, result_row
from refusion.batch.rows import ROW_FIELDS, BatchRow, RowError, parse_line
from refusion.batch.worker import BatchWorker


def batch(input: Any, out: Any, **kwargs: Any) -> BatchSummary:
    """Generate for every row of ``input`` into the JSON Lines file ``out``; :func:`run_batch` with its keywords.

    ``input`` is a JSON Lines file, a list of row objects or (with ``ray``) a
    ``ray.data.Dataset`` of ``{"line": str}`` or row objects. From Python the
    progress bar is on unless ``progress=False``.
    """
    return run_batch(input, out, **kwargs)


class _CallableModule(types.ModuleType):
    """This package's type: calling it calls :func:`batch`."""

    def __call__(self, input: Any, out: Any, **kwargs: Any) -> BatchSummary:
        return batch(input, out, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = [
    "RESULT_FIELDS",
    "ROW_FIELDS",
    "BatchRow",
    "BatchSummary",
    "BatchWorker",
    "ResultWriter",
    "RowError",
    "batch",
    "parse_line",
    "result_row",
    "run_batch",
]
