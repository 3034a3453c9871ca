"""One line of a batch input file -> a checked :class:`BatchRow`, or a :class:`RowError` naming the field.

A row is a JSON object with an ``id`` (string or integer), a ``prompt``
(text or token ids) or chat ``messages`` (``[{"role": ..., "content": ...}]``)
and optionally ``gen_length`` (or its OpenAI name ``max_tokens``), ``seed``, ``preset``, part names
(``partitioner``, ``selector``, ``infiller``, ``reorderer``), ``params`` (part
parameters, as an object or as ``"key=value"`` strings) and sampling
(``temperature``, ``top_k``, ``top_p``). Only types, names and the presence of
fields are checked here; ranges are checked when the row's decoder is built
and its prompt prepared (:mod:`refusion.batch.worker`). Nothing is imported:
a part named by ``"module:Class"`` path is refused unless ``allow_imports``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from refusion.config.build import PART_KINDS
from refusion.config.params import parse_param
from refusion.config.trust import is_import_path, refuse_import_paths
from refusion.errors import ConfigError, RowError
from refusion.validators import is_integer, is_number

#: the fields a row may have
ROW_FIELDS = (
    "id",
    "prompt",
    "messages",
    "gen_length",
    "max_tokens",
    "seed",
    "preset",
    *PART_KINDS,
    "params",
    "temperature",
    "top_k",
    "top_p",
)
#: how a trusted user lets rows name classes by module path
IMPORT_OPT_IN = "Trusted input may allow it with `--allow-imports` (`allow_imports=True`)."


@attrs.frozen
class BatchRow:
    """A checked row: its ``id``, its ``prompt`` (text, token ids, or the ``messages`` list when ``chat``),
    ``options``, the row's own keywords for :meth:`Batcher.submit <refusion.batcher.Batcher.submit>`
    (``gen_length``, ``seed``, ``preset``, part names, flat part parameters, sampling), and its ``line`` in the
    input (from 1)."""

    id: str
    prompt: Any
    chat: bool
    options: dict
    line: int = 0


def read_id(value: Any) -> str | None:
    """The row id of ``value`` (a parsed row): its ``id`` as a string, or ``None`` if it has no valid one."""
    if not isinstance(value, Mapping):
        return None
    given = value.get("id")
    if not (is_integer(given) or isinstance(given, str)) or given == "":
        return None
    return str(given)


def peek_id(text: str) -> str | None:
    """The valid ``id`` of a raw line, or ``None`` (not JSON, not an object, no valid id); never raises."""
    try:
        return read_id(json.loads(text))
    except (ValueError, RecursionError):
        return None


def parse_line(text: str, number: int, *, allow_imports: bool = False) -> BatchRow:
    """The :class:`BatchRow` of line ``number`` (counted from 1) holding ``text``; :class:`RowError` if it is bad.

    The error's ``row_id`` is the row's ``id`` when it could be read (else
    ``None``) and its ``line`` is ``number``; its ``param`` names the field at
    fault (``row`` when the line is not a JSON object at all).
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RowError(f"line {number} is not valid JSON ({str(exc)[:200]}).", param="row", line=number) from None
    if not isinstance(value, dict):
        raise RowError(f"line {number} must be a JSON object; got {type(value).__name__}.", param="row", line=number)
    row_id = read_id(value)

    def fail(field: str, message: str) -> RowError:
        return RowError(f"`{field}` {message}", param=field, row_id=row_id, line=number)

    for field in value:
        if field not in ROW_FIELDS:
            raise fail(field, f"is not a row field; rows take: {', '.join(ROW_FIELDS)}.")
    if row_id is None:
        got = f"; got {value['id']!r:.80}" if "id" in value else ""
        raise fail("id", f"is required: a non-empty string or an integer, unique in the file{got}.")
    if ("prompt" in value) == ("messages" in value):
        raise fail("prompt", "or `messages` is required (exactly one of them).")
    chat = "messages" in value
    prompt = _messages(value["messages"], fail) if chat else _prompt(value["prompt"], fail)
    options: dict[str, Any] = {}
    if "gen_length" in value and "max_tokens" in value:
        raise fail("max_tokens", "is another name for `gen_length`: give one of them.")
    for field in ("gen_length", "max_tokens", "seed", "top_k"):
        if field in value:
            options["gen_length" if field == "max_tokens" else field] = _integer(value[field], field, fail)
    for field in ("temperature", "top_p"):
        if field in value:
            options[field] = _number(value[field], field, fail)
    if "preset" in value:
        options["preset"] = _preset(value["preset"], fail)
    for kind in PART_KINDS:
        if kind in value:
            options[kind] = _part(kind, value[kind], fail)
    params = _params(value["params"], fail) if "params" in value else {}
    for key in params:
        if key in ROW_FIELDS:
            raise fail(f"params.{key}", f"is a row field: give it as the row's own `{key}`.")
    if not allow_imports:
        try:
            refuse_import_paths({**options, "params": params}, where=f"row {row_id!r}", opt_in=IMPORT_OPT_IN)
        except ConfigError as exc:
            raise RowError(str(exc), param=exc.param, row_id=row_id, line=number) from None
    options.update(params)
    return BatchRow(row_id, prompt, chat, options, number)


def _prompt(value: Any, fail: Any) -> Any:
    if isinstance(value, str):
        if not value:
            raise fail("prompt", "is empty.")
        return value
    if isinstance(value, list) and value and all(is_integer(t) and t >= 0 for t in value):
        return list(value)
    raise fail("prompt", f"must be text or a non-empty list of token ids (integers >= 0); got {value!r:.80}.")


def _messages(value: Any, fail: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise fail(
            "messages", f'must be a non-empty list of {{"role": ..., "content": ...}} objects; got {value!r:.80}.'
        )
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise fail(f"messages[{i}]", f"must be an object with `role` and `content`; got {message!r:.80}.")
        for key in message:
            if key not in ("role", "content"):
                raise fail(f"messages[{i}].{key}", "is not a message field; messages take: role, content.")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise fail(f"messages[{i}].{key}", f"must be text; got {message.get(key)!r:.80}.")
        out.append({"role": message["role"], "content": message["content"]})
    return out


def _integer(value: Any, field: str, fail: Any) -> int:
    if not is_integer(value):
        raise fail(field, f"must be an integer; got {value!r:.80}.")
    if field in ("gen_length", "max_tokens") and value < 1:
        raise fail(field, f"must be an integer >= 1; got {value!r}.")
    return value


def _number(value: Any, field: str, fail: Any) -> float:
    if not is_number(value):
        raise fail(field, f"must be a finite number; got {value!r:.80}.")
    return value


def _preset(value: Any, fail: Any) -> str:
    from refusion.config import PRESETS

    if not isinstance(value, str) or value not in PRESETS:
        raise fail("preset", f"must be a preset name ({', '.join(sorted(PRESETS))}); got {value!r:.80}.")
    return value


def _part(kind: str, value: Any, fail: Any) -> str:
    from refusion.plugins.registry import registry

    if not isinstance(value, str) or not value:
        raise fail(kind, f"must be a {kind} name (`refusion plugins` lists them); got {value!r:.80}.")
    if not is_import_path(value):
        known = registry().names(kind)
        if value not in known:
            raise fail(kind, f"{value!r} is not a registered {kind}; known: {', '.join(sorted(known))}.")
    return value


def _params(value: Any, fail: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        parsed = {}
        for i, text in enumerate(value):
            if not isinstance(text, str):
                raise fail(f"params[{i}]", f'must be a "key=value" string; got {text!r:.80}.')
            try:
                key, param = parse_param(text)
            except ValueError as exc:
                raise fail(f"params[{i}]", f"{exc}.") from None
            parsed[key] = param
        return parsed
    raise fail("params", f'must be an object of part parameters or a list of "key=value" strings; got {value!r:.80}.')
