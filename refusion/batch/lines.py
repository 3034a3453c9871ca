"""Which input lines a batch still has to run: lines of a file or a list of rows, less those already done.

A line is ``(line number, raw JSON text)``, numbered from 1. A row whose id
the output already holds is skipped; a second row with an id seen before, and
a line that cannot be read as text, become error rows (id ``line-N``) handed
to the caller instead of being run. Shared by the embedded run and the Ray
run, which both write what a worker yields.
"""

from __future__ import annotations

import json
import os
from collections import deque
from typing import Any, Iterable, Iterator

from refusion.batch.output import result_row
from refusion.batch.rows import line_id, peek_id


def input_lines(source: Any) -> Iterator[tuple[int, str | None]]:
    """``(line number, text)`` of every non-blank line of a JSON Lines file, or of a list of row objects.

    Text that is not UTF-8 (a file) or a row that is not JSON-able (a list)
    is passed on as ``None``: an error row.
    """
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    yield number, None
                    continue
                if text.strip():
                    yield number, text
        return
    for number, row in enumerate(source, 1):
        try:
            yield number, json.dumps(row, allow_nan=False)
        except (TypeError, ValueError):
            yield number, None


def pending_lines(lines: Iterable[tuple[int, str | None]], done: set[str], early: deque,
                  counts: dict) -> Iterator[tuple[int, str]]:
    """The lines still to run: rows already in the output are skipped (``counts["skipped"]``); a repeated id and an
    unreadable line become error rows put on ``early`` (written by the caller) instead of being run."""
    seen: dict[str, int] = {}
    for number, text in lines:
        row_id = peek_id(text) if text is not None else None
        key = row_id or line_id(number)
        if key in done:
            counts["skipped"] += 1
            continue
        if text is None:
            early.append(result_row(key, error=f"row: line {number} is not UTF-8 text or not JSON-able"))
        elif row_id is not None and row_id in seen:
            if line_id(number) in done:
                counts["skipped"] += 1
                continue
            early.append(result_row(line_id(number), error=f"id: `id` {row_id!r} is used again (first on line "
                                    f"{seen[row_id]}); ids must be unique, so this row was not run"))
        else:
            if row_id is not None:
                seen[row_id] = number
            yield number, text


def count_pending(source: Any, done: set[str]) -> int | None:
    """How many rows a run will write (for the progress bar); ``None`` when the input is not a file or a list."""
    if not isinstance(source, (str, os.PathLike, list, tuple)):
        return None
    return sum(1 for number, text in input_lines(source)
               if ((peek_id(text) if text is not None else None) or line_id(number)) not in done)


def is_dataset(value: Any) -> bool:
    """Whether ``value`` is a Ray Dataset (checked without importing Ray)."""
    return type(value).__module__.startswith("ray.data")
