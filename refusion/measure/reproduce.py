"""``refusion reproduce RECORD``: re-run a bench or eval record and say whether it still holds.

The record (:mod:`refusion.measure.records`) says how the run was made: the model
options, the decoder specs, the task settings and the torch thread count.
:func:`reproduce` runs it again in this process and compares what must be
equal (accuracy, forwards, tokens and every example's generated tokens for
bench; every metric and a hash of the generated texts for eval), lists what
changed in the environment (versions, device, model hash), and reports wall
times side by side without comparing them (they never repeat exactly).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from refusion.config import DecoderSpec
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError, ImportRefused
from refusion.measure.records import check_model_options, check_record, environment

#: environment entries whose change is reported (dotted paths into the environment)
WATCHED = (
    "refusion",
    "torch",
    "transformers",
    "python",
    "device",
    "dtype",
    "torch_threads",
    "model.sha256",
    "model.git_revision",
)
#: the bench numbers that must repeat exactly
BENCH_FIELDS = ("examples", "correct", "forwards", "tokens", "per_task")


@attrs.frozen
class Reproduction:
    """The outcome of re-running a record.

    ``differences``: what did not repeat (empty = reproduced);
    ``environment_changes``: ``"torch: 2.13.0 -> 2.14.0"``-style lines;
    ``timings``: ``(method, recorded seconds, seconds now)`` per bench row.
    """

    kind: str
    differences: tuple[str, ...]
    environment_changes: tuple[str, ...]
    timings: tuple[tuple[str, float, float], ...] = ()

    @property
    def matches(self) -> bool:
        return not self.differences

    def report(self) -> str:
        """A short human-readable report."""
        lines = [
            f"{self.kind} record: "
            + (
                "reproduced: every number and token matches"
                if self.matches
                else f"NOT reproduced: {len(self.differences)} difference(s)"
            )
        ]
        lines += [f"  differs: {d}" for d in self.differences]
        lines += [f"  environment: {c}" for c in self.environment_changes] or ["  environment: unchanged"]
        lines += [f"  wall time {m}: {a:.2f} s recorded, {b:.2f} s now" for m, a, b in self.timings]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "matches": self.matches,
            "differences": list(self.differences),
            "environment_changes": list(self.environment_changes),
            "timings": [{"method": m, "recorded_seconds": a, "seconds": b} for m, a, b in self.timings],
        }


def _lookup(env: Mapping[str, Any], dotted: str) -> Any:
    value: Any = env
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal, counting NaN equal to NaN (lm-eval reports NaN standard errors for one example)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def environment_changes(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``"key: recorded -> now"`` for each :data:`WATCHED` entry that differs."""
    return [
        f"{key}: {_lookup(recorded, key)} -> {_lookup(now, key)}"
        for key in WATCHED
        if _lookup(recorded, key) != _lookup(now, key)
    ]


def load_model_from(settings: Mapping[str, Any]) -> Any:
    """The model a record's ``settings.model`` options describe (the same loading as the command line)."""
    from refusion.models.loading import load_from_options

    options = check_model_options(settings.get("model"))
    if options.get("trust_remote_code"):
        raise ConfigError(
            "field `settings.model.trust_remote_code` is true: reproducing this record would run the "
            "checkpoint's own code; load that model yourself if you trust it.",
            param="settings.model.trust_remote_code",
        )
    return load_from_options(options)


#: what an error about a ``"module:Class"`` name in a record tells the user
OPT_IN = (
    "Reproduce it only if you trust the record: `refusion reproduce --allow-imports` "
    "(Python: `reproduce(record, allow_imports=True)`)."
)


def refuse_imports(record: Mapping[str, Any], source: str = "record") -> None:
    """Refuse a (checked) record whose decoders name a part or engine by ``"module:Class"`` path, or whose eval
    ``model_args`` do: reproducing it would import and run that module. The error's ``param`` is the field
    (``rows[1].decoder.selector``, ``settings.model_args.selector``). Nothing is imported."""
    from refusion.config.params import parse_param
    from refusion.config.trust import no_imports, refuse_import_paths

    def refuse(config: Any, field: str) -> None:
        try:
            refuse_import_paths(config, where=f"{source}: field `{field}`", opt_in=OPT_IN)
        except ConfigError as exc:
            raise type(exc)(str(exc), param=f"{field}.{exc.param}") from None

    def read(decoder: Any, field: str) -> DecoderSpec:
        """The decoder spec, read with imports refused (the raw field was checked first)."""
        try:
            with no_imports(where=f"{source}: field `{field}`", opt_in=OPT_IN):
                return DecoderSpec.from_dict(decoder, where=f"{source}: field `{field}`")
        except ImportRefused as exc:
            raise type(exc)(str(exc), param=f"{field}.{exc.param}") from None

    decoders = (
        [(f"rows[{i}].decoder", row.get("decoder")) for i, row in enumerate(record.get("rows", ()))]
        if record["kind"] == "bench"
        else [("decoder", record.get("decoder"))]
    )
    for field, decoder in decoders:
        if decoder is None:
            continue
        refuse(decoder, field)  # every form a record's decoder may take, before it is read
        refuse(read(decoder, field), field)
    if record["kind"] == "eval":
        args = {}
        for item in filter(None, (a.strip() for a in record["settings"]["model_args"].split(","))):
            try:
                key, value = parse_param(item)
            except ValueError:
                continue  # lm-evaluation-harness reports it
            args[key] = value
        refuse(args, "settings.model_args")
        if record["settings"].get("include_path"):
            raise ConfigError(
                f"{source}: field `settings.include_path` names a directory of lm-evaluation-harness "
                "task files, which may run Python (`!function`). " + OPT_IN,
                param="settings.include_path",
            )


def reproduce(
    record: Mapping[str, Any], *, progress: bool = False, allow_imports: bool = False, source: str = "record"
) -> Reproduction:
    """Re-run ``record`` (a bench or eval record, checked here) and compare; see the module docstring.

    Every field is checked before the model loads (:func:`~refusion.measure.records.check_record`). A record
    whose decoders (or eval ``model_args``) name a part or engine by ``"module:Class"`` path is refused, since
    building it would import and run that module, unless ``allow_imports`` (CLI: ``--allow-imports``): only
    for records you trust. Errors start with ``source`` (for a file, its name). Runs with the recorded torch
    thread count and restores the current one afterwards.
    """
    import torch

    check_record(record, source)
    if not allow_imports:
        refuse_imports(record, source)
    threads = torch.get_num_threads()
    wanted = record["environment"].get("torch_threads")
    if isinstance(wanted, int) and wanted >= 1:
        torch.set_num_threads(wanted)
    try:
        return (_bench if record["kind"] == "bench" else _eval)(record, progress)
    finally:
        torch.set_num_threads(threads)


def _bench(record: Mapping[str, Any], progress: bool) -> Reproduction:
    from refusion.measure.bench import run_bench
    from refusion.training.tasks import held_out

    settings = record["settings"]
    model = load_model_from(settings)
    methods = [
        (
            row["method"],
            None
            if row["decoder"] is None
            else Decoder.from_spec(DecoderSpec.from_dict(row["decoder"], where=f"field `rows[{i}].decoder`")),
        )
        for i, row in enumerate(record["rows"])
    ]
    rows = run_bench(
        model,
        held_out(settings["per_task"]),
        methods,
        settings["gen_length"],
        progress=progress,
        cost_model=settings.get("cost_model"),
    )
    differences = []
    for old, new in zip(record["rows"], rows):
        for field in BENCH_FIELDS:
            if old.get(field) != getattr(new, field):
                differences.append(f"{old['method']}: {field} {old.get(field)} -> {getattr(new, field)}")
        outputs = [list(o) for o in new.outputs]
        if old["outputs"] != outputs:
            changed = [i for i, (a, b) in enumerate(zip(old["outputs"], outputs)) if a != b]
            changed += list(range(min(len(old["outputs"]), len(outputs)), max(len(old["outputs"]), len(outputs))))
            differences.append(
                f"{old['method']}: tokens of {len(changed)} example(s) differ (first: example {changed[0]})"
            )
    return Reproduction(
        "bench",
        tuple(differences),
        tuple(environment_changes(record["environment"], environment(model))),
        tuple((old["method"], float(old["seconds"]), new.seconds) for old, new in zip(record["rows"], rows)),
    )


def _eval(record: Mapping[str, Any], progress: bool) -> Reproduction:
    from refusion.measure.lmeval import EVAL_SEEDS, evaluate_with_record

    settings = record["settings"]
    seeds = {k: settings[k] for k in EVAL_SEEDS if k in settings}
    options = {k: settings[k] for k in ("num_fewshot", "apply_chat_template") if settings.get(k) is not None}
    _, again = evaluate_with_record(
        settings["tasks"],
        model_args=settings["model_args"],
        include_path=settings.get("include_path"),
        limit=settings.get("limit"),
        **seeds,
        **options,
    )
    differences = []
    for task, metrics in record["results"].items():
        now = again["results"].get(task)
        if now is None:
            differences.append(f"{task}: no result now")
            continue
        for metric, value in metrics.items():
            if not _same(now.get(metric), value):
                differences.append(f"{task}: {metric} {value} -> {now.get(metric)}")
    if record.get("outputs_sha256") != again["outputs_sha256"]:
        differences.append(
            f"generated texts differ (sha256 {str(record.get('outputs_sha256'))[:12]} -> "
            f"{again['outputs_sha256'][:12]})"
        )
    return Reproduction(
        "eval", tuple(differences), tuple(environment_changes(record["environment"], again["environment"]))
    )
