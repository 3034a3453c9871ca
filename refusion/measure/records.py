"""Reproducible records: the environment a result ran in and the decoder spec that re-creates it.

:func:`environment` says where a run happened (refusion, torch, transformers
and Python versions, platform, device, dtype, torch threads, engine, seeds,
the model's path, git revision and content hash); :func:`decoder_spec` turns a
:class:`~refusion.decoding.decoder.Decoder` into plain JSON and
:func:`decoder_from_spec` builds the same decoder back. :func:`bench_record`
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

from refusion.config import PART_KINDS
from refusion.errors import ConfigError

RECORD_SCHEMA = "refusion-record"
RECORD_VERSION = 1
#: model directories up to this size get a sha256 of their files in the record
HASH_LIMIT_BYTES = 256 * 2**20


# -- decoder specs -------------------------------------------------------------------------------
def _class_path(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _jsonable(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, where) for v in value]
    raise ConfigError(f"`{where}` = {value!r} cannot be recorded: a decoder spec holds only JSON values "
                      "(numbers, strings, booleans, None, lists).")


def part_spec(part: Any) -> dict[str, Any]:
    """``{"name", "class", "params"}`` of a part instance (its attrs init fields and their values)."""
    params = {}
    if attrs.has(type(part)):
        for field in attrs.fields(type(part)):
            if field.init:
                key = field.alias or field.name
                params[key] = _jsonable(getattr(part, field.name), f"{part.kind}.{key}")
    return {"name": getattr(part, "name", type(part).__name__), "class": _class_path(part), "params": params}


def decoder_spec(decoder: Any) -> dict[str, Any]:
    """Plain JSON that :func:`decoder_from_spec` turns back into an equal decoder.

    Holds each part's registry name, class and parameters, the sampler
    (``"greedy"`` or ``{"sampler": name, ...its fields}``, a name of
    :data:`refusion.decoding.sampling.SAMPLERS`; without ``sampler`` it is
    ``"categorical"``), ``engine`` (its
    name, or None for the automatic choice), ``seed``, ``stop_at_eos`` and
    ``calls_per_token``. A custom sampler or a part parameter that is not a
    JSON value cannot be recorded and raises :class:`ConfigError` naming it.
    """
    from refusion.decoding.sampling import SAMPLERS, greedy

    names = {cls: name for name, cls in SAMPLERS.items()}
    if decoder.sample is greedy:
        sample: Any = "greedy"
    elif type(decoder.sample) in names:
        sample = {"sampler": names[type(decoder.sample)], **attrs.asdict(decoder.sample)}
    else:
        raise ConfigError(f"`sample` {decoder.sample!r} cannot be recorded: only greedy and the samplers "
                          f"{', '.join(SAMPLERS)} can.")
    engine = decoder.engine
    if engine is not None and not isinstance(engine, str):
        engine = getattr(engine, "name", None) or _class_path(engine)
    spec = {kind: part_spec(getattr(decoder, kind)) for kind in PART_KINDS}
    spec.update(sample=sample, engine=engine, seed=decoder.seed, stop_at_eos=decoder.stop_at_eos,
                calls_per_token=decoder.calls_per_token)
    return spec


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


def decoder_from_spec(spec: Mapping[str, Any], *, where: str = "decoder") -> Any:
    """The :class:`~refusion.decoding.decoder.Decoder` a :func:`decoder_spec` describes (errors name the field under ``where``).

    A part is found by its registry name when that name is registered for the
    recorded class, else by its ``"module:Class"`` path.
    """
    from refusion.decoding.decoder import Decoder
    from refusion.plugins.registry import registry
    from refusion.decoding.sampling import SAMPLERS, greedy

    if not isinstance(spec, Mapping):
        raise ConfigError(f"field `{where}` must be an object (a decoder spec); got {spec!r:.80}.")
    parts, params = {}, {}
    for kind in PART_KINDS:
        part = _field(spec, kind, Mapping, where)
        name = _field(part, "name", str, f"{where}.{kind}")
        path = _field(part, "class", str, f"{where}.{kind}")
        for key, value in _field(part, "params", Mapping, f"{where}.{kind}").items():
            params[f"{kind}.{key}"] = tuple(value) if isinstance(value, list) else value
        parts[kind] = name if _registered(kind, name) and _class_path(registry().get(kind, name)) == path else path
    sample = _field(spec, "sample", (str, Mapping), where)
    fields = dict(sample) if isinstance(sample, Mapping) else {}
    kind = SAMPLERS.get(fields.pop("sampler", "categorical"))
    if sample == "greedy":
        sampler: Any = greedy
    elif kind is not None and set(fields) <= set(attrs.fields_dict(kind)):
        sampler = kind(**fields)
    else:
        raise ConfigError(f"field `{where}.sample` must be 'greedy' or an object of `sampler` (one of "
                          f"{', '.join(SAMPLERS)}) and its fields; got {sample!r}.")
    engine = spec.get("engine")
    if engine is not None and not isinstance(engine, str):
        raise ConfigError(f"field `{where}.engine` must be an engine name or null; got {engine!r}.")
    try:
        return Decoder.from_names(**parts, **params, sample=sampler, engine=engine,
                                  seed=_field(spec, "seed", int, where),
                                  stop_at_eos=_field(spec, "stop_at_eos", (bool, str), where),
                                  calls_per_token=_field(spec, "calls_per_token", int, where))
    except ConfigError as exc:
        raise ConfigError(f"field `{where}` does not build a decoder: {exc}") from exc


def _registered(kind: str, name: str) -> bool:
    from refusion.errors import UnknownNameError
    from refusion.plugins.registry import registry

    try:
        registry().entry(kind, name)
    except UnknownNameError:
        return False
    return True


# -- environment ---------------------------------------------------------------------------------
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

    from refusion import __version__

    net = getattr(model, "model", None)
    param = next(net.parameters(), None) if net is not None and hasattr(net, "parameters") else None
    path = getattr(getattr(net, "config", None), "_name_or_path", None) or None
    if engine is not None and not isinstance(engine, str):
        engine = getattr(engine, "name", None) or _class_path(engine)
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

    ``rows`` are :class:`~refusion.measure.bench.Row` s, ``decoders[i]`` the decoder
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
                     decoder=None if decoder is None else decoder_spec(decoder), engine=engine)
        out_rows.append(entry)
    return {"schema": RECORD_SCHEMA, "version": RECORD_VERSION, "kind": "bench", "environment": dict(env),
            "settings": dict(settings), "rows": out_rows}


def eval_record(results: Mapping[str, Any], decoder: Any, settings: Mapping[str, Any], env: Mapping[str, Any],
                outputs: Sequence[str] = ()) -> dict:
    """The JSON record of a ``refusion eval`` run: lm-eval's ``results`` per task, the decoder, the settings
    (``tasks``, ``model_args``, ``include_path``, ``limit``), the environment and a sha256 of the generated texts."""
    digest = hashlib.sha256("\0".join(outputs).encode()).hexdigest()
    return {"schema": RECORD_SCHEMA, "version": RECORD_VERSION, "kind": "eval", "environment": dict(env),
            "settings": dict(settings), "decoder": None if decoder is None else decoder_spec(decoder),
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
        raise ConfigError(f"`RECORD` file {str(source)!r} could not be read: {exc}") from exc
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}).") from None
    return check_record(record, str(source))
