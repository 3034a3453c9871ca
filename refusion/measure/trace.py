"""The standard decode trace: JSON Lines, one record per iteration, and back.

A trace file holds, for each decoded sequence, a ``header`` record (the
partition, engine and decoder spec), one ``step`` record per decoder
iteration (planned, drafted, selected and committed slots with positions,
tokens and confidences; forwards and query tokens per forward; cache entries
appended, left pending, encoded and invalidated, key/value bytes copied and
written; wall time) and an ``end`` record (the answer and the sequence's
totals). The schema ships as ``refusion/schemas/trace.schema.json``
(:func:`schema`); ``docs/trace.md`` explains every field.

:func:`write_trace` writes results of any decode; :func:`read_trace` checks a
file in one pass (each line against the schema, compiled once, and against the
lines before it) and rebuilds the :class:`~refusion.decoding.types.DecodeResult` s,
``steps`` included; a damaged file is a :class:`~refusion.errors.ConfigError`
naming the line and the field. This module knows nothing about engines or strategies.
"""

from __future__ import annotations

import functools
import json
import math
import re
import reprlib
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from refusion.decoding.types import DecodeResult, IterationRecord, KVBytes, Partition, Slot
from refusion.errors import ConfigError

SCHEMA_NAME = "refusion-trace"
SCHEMA_VERSION = 1


def schema() -> dict:
    """The trace's JSON schema (draft 2020-12), as shipped in the package (a fresh copy each call)."""
    text = resources.files("refusion").joinpath("schemas/trace.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def records(result: DecodeResult, *, sequence: int = 0, tokenizer: Any = None, decoder: Any = None) -> list[dict]:
    """The trace records of one result: header, one step per iteration, end.

    ``tokenizer`` (optional) adds each committed token's text (``pieces``);
    ``decoder`` (optional) adds its :class:`~refusion.config.spec.DecoderSpec` (``to_dict()``).
    Reads ``result``; changes nothing. A result decoded without
    ``record=True`` has no iteration records and is refused.
    """
    from refusion.version import __version__

    if result.num_iterations and not result.iterations:
        raise ConfigError(
            "This result has no iteration records to trace: decode it with `record=True` (or `trace=`).",
            param="record",
        )

    start = result.prompt_length
    spec = None if decoder is None else decoder.spec.to_dict()
    out: list[dict] = [
        {
            "record": "header",
            "schema": SCHEMA_NAME,
            "version": SCHEMA_VERSION,
            "sequence": sequence,
            "refusion": __version__,
            "prompt_length": start,
            "gen_length": result.partition.gen_length,
            "slots": [
                {"offset": s.offset, "length": s.length, "block": s.block, "start": start + s.offset}
                for s in result.partition.slots
            ],
            "blocks": [list(b) for b in result.partition.blocks],
            "engine": result.engine,
            "decoder": spec,
        }
    ]
    every = result.region()
    slots = result.partition.slots
    for step in result.iterations:
        committed = []
        for index, kept in step.committed:
            slot = slots[index]
            tokens = [int(t) for t in every[slot.offset : slot.offset + kept]]
            entry: dict[str, Any] = {"slot": index, "start": start + slot.offset, "tokens": tokens}
            if tokenizer is not None:
                entry["pieces"] = [tokenizer.decode([t]) for t in tokens]
            committed.append(entry)
        out.append(
            {
                "record": "step",
                "sequence": sequence,
                "iteration": step.iteration,
                "block": step.block,
                "planned": list(step.planned),
                "drafted": list(step.drafted),
                "confidence": [min(max(float(c), 0.0), 1.0) for c in step.confidence],
                "selected": list(step.selected),
                "committed": committed,
                "revised": list(step.revised),
                "forwards": step.forwards,
                "fed_tokens": list(step.fed_tokens),
                "cache": {
                    "appended": step.kv_appended,
                    "pending": step.kv_pending,
                    "encoded": step.kv_encoded,
                    "invalidated": step.kv_invalidated,
                    "copied_bytes": step.kv_copied_bytes,
                    "written_bytes": step.kv_written_bytes,
                },
                "seconds": step.seconds,
            }
        )
    out.append(
        {
            "record": "end",
            "sequence": sequence,
            "tokens": result.tokens.tolist(),
            "text": result.text,
            "forwards": result.forwards,
            "fed_tokens": result.fed_tokens,
            "kv_bytes": {"context": result.kv_bytes.context, "new": result.kv_bytes.new},
            "stopped_at_eos": result.stopped_at_eos,
            "iterations": len(result.iterations),
            "engine_counters": result.engine_totals,
        }
    )
    return out


def write_trace(
    results: DecodeResult | Sequence[DecodeResult], path: str | Path, *, tokenizer: Any = None, decoder: Any = None
) -> Path:
    """Write the trace of one result or a batch of results (``sequence`` = index) to ``path``; return the path."""
    batch = [results] if isinstance(results, DecodeResult) else list(results)
    if not batch or not all(isinstance(r, DecodeResult) for r in batch):
        raise ConfigError(
            f"`results` must be a DecodeResult or a non-empty list of them; got {results!r:.80}.", param="results"
        )
    out = Path(path)
    try:
        with out.open("w", encoding="utf-8") as f:
            for i, result in enumerate(batch):
                for record in records(result, sequence=i, tokenizer=tokenizer, decoder=decoder):
                    f.write(json.dumps(record) + "\n")
    except OSError as exc:
        raise ConfigError(f"`trace` file {str(out)!r} could not be written: {exc}", param="trace") from exc
    return out


# -- reading: one pass over the lines; each is checked against the schema, then against the lines before it --------

#: most generation positions a trace may describe, all its sequences together: the results hold an entry per
#: position, so a short file cannot make the reader allocate more than this; far beyond any model's context
MAX_POSITIONS = 1 << 23
_INT64 = 1 << 63
_FLOAT = sys.float_info.max
_KINDS = ("header", "step", "end")
_NOTES = frozenset({"description", "title", "$id", "$schema"})
_PLAIN = {
    "string": (str, "a string"),
    "boolean": (bool, "true or false"),
    "null": (type(None), "null"),
    "object": (dict, "an object"),
    "array": (list, "a list"),
}
_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 40


class _Bad(Exception):
    """A value that breaks the trace's rules; ``path`` (keys and list indices) grows as it propagates outwards."""

    def __init__(self, message: str, *path: str | int):
        super().__init__(message)
        self.message, self.path = message, list(path)


def _show(value: Any) -> str:
    return _SHOWN.repr(value)


def _compile(node: dict, defs: dict, done: dict) -> Callable[[Any], None]:
    """A checker of ``node`` that raises :class:`_Bad`, for the subset of JSON Schema the trace uses.

    Stricter than JSON Schema where reading needs it: an integer is a JSON integer of 64 bits, a number is finite.
    A keyword or type outside the subset is a ValueError here, so the schema cannot outgrow the reader unnoticed.
    """
    node = {k: v for k, v in node.items() if k not in _NOTES}
    keys, kind = set(node), node.get("type")
    if keys == {"$ref"}:
        name = node["$ref"].rpartition("/")[2]
        if name not in done:
            done[name] = _compile(defs[name], defs, done)
        return done[name]
    if keys == {"const"}:
        return _const(node["const"])
    if kind in ("integer", "number") and keys <= {"type", "minimum", "maximum"}:
        return _number(kind == "integer", node.get("minimum"), node.get("maximum"))
    if kind == "array" and keys <= {"type", "items", "minItems"}:
        item = _compile(node["items"], defs, done) if "items" in node else None
        return _array(item, node.get("minItems", 0))
    if (
        kind == "object"
        and "properties" in node
        and keys <= {"type", "properties", "required", "additionalProperties"}
        and type(node.get("additionalProperties", True)) is bool
    ):
        fields = {key: _compile(sub, defs, done) for key, sub in node["properties"].items()}
        return _object(fields, tuple(node.get("required", ())), node.get("additionalProperties", True) is False)
    kinds = [kind] if isinstance(kind, str) else kind
    if keys == {"type"} and isinstance(kinds, list) and kinds and all(k in _PLAIN for k in kinds):
        return _plain(kinds)
    raise ValueError(f"trace schema: the reader does not support {node!r:.200}")


def _const(const: Any) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if type(v) is not type(const) or v != const:
            raise _Bad(f"must be {const!r}; got {_show(v)}")

    return check


def _number(integer: bool, low: Any, high: Any) -> Callable[[Any], None]:
    """An integer of 64 bits (or a finite number) in ``[low, high]``; ``check.every`` tests a whole list at once."""
    if integer:
        lo = -_INT64 if low is None else max(low, -_INT64)
        hi = _INT64 - 1 if high is None else min(high, _INT64 - 1)
    else:
        lo, hi = (-_FLOAT if low is None else low), (_FLOAT if high is None else high)

    def why(v: Any) -> str:
        if type(v) is not int and (integer or type(v) is not float):
            return f"must be {'an integer' if integer else 'a number'}; got {_show(v)}"
        if type(v) is float and not -_FLOAT <= v <= _FLOAT:
            return f"must be a finite number; got {_show(v)}"
        if v < lo:
            return f"must fit in 64 bits; got {_show(v)}" if lo == -_INT64 else f"must be >= {lo}; got {_show(v)}"
        if integer and hi == _INT64 - 1:
            return f"must fit in 64 bits; got {_show(v)}"
        return f"must be a finite number; got {_show(v)}" if hi == _FLOAT else f"must be <= {hi}; got {_show(v)}"

    if integer:

        def check(v: Any) -> None:
            if type(v) is not int or not lo <= v <= hi:
                raise _Bad(why(v))

        def every(vs: list) -> bool:  # three passes in C: types, smallest, largest
            return not vs or (set(map(type, vs)) == {int} and lo <= min(vs) and max(vs) <= hi)
    else:

        def check(v: Any) -> None:
            if (type(v) is not float and type(v) is not int) or not lo <= v <= hi:
                raise _Bad(why(v))

        def every(vs: list) -> bool:  # floats only (a NaN or infinity makes the sum non-finite)
            return not vs or (
                set(map(type, vs)) == {float} and math.isfinite(sum(vs)) and lo <= min(vs) and max(vs) <= hi
            )

    check.every = every  # type: ignore[attr-defined]
    return check


def _array(item: Callable[[Any], None] | None, least: int) -> Callable[[Any], None]:
    every = getattr(item, "every", None)

    def check(v: Any) -> None:
        if type(v) is not list:
            raise _Bad(f"must be a list; got {_show(v)}")
        if len(v) < least:
            raise _Bad(f"must hold at least {least} item{'s' if least > 1 else ''}; got {len(v)}")
        if item is None or (every is not None and every(v)):
            return
        for i, x in enumerate(v):  # the fast test failed (or there is none): find the bad item, if any
            _within(i, item, x)

    return check


def _object(fields: dict[str, Callable[[Any], None]], required: tuple, closed: bool) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if type(v) is not dict:
            raise _Bad(f"must be an object; got {_show(v)}")
        for key in required:
            if key not in v:
                raise _Bad("is missing (required)", key)
        for key, sub in v.items():
            field = fields.get(key)
            if field is None:
                if closed:
                    raise _Bad("is not a field of the trace format", key)
                continue
            _within(key, field, sub)

    return check


def _within(step: str | int, check: Callable[[Any], None], value: Any) -> None:
    """``check(value)``, a failure's field path prefixed with ``step`` (the key or index ``value`` sits at)."""
    try:
        check(value)
    except _Bad as bad:
        bad.path.insert(0, step)
        raise


def _plain(kinds: list[str]) -> Callable[[Any], None]:
    types = tuple(_PLAIN[k][0] for k in kinds)
    wanted = " or ".join(_PLAIN[k][1] for k in kinds)

    def check(v: Any) -> None:
        if type(v) not in types:
            raise _Bad(f"must be {wanted}; got {_show(v)}")

    return check


@functools.cache
def _checkers() -> dict[str, Callable[[Any], None]]:
    """One checker per record kind, compiled once from the shipped schema."""
    defs, done = schema()["$defs"], dict[str, Any]()
    return {kind: _compile({"$ref": f"#/$defs/{kind}"}, defs, done) for kind in _KINDS}


_KEY = re.compile(r'"((?:[^"\\]|\\.){1,80})"\s*:')


def _near(before: str) -> str:
    """The last object key in ``before``: the field an unreadable stretch of a line belongs to."""
    keys = _KEY.findall(before)
    return keys[-1] if keys else "(line)"


def _deep(text: str, depth: int = 100) -> int:
    """Where brackets first nest ``depth`` deep in ``text``, strings skipped (on the error path only)."""
    level, quoted, escaped = 0, False, False
    for i, ch in enumerate(text):
        if quoted:
            quoted, escaped = (True, False) if escaped else (ch != '"', ch == "\\")
        elif ch == '"':
            quoted = True
        elif ch in "[{":
            level += 1
            if level >= depth:
                return i
        elif ch in "]}":
            level -= 1
    return len(text)


def _parse(raw: bytes) -> Any:
    """The JSON value of one line; :class:`_Bad`, naming the nearest field, when it is not UTF-8 JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(
            f"not UTF-8 text (byte {raw[exc.start]:#04x} at byte {exc.start + 1} of the line)",
            _near(raw[: exc.start].decode("utf-8")),
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Bad(f"not a JSON object ({exc.msg} at column {exc.colno})", _near(text[: exc.pos])) from None
    except RecursionError:
        raise _Bad("lists or objects nested too deep", _near(text[: _deep(text)])) from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits())
        limit = sys.get_int_max_str_digits()
        start = next((m.start() for m in re.finditer(r"\d+", text) if m.end() - m.start() > limit), 0)
        raise _Bad(f"an integer of more than {limit} digits", _near(text[:start])) from None


def _records(source: Path) -> Iterator[tuple[int, str, dict]]:
    """``(line number, kind, record)`` of each non-blank line: UTF-8 JSON that fits the schema."""
    checkers = _checkers()
    try:
        f = source.open("rb")
    except OSError as exc:
        raise ConfigError(f"`trace` file {str(source)!r} could not be read: {exc}", param="trace") from exc
    with f:
        for number, raw in enumerate(f, 1):
            if raw.isspace():
                continue
            kind = None
            try:
                record = _parse(raw)
                if type(record) is not dict:
                    raise _Bad(f"not a JSON object; got {_show(record)}")
                kind = record.get("record")
                if type(kind) is not str or kind not in checkers:
                    kind = None
                    raise _Bad(f"must be 'header', 'step' or 'end'; got {_show(record.get('record'))}", "record")
                checkers[kind](record)
            except _Bad as bad:
                raise _refusal(source, number, kind, bad) from None
            yield number, kind, record


def _refusal(source: Path, number: int, kind: str | None, bad: _Bad) -> ConfigError:
    """The ConfigError of a bad line: ``file:line: kind record, field `a.0.b`: what is wrong.``, ``param`` the field."""
    where = ".".join(map(str, bad.path)) or "(line)"
    return ConfigError(
        f"{source}:{number}: {kind + ' record, ' if kind else ''}field `{where}`: {bad.message}.", param=where
    )


def load_records(path: str | Path) -> list[dict]:
    """Every record of a trace file, each checked against the schema alone (errors name the line and the field)."""
    out = [record for _, _, record in _records(Path(path))]
    if not out:
        raise ConfigError(
            f"{path}: the trace is empty; expected a header, step records and an end record.", param="trace"
        )
    return out


def _partition(h: dict) -> Partition:
    """The header's partition: slots end to end over ``gen_length``, each listed once, in its own block."""
    g, prompt, blocks = h["gen_length"], h["prompt_length"], h["blocks"]
    slots: list[Slot] = []
    offset = 0
    for i, s in enumerate(h["slots"]):
        if s["offset"] != offset:
            raise _Bad(
                f"is {s['offset']}; slot {i} must start where the one before ends, at {offset}", "slots", i, "offset"
            )
        if s["start"] != prompt + offset:
            raise _Bad(f"is {s['start']}; expected `prompt_length` + `offset` = {prompt + offset}", "slots", i, "start")
        if s["block"] >= len(blocks):
            raise _Bad(f"is {s['block']}; the header has {len(blocks)} blocks", "slots", i, "block")
        if offset + s["length"] > g:
            raise _Bad(f"is {s['length']}; the slot would end past `gen_length` {g}", "slots", i, "length")
        slots.append(Slot(i, offset, s["length"], s["block"]))
        offset += s["length"]
    if offset != g:
        raise _Bad(f"is {g}; the slots cover {offset} positions", "gen_length")
    listed = [False] * len(slots)
    for b, members in enumerate(blocks):
        for j, index in enumerate(members):
            if index >= len(slots):
                raise _Bad(f"slot {index} is not one of the header's {len(slots)} slots", "blocks", b, j)
            if slots[index].block != b or listed[index]:
                why = "is listed twice" if listed[index] else f"belongs to block {slots[index].block}"
                raise _Bad(f"slot {index} {why}", "blocks", b, j)
            listed[index] = True
    if not all(listed):
        missing = slots[listed.index(False)]
        raise _Bad(f"slot {missing.index} of block {missing.block} is not listed", "blocks", missing.block)
    return Partition(g, tuple(slots), tuple(tuple(b) for b in blocks))


def _slots_known(values: list[int], count: int, *path: str | int) -> None:
    if values and max(values) >= count:
        i = next(i for i, index in enumerate(values) if index >= count)
        raise _Bad(f"slot {values[i]} is not one of the header's {count} slots", *path, i)


class _Sequence:
    """One sequence as its records arrive: the header's partition, the steps so far, the running totals."""

    def __init__(self, header: dict):
        self.header: dict[str, Any] = header
        self.end: dict[str, Any] | None = None
        self.partition = _partition(header)
        g = self.partition.gen_length
        self.tokens, self.commit = [-1] * g, [-1] * g
        self.pieces: dict[int, str] = {}
        self.steps: list[IterationRecord] = []
        self.totals = [0, 0, 0, 0]  # forwards, query tokens, key/value bytes copied, written

    def step(self, r: dict) -> None:
        n, slots, blocks = len(self.steps), self.partition.slots, self.partition.blocks
        if r["iteration"] != n:
            raise _Bad(
                f"is {r['iteration']}; expected {n} (iterations count from 0, one record each, in order)", "iteration"
            )
        if r["block"] >= len(blocks):
            raise _Bad(f"is {r['block']}; the header has {len(blocks)} blocks", "block")
        for field in ("planned", "drafted", "selected"):
            _slots_known(r[field], len(slots), field)
        _slots_known(r.get("revised", []), len(slots), "revised")
        if len(r["confidence"]) not in (0, len(r["drafted"])):
            raise _Bad(
                f"holds {len(r['confidence'])} values; expected one per drafted slot ({len(r['drafted'])}) or none",
                "confidence",
            )
        if len(r["fed_tokens"]) != r["forwards"]:
            raise _Bad(f"holds {len(r['fed_tokens'])} values; expected one per forward ({r['forwards']})", "fed_tokens")
        committed = []
        prompt = self.header["prompt_length"]
        for i, entry in enumerate(r["committed"]):
            index, tokens, pieces = entry["slot"], entry["tokens"], entry.get("pieces")
            if index >= len(slots):
                raise _Bad(f"is {index}; the header has {len(slots)} slots", "committed", i, "slot")
            slot = slots[index]
            if entry["start"] != prompt + slot.offset:
                raise _Bad(
                    f"is {entry['start']}; slot {index} starts at position {prompt + slot.offset}",
                    "committed",
                    i,
                    "start",
                )
            if len(tokens) > slot.length:
                raise _Bad(
                    f"holds {len(tokens)} tokens; slot {index} has {slot.length} positions", "committed", i, "tokens"
                )
            if pieces is not None and len(pieces) != len(tokens):
                raise _Bad(f"holds {len(pieces)} pieces for {len(tokens)} tokens", "committed", i, "pieces")
            stop = slot.offset + len(tokens)
            self.tokens[slot.offset : stop] = tokens
            self.commit[slot.offset : stop] = [n] * len(tokens)
            if pieces:
                self.pieces.update(zip(range(slot.offset, stop), pieces))
            committed.append((index, len(tokens)))
        cache, totals = r["cache"], self.totals
        totals[0] += r["forwards"]
        totals[1] += sum(r["fed_tokens"])
        totals[2] += cache["copied_bytes"]
        totals[3] += cache["written_bytes"]
        self.steps.append(
            IterationRecord(
                iteration=n,
                block=r["block"],
                planned=tuple(r["planned"]),
                selected=tuple(r["selected"]),
                committed=tuple(committed),
                forwards=r["forwards"],
                drafted=tuple(r["drafted"]),
                revised=tuple(r.get("revised", ())),
                confidence=tuple(r["confidence"]),
                fed_tokens=tuple(r["fed_tokens"]),
                kv_appended=cache["appended"],
                kv_pending=cache["pending"],
                kv_encoded=cache["encoded"],
                kv_invalidated=cache["invalidated"],
                kv_copied_bytes=cache["copied_bytes"],
                kv_written_bytes=cache["written_bytes"],
                seconds=r["seconds"],
            )
        )

    def finish(self, r: dict) -> None:
        if r["iterations"] != len(self.steps):
            raise _Bad(
                f"is {r['iterations']}; the trace holds {len(self.steps)} step records for the sequence", "iterations"
            )
        forwards, fed, copied, written = self.totals
        for value, total, path in (
            (r["forwards"], forwards, ("forwards",)),
            (r["fed_tokens"], fed, ("fed_tokens",)),
            (r["kv_bytes"]["context"], copied, ("kv_bytes", "context")),
            (r["kv_bytes"]["new"], written, ("kv_bytes", "new")),
        ):
            if value != total:
                raise _Bad(f"is {value}; the step records add up to {total}", *path)
        answer, g = r["tokens"], self.partition.gen_length
        if len(answer) > g:
            raise _Bad(f"holds {len(answer)} tokens; the generation region has {g} positions", "tokens")
        if answer != self.tokens[: len(answer)]:
            i = next(i for i, (a, b) in enumerate(zip(answer, self.tokens)) if a != b)
            found = f"token {self.tokens[i]}" if self.commit[i] >= 0 else "nothing"
            raise _Bad(f"is {answer[i]}; the steps committed {found} at that position", "tokens", i)
        self.end = r

    def result(self) -> DecodeResult:
        header, end = self.header, self.end
        if end is None:
            raise _Bad("is missing: the trace has no end record for this sequence", "end")
        return DecodeResult(
            tokens=torch.tensor(end["tokens"], dtype=torch.long),
            prompt_length=header["prompt_length"],
            partition=self.partition,
            commit_step=torch.tensor(self.commit, dtype=torch.long),
            forwards=end["forwards"],
            stopped_at_eos=end["stopped_at_eos"],
            num_iterations=len(self.steps),
            iterations=tuple(self.steps),
            region_tokens=list(self.tokens),
            engine=header.get("engine"),
            fed_tokens=end["fed_tokens"],
            kv_bytes=KVBytes(end["kv_bytes"]["context"], end["kv_bytes"]["new"]),
            engine_totals=end.get("engine_counters"),
            decoder=header.get("decoder"),
            pieces=self.pieces or None,
            text=end.get("text"),
        )


def read_trace(path: str | Path) -> list[DecodeResult]:
    """The results a trace file describes, in sequence order, ``steps`` rebuilt (measurements included).

    One pass, linear in the file's size. Each line must be UTF-8 JSON that fits
    the schema (integers of 64 bits, finite numbers) and agree with the lines
    before it: slots end to end over ``gen_length`` (all sequences together at
    most :data:`MAX_POSITIONS` positions), steps numbered from 0 and naming
    the header's slots and blocks, committed tokens within their slot, the end
    record's answer and totals equal to what the steps committed and add up
    to. Anything else is a :class:`~refusion.errors.ConfigError` naming the
    file, the line and the field (``param``). The results carry ``engine``,
    ``fed_tokens``, ``kv_bytes``, ``engine_totals``, ``region_tokens``, the
    header's ``decoder`` spec and, when the trace has them, ``pieces``
    (position -> token text).
    """
    source = Path(path)
    sequences: dict[int, _Sequence] = {}
    number = positions = 0
    for number, kind, record in _records(source):
        try:
            seq = record["sequence"]
            current = sequences.get(seq)
            if kind == "header":
                if current is not None:
                    raise _Bad(f"a second header for sequence {seq}", "sequence")
                g = record["gen_length"]
                if g > MAX_POSITIONS - positions:
                    raise _Bad(
                        f"is {g}; a trace describes at most {MAX_POSITIONS:,} positions, all sequences "
                        f"together ({positions:,} before this header)",
                        "gen_length",
                    )
                positions += g
                sequences[seq] = _Sequence(record)
            elif current is None or current.end is not None:
                raise _Bad(
                    f"a {kind} record for sequence {seq} {'after its end record' if current else 'before its header'}",
                    "sequence",
                )
            elif kind == "step":
                current.step(record)
            else:
                current.finish(record)
        except _Bad as bad:
            raise _refusal(source, number, kind, bad) from None
    if not sequences:
        raise ConfigError(
            f"{source}: the trace is empty; expected a header, step records and an end record.", param="trace"
        )
    for seq, parts in sequences.items():
        if parts.end is None:
            raise ConfigError(
                f"{source}:{number}: field `record`: sequence {seq} has no end record (the trace was cut short).",
                param="record",
            )
    return [sequences[seq].result() for seq in sorted(sequences)]
