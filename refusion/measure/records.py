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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from refusion.config.build import class_path
from refusion.errors import ConfigError, ImportRefused
from refusion.files import read_json, where
from refusion.limits import MAX_EXAMPLES, MAX_GEN_LENGTH, MAX_THREADS, SEED_LIMIT
from refusion.validators import is_integer, is_number, shown

RECORD_SCHEMA = "refusion-record"
RECORD_VERSION = 1
#: methods (rows) of a bench record
MAX_METHODS = 1000
#: model directories up to this size get a sha256 of their files in the record
HASH_LIMIT_BYTES = 256 * 2**20


def _field(spec: Mapping[str, Any], key: str, kind: type | tuple, where: str = "") -> Any:
    """``spec[key]`` if present and of ``kind``; else a ConfigError naming the field ``where.key`` (its ``param``)."""
    name = f"{where}.{key}" if where else key
    if not isinstance(spec, Mapping):
        raise ConfigError(f"field `{where}` must be an object; got {shown(spec)}.", param=where)
    if key not in spec:
        raise ConfigError(f"field `{name}` is missing from the record.", param=name)
    value = spec[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(
            {
                dict: "an object",
                Mapping: "an object",
                list: "a list",
                str: "a string",
                int: "an integer",
                float: "a number",
                bool: "true or false",
            }.get(k, k.__name__)
            for k in kinds
        )
        raise ConfigError(f"field `{name}` must be {names}; got {shown(value)}.", param=name)
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

    out: dict[str, Any] = {
        "path": None if path is None else str(path),
        "shipped": False,
        "git_revision": None,
        "git_dirty": None,
        "sha256": None,
    }
    if path is None:
        return out
    directory = Path(path)
    out["shipped"] = directory.resolve() == Path(default_model_path()).resolve()
    if not directory.is_dir():
        return out
    try:
        rev = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if rev.returncode == 0:
            out["git_revision"] = rev.stdout.strip()
            status = subprocess.run(
                ["git", "-C", str(directory), "status", "--porcelain", "--", "."],
                capture_output=True,
                text=True,
                timeout=10,
            )
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
        "refusion": __version__,
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": None if param is None else str(param.device),
        "dtype": None if param is None else str(param.dtype),
        "torch_threads": torch.get_num_threads(),
        "engine": engine,
        "seeds": None if seeds is None else [int(s) for s in seeds],
        "model": model_source(path),
        "argv": list(sys.argv),
    }


# -- records -------------------------------------------------------------------------------------
def bench_record(
    rows: Sequence[Any],
    decoders: Sequence[Any],
    settings: Mapping[str, Any],
    env: Mapping[str, Any],
    engines: Sequence[str | None] = (),
) -> dict:
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
        entry.update(
            accuracy=row.accuracy,
            tokens_per_forward=row.tokens_per_forward,
            decoder=None if decoder is None else decoder.spec.to_dict(),
            engine=engine,
        )
        out_rows.append(entry)
    return {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "kind": "bench",
        "environment": dict(env),
        "settings": dict(settings),
        "rows": out_rows,
    }


def eval_record(
    results: Mapping[str, Any],
    decoder: Any,
    settings: Mapping[str, Any],
    env: Mapping[str, Any],
    outputs: Sequence[str] = (),
) -> dict:
    """The JSON record of a ``refusion eval`` run: lm-eval's ``results`` per task, the decoder, the settings
    (``tasks``, ``model_args``, ``include_path``, ``limit``), the environment and a sha256 of the generated texts."""
    digest = hashlib.sha256("\0".join(outputs).encode()).hexdigest()
    return {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "kind": "eval",
        "environment": dict(env),
        "settings": dict(settings),
        "decoder": None if decoder is None else decoder.spec.to_dict(),
        "results": json.loads(json.dumps(results, default=str)),
        "outputs_sha256": digest,
        "generations": len(outputs),
    }


#: the fields of a record, by kind (records are versioned: a field not listed here is refused)
FIELDS = {
    "bench": ("schema", "version", "kind", "environment", "settings", "rows"),
    "eval": (
        "schema",
        "version",
        "kind",
        "environment",
        "settings",
        "decoder",
        "results",
        "outputs_sha256",
        "generations",
    ),
}
_REQUIRED: dict[str, dict[str, type]] = {
    "bench": {"settings": dict, "rows": list},
    "eval": {"settings": dict, "results": dict},
}
#: what :func:`environment` writes
ENVIRONMENT_FIELDS = (
    "refusion",
    "torch",
    "transformers",
    "python",
    "platform",
    "device",
    "dtype",
    "torch_threads",
    "engine",
    "seeds",
    "model",
    "argv",
)
#: the seeds of an eval record's settings (those :mod:`refusion.measure.lmeval` passes to lm-evaluation-harness)
EVAL_SEED_FIELDS = ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")
SETTINGS_FIELDS = {
    "bench": ("per_task", "gen_length", "methods", "preset_files", "cost_model", "model"),
    "eval": ("tasks", "model_args", "include_path", "limit", "num_fewshot", "apply_chat_template", *EVAL_SEED_FIELDS),
}
_SETTINGS = {"bench": ("per_task", "gen_length", "methods"), "eval": ("tasks", "model_args")}
_ROW: dict[str, type | tuple[type, ...]] = {
    "method": str,
    "examples": int,
    "correct": int,
    "forwards": int,
    "tokens": int,
    "seconds": (int, float),
    "outputs": list,
}
#: the fields of a bench row: a :class:`~refusion.measure.results.Result` and what the record adds
ROW_FIELDS = (
    "method",
    "examples",
    "correct",
    "forwards",
    "tokens",
    "seconds",
    "score",
    "per_task",
    "gpu_seconds",
    "outputs",
    "accuracy",
    "tokens_per_forward",
    "decoder",
    "engine",
)
#: token ids and counts in a record lie below this
MAX_ID = 2**31
MAX_COUNT = 2**63


def check_record(record: Any, source: str = "record") -> dict:
    """``record`` if it is a well-formed bench or eval record; else a :class:`ConfigError` starting with
    ``source`` and naming the field (also as its ``param``: ``settings.gen_length``, ``rows[0].forwards``).

    Checks every field's type and range (a run larger than :mod:`refusion.limits` allows is refused
    here, before any model loads), refuses fields a record does not have, and reads each decoder spec back
    (without importing ``"module:Class"`` parts). Nothing is run.
    """
    try:
        return _check_record(record)
    except ConfigError as exc:
        raise type(exc)(f"{source}: {exc}", param=exc.param) from None


def _fail(field: str, text: str) -> ConfigError:
    return ConfigError(f"field `{field}` {text}", param=field)


def _unknown(value: Mapping[str, Any], allowed: Sequence[str], field: str) -> None:
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        name = f"{field}.{unknown[0]}" if field else unknown[0]
        raise ConfigError(
            f"field `{name}` is not a field of {('`' + field + '`') if field else 'a record'}; "
            f"fields are {', '.join(allowed)}.",
            param=name,
        )


def _int(value: Any, field: str, low: int, high: int, why: str = "", none: bool = False) -> None:
    if value is None and none:
        return
    if not is_integer(value) or not low <= value <= high:
        raise _fail(
            field,
            f"must be an integer in [{low}, {high}]{f' ({why})' if why else ''}"
            f"{' or null' if none else ''}; got {shown(value)}.",
        )


def _num(value: Any, field: str, low: float = 0.0, none: bool = False) -> None:
    if value is None and none:
        return
    if not is_number(value) or value < low:
        raise _fail(field, f"must be a finite number >= {low}{' or null' if none else ''}; got {shown(value)}.")


def _text(value: Any, field: str, none: bool = False, empty: bool = True) -> None:
    if value is None and none:
        return
    if not isinstance(value, str) or (not empty and not value):
        raise _fail(
            field, f"must be {'text' if empty else 'non-empty text'}{' or null' if none else ''}; got {shown(value)}."
        )


def _texts(value: Any, field: str, none: bool = False) -> None:
    if value is None and none:
        return
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(field, f"must be a list of non-empty texts{' or null' if none else ''}; got {shown(value)}.")


def _check_environment(env: Mapping[str, Any]) -> None:
    _unknown(env, ENVIRONMENT_FIELDS, "environment")
    _int(env.get("torch_threads"), "environment.torch_threads", 1, MAX_THREADS, none=True)
    for key in ("refusion", "torch", "transformers", "python", "platform", "device", "dtype", "engine"):
        _text(env.get(key), f"environment.{key}", none=True)
    seeds = env.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or not all(map(is_integer, seeds))):
        raise _fail("environment.seeds", f"must be a list of integers or null; got {shown(seeds)}.")
    if env.get("model") is not None and not isinstance(env.get("model"), dict):
        raise _fail("environment.model", f"must be an object or null; got {shown(env.get('model'))}.")


def check_model_options(options: Any, field: str = "settings.model") -> dict:
    """A record's model options (``refusion.models.loading.MODEL_OPTIONS``), their types and ranges checked."""
    from refusion.models.loading import MODEL_OPTIONS

    if options is None:
        return {}
    if not isinstance(options, dict):
        raise _fail(field, f"must be an object of model options; got {shown(options)}.")
    _unknown(options, MODEL_OPTIONS, field)
    for key in ("model", "device", "dtype", "adapter"):
        _text(options.get(key), f"{field}.{key}", none=True, empty=False)
    _int(options.get("mask_token_id"), f"{field}.mask_token_id", 0, MAX_ID - 1, none=True)
    eos = options.get("eos_token_id")
    if isinstance(eos, list):
        for i, token in enumerate(eos):
            _int(token, f"{field}.eos_token_id[{i}]", 0, MAX_ID - 1)
    else:
        _int(eos, f"{field}.eos_token_id", 0, MAX_ID - 1, none=True)
    _int(options.get("logit_shift"), f"{field}.logit_shift", 0, 1, none=True)
    _int(options.get("model_block_length"), f"{field}.model_block_length", 1, MAX_GEN_LENGTH, none=True)
    trust = options.get("trust_remote_code")
    if trust is not None and not isinstance(trust, bool):
        raise _fail(f"{field}.trust_remote_code", f"must be true, false or null; got {shown(trust)}.")
    return options


def _check_settings(kind: str, settings: Mapping[str, Any]) -> None:
    _unknown(settings, SETTINGS_FIELDS[kind], "settings")
    for key in _SETTINGS[kind]:
        if key not in settings:
            raise ConfigError(f"field `settings.{key}` is missing from the record.", param=f"settings.{key}")
    if kind == "bench":
        from refusion.limits import MAX_PER_TASK
        from refusion.training.tasks import TASKS

        _int(
            settings["per_task"],
            "settings.per_task",
            1,
            MAX_PER_TASK,
            f"held-out examples per task, {len(TASKS)} tasks: at most {MAX_PER_TASK * len(TASKS)} examples",
        )
        _int(settings["gen_length"], "settings.gen_length", 1, MAX_GEN_LENGTH, "tokens generated per prompt")
        _texts(settings["methods"], "settings.methods")
        _texts(settings.get("preset_files"), "settings.preset_files", none=True)
        cost = settings.get("cost_model")
        if cost is not None:
            from refusion.measure.costmodel import parse

            try:
                parse(cost)
            except ConfigError as exc:
                raise type(exc)(f"field `settings.cost_model`: {exc}", param="settings.cost_model") from None
        check_model_options(settings.get("model"))
    else:
        _texts(settings["tasks"], "settings.tasks")
        if not settings["tasks"]:
            raise _fail("settings.tasks", "must name at least one task.")
        _text(settings["model_args"], "settings.model_args")
        _text(settings.get("include_path"), "settings.include_path", none=True, empty=False)
        limit = settings.get("limit")
        if not (isinstance(limit, float) and 0 < limit < 1):  # lm-evaluation-harness also takes a fraction
            _int(limit, "settings.limit", 1, MAX_EXAMPLES, "examples per task, or a fraction in (0, 1)", none=True)
        _int(settings.get("num_fewshot"), "settings.num_fewshot", 0, MAX_EXAMPLES, none=True)
        chat = settings.get("apply_chat_template")
        if chat is not None and not isinstance(chat, bool):
            raise _fail("settings.apply_chat_template", f"must be true, false or null; got {shown(chat)}.")
        for key in EVAL_SEED_FIELDS:
            _int(settings.get(key), f"settings.{key}", 0, SEED_LIMIT - 1, none=True)


def _check_row(row: Any, i: int) -> None:
    field = f"rows[{i}]"
    for key, kind_type in _ROW.items():
        _field(row, key, kind_type, field)
    _unknown(row, ROW_FIELDS, field)
    if "decoder" not in row:
        raise ConfigError(f"field `{field}.decoder` is missing (null for the AR baseline).", param=f"{field}.decoder")
    _text(row["method"], f"{field}.method", empty=False)
    _int(row["examples"], f"{field}.examples", 0, MAX_EXAMPLES)
    _int(row["correct"], f"{field}.correct", 0, row["examples"], "at most `examples`")
    for key in ("forwards", "tokens"):
        _int(row[key], f"{field}.{key}", 0, MAX_COUNT)
    _num(row["seconds"], f"{field}.seconds")
    for key in ("score", "accuracy", "tokens_per_forward", "gpu_seconds"):
        _num(row.get(key), f"{field}.{key}", none=True)
    per_task = row.get("per_task", {})
    if not isinstance(per_task, dict):
        raise _fail(f"{field}.per_task", f"must be an object of task: accuracy; got {shown(per_task)}.")
    for task, value in per_task.items():
        _num(value, f"{field}.per_task.{task}")
    _text(row.get("engine"), f"{field}.engine", none=True)
    outputs = row["outputs"]
    if len(outputs) > MAX_EXAMPLES:
        raise _fail(f"{field}.outputs", f"holds {len(outputs)} examples; the limit is {MAX_EXAMPLES}.")
    for j, tokens in enumerate(outputs):
        if not isinstance(tokens, list) or not all(is_integer(t) and 0 <= t < MAX_ID for t in tokens):
            raise _fail(
                f"{field}.outputs[{j}]",
                f"must be a list of token ids (integers in [0, {MAX_ID})); got {shown(tokens)}.",
            )
    _check_decoder(row["decoder"], f"{field}.decoder")


def _check_decoder(decoder: Any, field: str) -> None:
    """Read a recorded decoder spec back (errors name ``field``), never importing anything: one naming a
    ``"module:Class"`` part is left to :func:`~refusion.measure.reproduce.reproduce`, which refuses it or, when
    allowed, imports it."""
    from refusion.config.spec import DecoderSpec
    from refusion.config.trust import no_imports

    if decoder is None:
        return
    if not isinstance(decoder, dict):
        raise _fail(field, f"must be a decoder spec (an object) or null; got {shown(decoder)}.")
    try:
        with no_imports(where=f"field `{field}`", opt_in=""):
            DecoderSpec.from_dict(decoder, where=f"field `{field}`")
    except ImportRefused:
        return
    except ConfigError as exc:
        raise type(exc)(str(exc), param=f"{field}.{exc.param}" if exc.param else field) from None


def _check_record(record: Any) -> dict:
    if not isinstance(record, dict):
        raise ConfigError(f"a record must be a JSON object; got {type(record).__name__}.", param="record")
    if record.get("schema") != RECORD_SCHEMA:
        raise ConfigError(
            f"field `schema` must be {RECORD_SCHEMA!r}; got {shown(record.get('schema'))} "
            "(write records with `refusion bench --json` or `refusion eval --record FILE`).",
            param="schema",
        )
    if record.get("version") != RECORD_VERSION or isinstance(record.get("version"), bool):
        raise _fail("version", f"must be {RECORD_VERSION}; got {shown(record.get('version'))}.")
    kind = record.get("kind")
    if kind not in _REQUIRED:
        raise _fail("kind", f"must be one of {', '.join(map(repr, _REQUIRED))}; got {shown(kind)}.")
    _unknown(record, FIELDS[kind], "")
    _check_environment(_field(record, "environment", dict))
    for key, kind_type in _REQUIRED[kind].items():
        _field(record, key, kind_type)
    _check_settings(kind, record["settings"])
    if kind == "bench":
        if not record["rows"]:
            raise ConfigError("field `rows` is empty; a bench record has at least one row.", param="rows")
        if len(record["rows"]) > MAX_METHODS:
            raise _fail("rows", f"holds {len(record['rows'])} rows; the limit is {MAX_METHODS} methods.")
        for i, row in enumerate(record["rows"]):
            _check_row(row, i)
    else:
        for task, metrics in record["results"].items():
            if not isinstance(metrics, dict):
                raise _fail(f"results.{task}", f"must be an object of metric: value; got {shown(metrics)}.")
        _check_decoder(record.get("decoder"), "decoder")
        _text(record.get("outputs_sha256"), "outputs_sha256", none=True)
        _int(record.get("generations"), "generations", 0, MAX_COUNT, none=True)
    return record


def load_record(path: str | Path) -> dict:
    """Read and check a record file (JSON, through :mod:`refusion.files`: not UTF-8, not JSON, nested too
    deep or too large are refused); errors name the file and the field."""
    record = read_json(path, what="`RECORD` file", param="RECORD")
    return check_record(record, where("`RECORD` file", path))
