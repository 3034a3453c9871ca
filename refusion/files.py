"""Reading the JSON and JSON Lines files a user hands in (records, task files, space files, traces, specs).

Every failure is a :class:`~refusion.errors.ConfigError` whose message starts
with ``where(what, path, line)`` (```tasks` file 'a.jsonl', line 3``) and
whose ``param`` is the caller's ``param``; nothing else is raised:

* a file that cannot be read (missing, a directory, no permission), or holds
  more than ``max_bytes`` (default :data:`MAX_BYTES`; a device such as
  ``/dev/zero`` is refused, not read for ever);
* bytes that are not UTF-8 (the line of the first bad byte);
* text that is not JSON (the line and column json reports), a number with
  more than Python's 4300 digits, or values nested deeper than ``max_depth``
  (default :data:`MAX_DEPTH`; ``'[' * 100000`` never reaches the recursion limit).

JSON's ``NaN`` and ``Infinity`` are read as floats (lm-evaluation-harness
writes them); callers check their fields' ranges.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from refusion.errors import ConfigError

#: files larger than this are refused before they are parsed
MAX_BYTES = 256 * 2**20
#: values nested deeper than this (arrays and objects) are refused
MAX_DEPTH = 64


def where(what: str, path: str | Path, line: int | None = None) -> str:
    """``"`tasks` file 'a.jsonl', line 3"``: how an error names a file (and a line of it)."""
    return f"{what} {str(path)!r}" + (f", line {line}" if line is not None else "")


def read_text(path: str | Path, *, what: str, param: str, max_bytes: int = MAX_BYTES) -> str:
    """The UTF-8 text of ``path`` (at most ``max_bytes`` bytes); ``what`` names the file in errors (```tasks`
    file``)."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{where(what, path)} cannot be read: {exc.strerror or exc}.", param=param) from None
    if len(data) > max_bytes:
        raise ConfigError(f"{where(what, path)} is larger than the limit of {max_bytes} bytes.", param=param)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{where(what, path, line)}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); save the file as UTF-8.",
            param=param,
        ) from None


def check_depth(value: Any, *, place: str, param: str, max_depth: int = MAX_DEPTH) -> Any:
    """``value`` if its lists and dicts nest at most ``max_depth`` deep, else a ConfigError starting with ``place``.

    Values shared by reference (YAML aliases) are walked again only when reached deeper than before, so a
    small document of many aliases ("billion laughs") is checked quickly, and a self-referencing one is refused.
    """
    stack = [(value, 1)]
    deepest: dict[int, int] = {}
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
        if children is None:
            continue
        if depth > max_depth:
            raise ConfigError(f"{place}: values are nested more than {max_depth} levels deep.", param=param)
        if deepest.get(id(item), 0) >= depth:
            continue
        deepest[id(item)] = depth
        stack.extend((child, depth + 1) for child in children)
    return value


def parse_text(
    text: str,
    parse: Callable[[str], Any],
    *,
    place: str,
    param: str,
    language: str,
    syntax: type[Exception] | tuple[type[Exception], ...],
    describe: Callable[[Any], str] = str,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """``parse(text)`` (``json.loads``, ``tomllib.loads``, ``yaml.safe_load``), every failure one
    :class:`ConfigError` starting with ``place``: a ``syntax`` error of ``language`` (``describe`` says where),
    values nested too deeply (Python's recursion limit, or deeper than ``max_depth``), a number too long to read."""
    try:
        value = parse(text)
    except syntax as exc:
        raise ConfigError(f"{place}: not valid {language} ({describe(exc)}).", param=param) from None
    except RecursionError:
        raise ConfigError(
            f"{place}: values are nested too deeply (more than {max_depth} levels are refused).", param=param
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{place}: a number cannot be read ({exc}).", param=param) from None
    return check_depth(value, place=place, param=param, max_depth=max_depth)


def _parse(text: str, place: str, param: str, line: int | None, max_depth: int) -> Any:
    def describe(exc: json.JSONDecodeError) -> str:
        return f"{exc.msg} at " + (f"line {exc.lineno}, column {exc.colno}" if line is None else f"column {exc.colno}")

    return parse_text(
        text,
        json.loads,
        place=place,
        param=param,
        language="JSON",
        syntax=json.JSONDecodeError,
        describe=describe,
        max_depth=max_depth,
    )


def read_json(
    path: str | Path, *, what: str, param: str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    """The one JSON value in ``path``; errors name ``what``, the file and, for bad JSON, the line and column."""
    text = read_text(path, what=what, param=param, max_bytes=max_bytes)
    return _parse(text, where(what, path), param, None, max_depth)


def read_json_lines(
    path: str | Path, *, what: str, param: str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH
) -> list[tuple[int, Any]]:
    """``(line number, value)`` for every non-blank line of the JSON Lines file ``path`` (numbered from 1)."""
    text = read_text(path, what=what, param=param, max_bytes=max_bytes)
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            out.append((number, _parse(line, where(what, path, number), param, number, max_depth)))
    return out


def check_output_dir(path: Any, param: str = "out") -> None:
    """Refuse an output directory that is an existing file or cannot be created (checks only, creates nothing)."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"`{param}` must be a directory path; got {path!r}.", param=param)
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ConfigError(
            f"`{param}` {str(path)!r} is an existing file; name a directory (it is created if missing).", param=param
        )
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(
            f"`{param}` {str(path)!r} cannot be created: {str(existing)!r} is not a writable directory.", param=param
        )
