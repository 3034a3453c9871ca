"""Reproducible records: the environment a result ran in and the decoder spec that re-creates it.

:func:`environment` says where a run happened (refusion, torch, transformers
and Python versions, platform, device, dtype, torch threads, engine, seeds,
the model's path, git revision and content hash); a decoder is recorded as
its :class:`~refusion.config.spec.DecoderSpec` (``decoder.spec.to_dict()``),
which builds the same decoder back. :func:`bench_record`
wraps ``refusion bench`` rows into a record that ``refusion reproduce``
(:mod:`refusion.measure.reproduce`) can re-run; :func:`load_record` reads one back,
naming the field that is wrong. Nothing here runs a model.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from refusion.config.build import class_path
from refusion.errors import ConfigError

RECORD_SCHEMA = "refusion-record"
RECORD_VERSION = 1
#: model directories up to this size get a sha256 of their files in the record
HASH_LIMIT_BYTES = 256 * 2**20


def _field(spec: Mapping[str, Any], key: str, kind: type | tuple, where: str = "") -> Any:
    """``spec[key]`` if present and of ``kind``; else a ConfigError naming the field ``where.key``."""
    name = f"{where}.{key}" if where else key
    if not isinstance(spec, Mapping) or key not in spec:
        raise ConfigError(f"field `{name}` is missing from the record.")
    value = spec[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join({dict: "an object", Mapping: "an object", list: "a list", str: "a string", int: "an integer",
                             float: "a number", bool: "true or false"}.get(k, k.__name__) for k in kinds)
        raise ConfigError(f"field `{name}` must be {names}; got {value!r:.80}.")
    return value


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def model_source(path: str | Path | None) -> dict[str, Any]:
    """Where a checkpoint came from: ``path``, whether it is the shipped model, its git revision and content hash.

    ``git_revision`` / ``git_dirty`` are None outside a git work tree;
    ``sha256`` (over the directory's files, by name) is None for directories
    over :data:`HASH_LIMIT_BYTES` or paths that are not local directories.
    """
    from refusion.models.default import default_model_path

    out: dict[str, Any] = {"path": None if path is None else str(path), "shipped": False, "git_revision": None,
                           "git_dirty": None, "sha256": None}
    if path is None:
        return out
    directory = Path(path)
    out["shipped"] = directory.resolve() == Path(default_model_path()).resolve()
    if not directory.is_dir():
        return out
    try:
        rev = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            out["git_revision"] = rev.stdout.strip()
            status = subprocess.run(["git", "-C", str(directory), "status", "--porcelain", "--", "."],
                                    capture_output=True, text=True, timeout=10)
            out["git_dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    files = sorted(p for p in directory.rglob("*") if p.is_file() and ".git" not in p.parts)
    if sum(p.stat().st_size for p in files) <= HASH_LIMIT_BYTES:
        digest = hashlib.sha256()
        for p in files:
            digest.update(str(p.relative_to(directory)).encode() + b"\0")
            digest.update(hashlib.sha256(p.read_bytes()).digest())
        out["sha256"] = digest.hexdigest()
    return out


def environment(model: Any = None, *, engine: Any = None, seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """The environment of a run: versions, platform, device, dtype, threads, engine, seeds and the model's source.

    ``model`` is a :class:`~refusion.models.base.ModelAdapter` (or None);
    ``engine`` the engine name (or class/instance) that ran the decodes;
    ``seeds`` the sampling seeds. Reads; changes nothing.
    """
    import torch

    from refusion.version import __version__

    net = getattr(model, "model", None)
    param = next(net.parameters(), None) if net is not None and hasattr(net, "parameters") else None
    path = getattr(getattr(net, "config", None), "_name_or_path", None) or None
    if engine is not None and not isinstance(engine, str):
        engine = getattr(engine, "name", None) or class_path(engine)
    return {
        "refusion": __version__, "torch": torch.__version__, "transformers": _version("transformers"),
        "python": platform.python_version(), "platform": platform.platform(),
        "device": None if param is None else str(param.device), "dtype": None if param is None else str(param.dtype),
        "torch_threads": torch.get_num_threads(), "engine": engine,
        "seeds": None if seeds is None else [int(s) for s in seeds],
        "model": model_source(path), "argv": list(sys.argv),
    }


# -- records -------------------------------------------------------------------------------------
def bench_record(rows: Sequence[Any], decoders: Sequence[Any], settings: Mapping[str, Any], env: Mapping[str, Any],
                 engines: Sequence[str | None] = ()) -> dict:
    """The JSON record of a ``refusion bench`` run.

    ``rows`` are :class:`~refusion.measure.results.Result` s, ``decoders[i]`` the decoder
    of ``rows[i]`` (None for the AR baseline), ``settings`` the bench's
    options (``per_task``, ``gen_length``, ``methods``, ``cost_model``,
    ``model``: the model options), ``env`` an :func:`environment`,
    ``engines[i]`` the name of the engine that ran ``rows[i]``.
    """
    out_rows = []
    engines = list(engines) + [None] * (len(rows) - len(engines))
    for row, decoder, engine in zip(rows, decoders, engines):
        entry = attrs.asdict(row)
        entry["outputs"] = [list(o) for o in row.outputs]
        entry.update(accuracy=row.accuracy, tokens_per_forward=row.tokens_per_forward,
                     decoder=None if decoder is None else decoder.spec.to_dict(), engine=engine)
        out_rows.append(entry)
    return {"schema": RECORD_SCHEMA, "version": RECORD_VERSION, "kind": "bench", "environment": dict(env),
            "settings": dict(settings), "rows": out_rows}


def eval_record(results: Mapping[str, Any], decoder: Any, settings: Mapping[str, Any], env: Mapping[str, Any],
                outputs: Sequence[str] = ()) -> dict:
    """The JSON record of a ``refusion eval`` run: lm-eval's ``results`` per task, the decoder, the settings
    (``tasks``, ``model_args``, ``include_path``, ``limit``), the environment and a sha256 of the generated texts."""
    digest = hashlib.sha256("\0".join(outputs).encode()).hexdigest()
    return {"schema": RECORD_SCHEMA, "version": RECORD_VERSION, "kind": "eval", "environment": dict(env),
            "settings": dict(settings), "decoder": None if decoder is None else decoder.spec.to_dict(),
            "results": json.loads(json.dumps(results, default=str)), "outputs_sha256": digest,
            "generations": len(outputs)}


_REQUIRED = {
    "bench": {"settings": dict, "rows": list},
    "eval": {"settings": dict, "results": dict},
}
_SETTINGS = {"bench": ("per_task", "gen_length", "methods"), "eval": ("tasks", "model_args")}
_ROW = {"method": str, "examples": int, "correct": int, "forwards": int, "tokens": int, "seconds": (int, float),
        "outputs": list}


def check_record(record: Any, source: str = "record") -> dict:
    """``record`` if it is a well-formed bench or eval record; else a :class:`ConfigError` naming the field."""
    try:
        return _check_record(record)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _check_record(record: Any) -> dict:
    if not isinstance(record, dict):
        raise ConfigError(f"a record must be a JSON object; got {type(record).__name__}.")
    if record.get("schema") != RECORD_SCHEMA:
        raise ConfigError(f"field `schema` must be {RECORD_SCHEMA!r}; got {record.get('schema')!r} "
                          "(write records with `refusion bench --json` or `refusion eval --record FILE`).")
    if record.get("version") != RECORD_VERSION:
        raise ConfigError(f"field `version` must be {RECORD_VERSION}; got {record.get('version')!r}.")
    kind = record.get("kind")
    if kind not in _REQUIRED:
        raise ConfigError(f"field `kind` must be one of {', '.join(map(repr, _REQUIRED))}; got {kind!r}.")
    _field(record, "environment", dict)
    for key, kind_type in _REQUIRED[kind].items():
        _field(record, key, kind_type)
    for key in _SETTINGS[kind]:
        if key not in record["settings"]:
            raise ConfigError(f"field `settings.{key}` is missing from the record.")
    if kind == "bench":
        if not record["rows"]:
            raise ConfigError("field `rows` is empty; a bench record has at least one row.")
        for i, row in enumerate(record["rows"]):
            for key, kind_type in _ROW.items():
                _field(row, key, kind_type, f"rows[{i}]")
            if "decoder" not in row:
                raise ConfigError(f"field `rows[{i}].decoder` is missing (null for the AR baseline).")
    return record


def load_record(path: str | Path) -> dict:
    """Read and check a record file (JSON); errors name the file and the field."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"`RECORD` file {str(source)!r} could not be read: {exc}", param='RECORD') from exc
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}).") from None
    return check_record(record, str(source))
