"""The output of a batch: result rows, appended one whole line at a time to a JSON Lines file that a rerun resumes.

Each line is one :func:`result_row`: ``id`` (the row's own id, or ``null``
for a line that has no usable one), ``line`` (its line in the input, from 1),
``text``, ``tokens``, ``forwards``, ``tokens_per_forward`` and ``error``
(``None``, or ``"field: message"`` for a row that could not be run; the
other fields are then ``None``). A row is known by its :func:`row_key`: its
id, else its line number, so an id the batch makes up can never collide with
one a user gave.

:class:`ResultWriter` checks the file before it writes or cuts anything (a
regular file, not the input, holding result rows or nothing) and appends each
row with a single write, so an interrupted run leaves at most a partial last
line (a crash mid-write), which the next run cuts off before appending.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from refusion.errors import ConfigError

#: the keys of a result row, in the order they are written
RESULT_FIELDS = ("id", "line", "text", "tokens", "forwards", "tokens_per_forward", "error")
#: how every result line starts (:func:`result_row` puts ``id`` first), so a cut-off last line is recognised
ROW_START = b'{"id": '


def error_text(error: BaseException | str) -> str:
    """``"field: message"`` for a failure: a :class:`ConfigError`'s ``param``, else ``row`` and the exception type."""
    if isinstance(error, str):
        return error
    param = getattr(error, "param", None)
    if isinstance(error, ConfigError):
        return f"{param or 'row'}: {error}"
    return f"{param or 'row'}: {type(error).__name__}: {error}"


def result_row(row_id: str | None, line: int, result: Any = None, error: BaseException | str | None = None) -> dict:
    """The output line of the row with id ``row_id`` (``None``: it has none) on input line ``line``: from a
    :class:`~refusion.decoding.types.DecodeResult`, or an error."""
    if error is not None or result is None:
        return {
            "id": row_id,
            "line": line,
            "text": None,
            "tokens": None,
            "forwards": None,
            "tokens_per_forward": None,
            "error": error_text(error if error is not None else "row: no result"),
        }
    return {
        "id": row_id,
        "line": line,
        "text": result.text,
        "tokens": [int(t) for t in result.tokens.tolist()],
        "forwards": int(result.forwards),
        "tokens_per_forward": float(result.tokens_per_forward),
        "error": None,
    }


def row_key(row_id: str | None, line: int) -> str | int:
    """What identifies a row in the output: its id (text), else its line number (an int, so never equal to an id)."""
    return row_id if row_id is not None else line


def row_line(row: dict) -> bytes:
    """``row`` as one line of UTF-8 JSON; text that UTF-8 cannot hold (a lone surrogate) is written as a JSON
    ``\\u`` escape, which reads back as the same string."""
    fields = {k: row.get(k) for k in RESULT_FIELDS}
    try:
        return (json.dumps(fields, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(fields) + "\n").encode("ascii")


def check_output(path: str | os.PathLike, source: str | os.PathLike | None = None, *, param: str = "out") -> None:
    """Refuse an output path that cannot hold results, before anything is opened: its folder must exist, and
    what is there must be a regular file (not a directory, a device such as ``/dev/zero``, a FIFO or a pipe)
    that is not ``source`` (compared by device and inode, so a hard link or a symbolic link is caught too)."""
    out = Path(path)
    if not out.parent.is_dir():
        raise ConfigError(
            f"`{param}` {str(out)!r} is in a folder that does not exist ({str(out.parent)!r}).", param=param
        )
    try:
        found = os.stat(out)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"`{param}` {str(out)!r} cannot be read: {exc.strerror or exc}.", param=param) from None
    _check_kind(found, out, source, param)


def _check_kind(found: os.stat_result, out: Path, source: Any, param: str) -> None:
    if stat.S_ISDIR(found.st_mode):
        raise ConfigError(f"`{param}` {str(out)!r} is a directory; give a file path.", param=param)
    if not stat.S_ISREG(found.st_mode):
        kind = (
            "a FIFO or pipe"
            if stat.S_ISFIFO(found.st_mode)
            else "a device"
            if stat.S_ISCHR(found.st_mode) or stat.S_ISBLK(found.st_mode)
            else "a socket"
            if stat.S_ISSOCK(found.st_mode)
            else "not a file"
        )
        raise ConfigError(
            f"`{param}` {str(out)!r} is {kind}, not a regular file; results are appended to a file a "
            "rerun can read back.",
            param=param,
        )
    if source is not None:
        try:
            given = os.stat(source)
        except OSError:
            return
        if (given.st_dev, given.st_ino) == (found.st_dev, found.st_ino):
            raise ConfigError(
                f"`{param}` {str(out)!r} is the input file {str(source)!r} (the same file on disk); "
                "write the results elsewhere.",
                param=param,
            )


class ResultWriter:
    """Appends result rows to ``path`` (created if missing), each row (:func:`row_key`) at most once.

    Opening checks the file (:func:`check_output`, again on the open file),
    reads the rows already written (:attr:`done`, their keys) and only then
    cuts off a cut-short last line. A file holding anything but result rows
    (a JSON object with a text ``id``, or a ``null`` id and an integer
    ``line``) is refused with :class:`ConfigError` and left as it was, so a
    wrong ``out`` (e.g. the input file, or notes) is never damaged. ``source``
    is the input file, when there is one.
    """

    def __init__(self, path: str | os.PathLike, source: str | os.PathLike | None = None, *, param: str = "out"):
        self.path = Path(path)
        self.param = param
        self.done: set[str | int] = set()
        check_output(self.path, source, param=param)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise ConfigError(
                f"`{param}` {str(self.path)!r} cannot be opened: {exc.strerror or exc}.", param=param
            ) from None
        try:
            _check_kind(os.fstat(self._fd), self.path, source, param)  # what was opened, not what was looked at
            self._resume()
        except BaseException:
            os.close(self._fd)
            raise

    def _refuse(self, number: int) -> ConfigError:
        return ConfigError(
            f"`{self.param}` {str(self.path)!r}, line {number}: not a result row (a JSON object with "
            "a text `id`); is it the right file? It was left as it is.",
            param=self.param,
        )

    def _resume(self) -> None:
        """Read the rows already written; then cut a cut-short last line (or end a whole one with its newline)."""
        end, number, tail = 0, 0, b""
        with open(self._fd, "rb", closefd=False) as f:
            f.seek(0)
            for number, raw in enumerate(f, 1):
                if not raw.endswith(b"\n"):
                    tail = raw
                    break
                end += len(raw)
                if raw.strip():
                    self.done.add(self._key(raw, number))
        if not tail:
            return
        try:
            self.done.add(self._key(tail, number))  # a whole row without its newline
            os.write(self._fd, b"\n")
        except ConfigError:
            if not (tail.startswith(ROW_START) or ROW_START.startswith(tail)):
                raise
            os.ftruncate(self._fd, end)  # a row cut short by a crash: written again by this run

    def _key(self, raw: bytes, number: int) -> str | int:
        try:
            row = json.loads(raw)
        except ValueError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("id"), str):
            return row["id"]
        if (
            isinstance(row, dict)
            and row.get("id", 0) is None
            and isinstance(row.get("line"), int)
            and not isinstance(row.get("line"), bool)
        ):
            return row["line"]
        raise self._refuse(number)

    def write(self, row: dict) -> bool:
        """Append ``row`` as one line (one write); ``False`` (nothing written) if its row is already done."""
        key = row_key(row["id"], row["line"])
        if key in self.done:
            return False
        data = row_line(row)
        written = os.write(self._fd, data)
        while written < len(data):  # a short write (disk full?): the rest, or an OSError
            written += os.write(self._fd, data[written:])
        self.done.add(key)
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
