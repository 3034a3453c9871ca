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
file against the schema and rebuilds the :class:`~refusion.decoding.types.DecodeResult` s,
``steps`` included. This module knows nothing about engines or strategies.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import torch

from refusion.errors import ConfigError
from refusion.decoding.types import DecodeResult, Partition, Slot, StepRecord

SCHEMA_NAME = "refusion-trace"
SCHEMA_VERSION = 1


def schema() -> dict:
    """The trace's JSON schema (draft 2020-12), as shipped in the package (a fresh copy each call)."""
    text = resources.files("refusion").joinpath("schemas/trace.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


@functools.lru_cache(maxsize=None)
def _validators() -> dict[str, Any]:
    """One validator per record kind, built once."""
    import jsonschema

    defs = schema()["$defs"]
    return {kind: jsonschema.Draft202012Validator({"$ref": f"#/$defs/{kind}", "$defs": defs})
            for kind in ("header", "step", "end")}


def _all_tokens(result: DecodeResult) -> list[int]:
    known = result.extra.get("all_tokens")
    if known is not None:
        return list(known)
    tokens = result.tokens.tolist()
    return tokens + [-1] * (result.partition.gen_length - len(tokens))


def records(result: DecodeResult, *, sequence: int = 0, tokenizer: Any = None, decoder: Any = None) -> list[dict]:
    """The trace records of one result: header, one step per iteration, end.

    ``tokenizer`` (optional) adds each committed token's text (``pieces``);
    ``decoder`` (optional) adds its :class:`~refusion.config.spec.DecoderSpec` (``to_dict()``).
    Reads ``result``; changes nothing.
    """
    from refusion.version import __version__

    start = result.prompt_length
    spec = None if decoder is None else decoder.spec.to_dict()
    out: list[dict] = [{
        "record": "header", "schema": SCHEMA_NAME, "version": SCHEMA_VERSION, "sequence": sequence,
        "refusion": __version__, "prompt_length": start, "gen_length": result.partition.gen_length,
        "slots": [{"offset": s.offset, "length": s.length, "block": s.block, "start": start + s.offset}
                  for s in result.partition.slots],
        "blocks": [list(b) for b in result.partition.blocks],
        "engine": result.extra.get("engine"), "decoder": spec,
    }]
    every = _all_tokens(result)
    slots = result.partition.slots
    for step in result.steps:
        committed = []
        for index, kept in step.committed:
            slot = slots[index]
            tokens = [int(t) for t in every[slot.offset : slot.offset + kept]]
            entry: dict[str, Any] = {"slot": index, "start": start + slot.offset, "tokens": tokens}
            if tokenizer is not None:
                entry["pieces"] = [tokenizer.decode([t]) for t in tokens]
            committed.append(entry)
        out.append({
            "record": "step", "sequence": sequence, "iteration": step.iteration, "block": step.block,
            "planned": list(step.planned), "drafted": list(step.drafted),
            "confidence": [min(max(float(c), 0.0), 1.0) for c in step.confidence],
            "selected": list(step.selected), "committed": committed, "forwards": step.forwards,
            "fed_tokens": list(step.fed_tokens),
            "cache": {"appended": step.kv_appended, "pending": step.kv_pending, "encoded": step.kv_encoded,
                      "invalidated": step.kv_invalidated, "copied_bytes": step.kv_copied_bytes,
                      "written_bytes": step.kv_written_bytes},
            "seconds": step.seconds,
        })
    kv = result.extra.get("kv_bytes") or {"context": sum(s.kv_copied_bytes for s in result.steps),
                                          "new": sum(s.kv_written_bytes for s in result.steps)}
    out.append({
        "record": "end", "sequence": sequence, "tokens": result.tokens.tolist(), "text": result.text,
        "forwards": result.forwards,
        "fed_tokens": result.extra.get("fed_tokens", sum(sum(s.fed_tokens) for s in result.steps)),
        "kv_bytes": {"context": kv["context"], "new": kv["new"]}, "stopped_at_eos": result.stopped_at_eos,
        "iterations": len(result.steps), "engine_counters": result.extra.get("engine_counters"),
    })
    return out


def write_trace(results: DecodeResult | Sequence[DecodeResult], path: str | Path, *, tokenizer: Any = None,
                decoder: Any = None) -> Path:
    """Write the trace of one result or a batch of results (``sequence`` = index) to ``path``; return the path."""
    batch = [results] if isinstance(results, DecodeResult) else list(results)
    if not batch or not all(isinstance(r, DecodeResult) for r in batch):
        raise ConfigError(f"`results` must be a DecodeResult or a non-empty list of them; got {results!r:.80}.", param='results')
    out = Path(path)
    try:
        with out.open("w", encoding="utf-8") as f:
            for i, result in enumerate(batch):
                for record in records(result, sequence=i, tokenizer=tokenizer, decoder=decoder):
                    f.write(json.dumps(record) + "\n")
    except OSError as exc:
        raise ConfigError(f"`trace` file {str(out)!r} could not be written: {exc}", param='trace') from exc
    return out


def load_records(path: str | Path) -> list[dict]:
    """Every record of a trace file, each checked against the schema (errors name the line and the field)."""
    source = Path(path)
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"`trace` file {str(source)!r} could not be read: {exc}", param='trace') from exc
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}:{number}: not a JSON object ({exc.msg} at column {exc.colno}).") from None
        _check_record(record, source, number)
        out.append(record)
    if not out:
        raise ConfigError(f"{source}: the trace is empty; expected a header, step records and an end record.")
    return out


def _check_record(record: Any, source: Path, number: int) -> None:
    kind = record.get("record") if isinstance(record, dict) else None
    if kind not in ("header", "step", "end"):
        raise ConfigError(f"{source}:{number}: field `record` must be 'header', 'step' or 'end'; got {kind!r}.")
    errors = list(_validators()[kind].iter_errors(record))
    error = min(errors, key=lambda e: [str(p) for p in e.absolute_path]) if errors else None
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(record)"
        raise ConfigError(f"{source}:{number}: {kind} record, field `{where}`: {error.message}.")


def read_trace(path: str | Path) -> list[DecodeResult]:
    """The results a trace file describes, in sequence order, ``steps`` rebuilt (measurements included).

    ``extra`` holds ``engine``, ``fed_tokens``, ``kv_bytes``, ``engine_counters``,
    ``all_tokens`` and the header's ``decoder`` spec. Raises
    :class:`~refusion.errors.ConfigError` naming the line and field of a bad record.
    """
    source = Path(path)
    sequences: dict[int, dict[str, Any]] = {}
    for number, record in enumerate(load_records(source), 1):
        seq = record["sequence"]
        if record["record"] == "header":
            if seq in sequences:
                raise ConfigError(f"{source}: record {number}: a second header for sequence {seq}.")
            sequences[seq] = {"header": record, "steps": [], "end": None}
            continue
        if seq not in sequences or sequences[seq]["end"] is not None:
            raise ConfigError(f"{source}: record {number}: a {record['record']} record for sequence {seq} "
                              f"{'after its end record' if seq in sequences else 'before its header'}.")
        if record["record"] == "step":
            sequences[seq]["steps"].append(record)
        else:
            sequences[seq]["end"] = record
    missing = [seq for seq, parts in sequences.items() if parts["end"] is None]
    if missing:
        raise ConfigError(f"{source}: sequence {missing[0]} has no end record (the trace was cut short).")
    return [_result(source, sequences[seq]) for seq in sorted(sequences)]


def _result(source: Path, parts: dict[str, Any]) -> DecodeResult:
    header, end = parts["header"], parts["end"]
    slots = tuple(Slot(i, s["offset"], s["length"], s["block"]) for i, s in enumerate(header["slots"]))
    partition = Partition(header["gen_length"], slots, tuple(tuple(b) for b in header["blocks"]))
    every = [-1] * partition.gen_length
    commit_step = torch.full((partition.gen_length,), -1, dtype=torch.long)
    steps = []
    for step in parts["steps"]:
        for entry in step["committed"]:
            if entry["slot"] >= len(slots):
                raise ConfigError(f"{source}: step {step['iteration']}: field `committed.slot` {entry['slot']} is "
                                  f"not one of the header's {len(slots)} slots.")
            offset = slots[entry["slot"]].offset
            every[offset : offset + len(entry["tokens"])] = entry["tokens"]
            commit_step[offset : offset + len(entry["tokens"])] = step["iteration"]
        cache = step["cache"]
        steps.append(StepRecord(
            iteration=step["iteration"], block=step["block"], planned=tuple(step["planned"]),
            selected=tuple(step["selected"]),
            committed=tuple((e["slot"], len(e["tokens"])) for e in step["committed"]), forwards=step["forwards"],
            drafted=tuple(step["drafted"]), confidence=tuple(step["confidence"]), fed_tokens=tuple(step["fed_tokens"]),
            kv_appended=cache["appended"], kv_pending=cache["pending"], kv_encoded=cache["encoded"],
            kv_invalidated=cache["invalidated"], kv_copied_bytes=cache["copied_bytes"],
            kv_written_bytes=cache["written_bytes"], seconds=step["seconds"],
        ))
    pieces = {e["start"] - header["prompt_length"] + j: p for s in parts["steps"] for e in s["committed"]
              for j, p in enumerate(e.get("pieces", []))}
    extra = {"all_tokens": every, "engine": header.get("engine"), "fed_tokens": end["fed_tokens"],
             "kv_bytes": dict(end["kv_bytes"]), "engine_counters": end.get("engine_counters"),
             "decoder": header.get("decoder")}
    if pieces:
        extra["pieces"] = pieces
    return DecodeResult(
        tokens=torch.tensor(end["tokens"], dtype=torch.long), prompt_length=header["prompt_length"],
        partition=partition, commit_step=commit_step, forwards=end["forwards"], steps=tuple(steps),
        stopped_at_eos=end["stopped_at_eos"], text=end.get("text"), extra=extra,
    )

