"""The output of a batch: result rows, appended one whole line at a time to a JSON Lines file that a rerun resumes.

Each line is one :func:`result_row`: ``id``, ``text``, ``tokens``,
``forwards``, ``tokens_per_forward`` and ``error`` (``None``, or
``"field: message"`` for a row that could not be run; the other fields are
then ``None``). :class:`ResultWriter` appends a line with a single write, so
an interrupted run leaves at most a partial last line (a crash mid-write),
which the next open cuts off before appending.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from refusion.errors import ConfigError

#: the keys of a result row, in the order they are written
RESULT_FIELDS = ("id", "text", "tokens", "forwards", "tokens_per_forward", "error")


def error_text(error: BaseException | str) -> str:
    """``"field: message"`` for a failure: a :class:`ConfigError`'s ``param``, else ``row`` and the exception type."""
    if isinstance(error, str):
        return error
    param = getattr(error, "param", None)
    if isinstance(error, ConfigError):
        return f"{param or 'row'}: {error}"
    return f"{param or 'row'}: {type(error).__name__}: {error}"


def result_row(row_id: str, result: Any = None, error: BaseException | str | None = None) -> dict:
    """The output line of row ``row_id``: from a :class:`~refusion.decoding.types.DecodeResult`, or an error."""
    if error is not None or result is None:
        return {"id": row_id, "text": None, "tokens": None, "forwards": None, "tokens_per_forward": None,
                "error": error_text(error if error is not None else "row: no result")}
    return {"id": row_id, "text": result.text, "tokens": [int(t) for t in result.tokens.tolist()],
            "forwards": int(result.forwards), "tokens_per_forward": float(result.tokens_per_forward), "error": None}


class ResultWriter:
    """Appends result rows to ``path`` (created if missing), each id at most once.

    Opening reads the ids already written (:attr:`done`) and cuts off a
    partial last line. A complete line that is not a result row (a JSON
    object with a string ``id``) is refused with :class:`ConfigError`, so
    that a wrong ``--out`` (e.g. the input file) is never appended to.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.done: set[str] = set()
        if self.path.is_dir():
            raise ConfigError(f"`out` {str(self.path)!r} is a directory; give a file path.", param="out")
        if not self.path.parent.is_dir():
            raise ConfigError(f"`out` {str(self.path)!r}: the folder {str(self.path.parent)!r} does not exist.",
                              param="out")
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise ConfigError(f"`out` {str(self.path)!r} cannot be opened: {exc.strerror or exc}.",
                              param="out") from None
        try:
            self._resume()
        except BaseException:
            os.close(self._fd)
            raise

    def _resume(self) -> None:
        """Read the ids already written; cut a partial last line."""
        with open(self._fd, "rb", closefd=False) as f:
            f.seek(0)
            data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            os.ftruncate(self._fd, end)
        for number, line in enumerate(data[:end].split(b"\n")[:-1], 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict) or not isinstance(row.get("id"), str):
                raise ConfigError(f"`out` {str(self.path)!r}, line {number}: not a result row (a JSON object with a "
                                  "string `id`); is it the right file?", param="out")
            self.done.add(row["id"])

    def write(self, row: dict) -> bool:
        """Append ``row`` as one line (one write, flushed); ``False`` (nothing written) if its id is already done."""
        if row["id"] in self.done:
            return False
        data = (json.dumps({k: row.get(k) for k in RESULT_FIELDS}, ensure_ascii=False) + "\n").encode("utf-8")
        written = os.write(self._fd, data)
        while written < len(data):  # a short write (disk full?): the rest, or an OSError
            written += os.write(self._fd, data[written:])
        self.done.add(row["id"])
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
