"""Which input lines a batch still has to run: lines of a file or a list of rows, less those already done.

A line is ``(line number, raw JSON text)``, numbered from 1, and is known by
its :func:`~refusion.batch.output.row_key`: its id, else its line number. A
row already in the output is skipped; a second row with an id seen before,
and a line that cannot be read as text, become error rows (id ``null``, their
``line``) handed to the caller instead of being run. Shared by the embedded
run and the Ray run, which both write what a worker yields.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from refusion.batch.output import result_row, row_key
from refusion.batch.rows import peek_id


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


def unreadable(number: int) -> dict:
    """The error row of line ``number``, which is not UTF-8 text (a file) or not JSON-able (a row object)."""
    return result_row(None, number, error=f"row: line {number} is not UTF-8 text or not JSON-able")


def pending_lines(
    lines: Iterable[tuple[int, str | None]], done: set, early: deque, counts: dict
) -> Iterator[tuple[int, str]]:
    """The lines still to run: rows already in the output are skipped (``counts["skipped"]``); a repeated id and an
    unreadable line become error rows put on ``early`` (written by the caller) instead of being run."""
    seen: dict[str, int] = {}
    for number, text in lines:
        row_id = peek_id(text) if text is not None else None
        if row_id is not None and row_id in seen:
            row_id = None  # a repeated id: known by its line, an error row
            repeated = True
        else:
            repeated = False
        if row_key(row_id, number) in done:
            counts["skipped"] += 1
            continue
        if text is None:
            early.append(unreadable(number))
        elif repeated:
            given = str(peek_id(text))
            early.append(
                result_row(
                    None,
                    number,
                    error=f"id: `id` {given!r} is used again (first on line "
                    f"{seen[given]}); ids must be unique, so this row was not run",
                )
            )
        else:
            if row_id is not None:
                seen[row_id] = number
            yield number, text


def count_pending(source: Any, done: set) -> int | None:
    """How many rows a run will write (for the progress bar); ``None`` when the input is not a file or a list."""
    if not isinstance(source, (str, os.PathLike, list, tuple)):
        return None
    counts = {"skipped": 0}
    early: deque = deque()
    return sum(1 for _ in pending_lines(input_lines(source), done, early, counts)) + len(early)


def is_dataset(value: Any) -> bool:
    """Whether ``value`` is a Ray Dataset (checked without importing Ray)."""
    return type(value).__module__.startswith("ray.data")
