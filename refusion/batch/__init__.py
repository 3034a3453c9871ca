"""Offline generation over JSON Lines: ``refusion batch INPUT --out OUTPUT`` and ``refusion.run_batch(...)``.

One request per input row (:mod:`refusion.batch.rows`), results appended to
the output as they finish (:mod:`refusion.batch.output`), a rerun resuming
where the last one stopped. Embedded by default: one process, one
continuous-batching batcher (:mod:`refusion.batch.worker`,
:mod:`refusion.batch.embedded`); with ``ray=`` the rows run on Ray Data
(``refusion.batch.ray_data``, the ``[ray]`` extra). See ``docs/scaling.md``.
"""

from __future__ import annotations

from refusion.batch.embedded import BatchSummary, run_batch
from refusion.batch.output import RESULT_FIELDS, ResultWriter, result_row
from refusion.batch.rows import ROW_FIELDS, BatchRow, parse_line
from refusion.batch.worker import BatchWorker
from refusion.errors import RowError

__all__ = [
    "RESULT_FIELDS",
    "ROW_FIELDS",
    "BatchRow",
    "BatchSummary",
    "BatchWorker",
    "ResultWriter",
    "RowError",
    "parse_line",
    "result_row",
    "run_batch",
]
