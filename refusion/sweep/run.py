"""``refusion.sweep``: evaluate a space of decoders on a task set, keep every trial, find the Pareto front.

Grid search tries every point of a small space; optuna's multi-objective
sampler (TPE) searches a large one within a budget of trials or minutes. Both
write each trial to the SQLite storage when it finishes, so Ctrl-C (or a
crash) loses at most the trial under way, and running the same sweep again
resumes it: grid points already evaluated are skipped, and a trial budget
counts the trials already in the study.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from refusion.config import DecoderSpec
from refusion.config import preset as get_preset
from refusion.config.spec import DEFAULT_GEN_LENGTH
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError, RefusionError
from refusion.files import where
from refusion.limits import MAX_EXAMPLES, MAX_GEN_LENGTH, MAX_MINUTES, MAX_TRIALS, SEED_LIMIT
from refusion.measure.results import Result
from refusion.sweep import outputs
from refusion.sweep.evaluate import evaluate_ar, evaluate_preset
from refusion.sweep.space import MAX_GRID, Dimension, Space, build_space, parse_dimension, point_key
from refusion.sweep.spacefile import load_space_file
from refusion.sweep.study import OBJECTIVES, TrialRecord, completed, open_study
from refusion.sweep.tasks import TaskSet, load_tasks
from refusion.validators import check_integer, check_number, shown

MODES = ("auto", "grid", "optuna")
#: ``auto`` runs a grid search up to this many points, optuna beyond
GRID_LIMIT = 64
#: optuna proposals of already-evaluated points in a row after which the space counts as exhausted
MAX_REPEATS = 50


@attrs.frozen
class SweepResult:
    """What a sweep found: every completed trial, the Pareto front, the chosen point and its preset, the files written.

    ``ar`` holds the AR baseline of this run; ``interrupted`` is true when Ctrl-C stopped the run.
    """

    records: tuple[TrialRecord, ...]
    front: tuple[TrialRecord, ...]
    chosen: TrialRecord | None
    preset: DecoderSpec | None
    ar: dict[str, Any]
    mode: str
    files: dict[str, Path]
    new_trials: int
    interrupted: bool = False
    #: d3LLM's accuracy under parallelism of the trials' (tokens per forward, accuracy) front, from AR's point
    #: (:func:`refusion.sweep.outputs.aup_front`); ``None`` without trials
    aup: float | None = None


def base_preset(adapter: Any, name: str | None) -> DecoderSpec:
    """The preset a sweep starts from: ``adapter``'s own (``None`` or ``"model"``), else ``name`` as the
    checkpoint sets it (:func:`refusion.api.named_preset`)."""
    from refusion.api import named_preset

    if name is None or name == "model":
        return getattr(adapter, "preset", None) or get_preset("paper")
    return named_preset(adapter, name)


def _ar_metrics(ar: Result) -> dict[str, Any]:
    return {
        "accuracy": ar.accuracy,
        "correct": ar.correct,
        "examples": ar.examples,
        "forwards": ar.forwards,
        "tokens": ar.tokens,
        "tokens_per_forward": ar.tokens_per_forward,
        "seconds": ar.seconds,
        "seconds_per_token": ar.seconds_per_token,
        "speedup": 1.0,
        "forward_ratio": 1.0,
    }


def _trial_metrics(m: Result, ar: Result) -> dict[str, Any]:
    return {
        "accuracy": m.accuracy,
        "correct": m.correct,
        "examples": m.examples,
        "forwards": m.forwards,
        "tokens": m.tokens,
        "tokens_per_forward": m.tokens_per_forward,
        "seconds": m.seconds,
        "seconds_per_token": m.seconds_per_token,
        **m.relative_to(ar),
        "ar_accuracy": ar.accuracy,
        "ar_forwards": ar.forwards,
        "ar_seconds_per_token": ar.seconds_per_token,
    }


@attrs.frozen(kw_only=True)
class SweepOptions:
    """How a sweep searches, every value checked when the options are made (:class:`ConfigError` naming it).

    ``preset`` is the preset the space varies (a name, ``"model"`` or ``None``:
    the model's ``refusion.json``); ``space_file`` a YAML/TOML space file;
    ``mode`` ``grid``, ``optuna`` or ``auto`` (grid up to 64 points);
    ``trials`` bounds the trials in the study (earlier runs included),
    ``minutes`` this run's time; ``objective`` is what optuna minimises
    besides maximising accuracy (``forwards`` or ``wall``: seconds per
    token); ``gen_length`` the tokens generated per prompt (default: the
    preset's); ``seed`` seeds optuna's sampler; the chosen point is the fastest
    Pareto point within ``max_accuracy_drop`` of AR's accuracy; ``warmup``
    prompts are decoded before timing.
    """

    preset: str | None = None
    space_file: str | Path | None = None
    mode: str = "auto"
    trials: int | None = None
    minutes: float | None = None
    objective: str = "forwards"
    gen_length: int | None = None
    seed: int = 0
    max_accuracy_drop: float = 0.0
    warmup: int = 1

    def __attrs_post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"`mode` must be one of {', '.join(MODES)}; got {shown(self.mode)}.", param="mode")
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"`objective` must be one of {', '.join(OBJECTIVES)}; got {shown(self.objective)}.", param="objective"
            )
        if self.trials is not None:
            check_integer("trials", self.trials, 1, MAX_TRIALS, "trials in the study")
        if self.minutes is not None:
            check_number("minutes", self.minutes, 0, MAX_MINUTES, low_open=True)
        if self.gen_length is not None:
            check_integer("gen_length", self.gen_length, 1, MAX_GEN_LENGTH, "tokens generated per prompt")
        check_integer("seed", self.seed, 0, SEED_LIMIT - 1)
        check_number("max_accuracy_drop", self.max_accuracy_drop, 0, 1)
        check_integer("warmup", self.warmup, 0, MAX_EXAMPLES)
        if self.preset is not None and self.preset != "model":
            get_preset(self.preset)

    @classmethod
    def of(cls, **options: Any) -> SweepOptions:
        """The options named by ``options``; an unknown name is a :class:`ConfigError` listing the known ones."""
        known = [field.name for field in attrs.fields(cls)]
        for name in options:
            if name not in known:
                raise ConfigError(f"`{name}` is not an option of a sweep; they are {', '.join(known)}.", param=name)
        return cls(**options)


@attrs.frozen
class SweepPlan:
    """A sweep's inputs, checked before any model is loaded (:func:`plan_sweep`): the dimensions (from the
    command line and the space file), the task set, the options (the space file's ``preset`` and ``gen_length``
    under the caller's), and where the sweep writes."""

    dimensions: tuple[Dimension, ...]
    tasks: Any
    options: SweepOptions
    space: Space | None = None
    file_dimensions: tuple[str, ...] = ()


def plan_sweep(
    space: Sequence[str | Dimension] | Space = (),
    tasks: str | TaskSet = "held-out",
    options: SweepOptions | None = None,
    *,
    out: str | Path | None = None,
) -> SweepPlan:
    """Check everything of a sweep that needs no model: the options (:class:`SweepOptions`), the space file, every
    dimension (values, ranges, and for a grid search the number of points, computed without listing them), the
    task set, and ``out`` (a directory, or a path one can be made at).

    Every error is a :class:`ConfigError` whose ``param`` names the option, the dimension or the file.
    """
    from refusion.files import check_output_dir

    options = options or SweepOptions()
    if out is not None:
        check_output_dir(out, "out")
    file = load_space_file(options.space_file) if options.space_file is not None else None
    ready = space if isinstance(space, Space) else None
    if ready is not None:
        dims = ready.dimensions
    else:
        if isinstance(space, (str, bytes)) or not isinstance(space, Sequence):
            raise ConfigError(f"`space` must be a list of dimensions (NAME=VALUES); got {shown(space)}.", param="space")
        dims = (
            *(file.dimensions if file else ()),
            *(d if isinstance(d, Dimension) else parse_dimension(_text(d)) for d in space),
        )
    if options.mode == "grid":
        for dim in dims:  # a grid has at least as many points as any one dimension has values
            count = dim.count()
            if count is None or count > MAX_GRID:
                dim.grid()  # the error names the dimension
    if file is not None:
        options = attrs.evolve(
            options,
            preset=options.preset or file.preset,
            gen_length=options.gen_length or file.gen_length,
            space_file=file.path,
        )
    return SweepPlan(
        tuple(dims), load_tasks(tasks), options, ready, tuple(d.name for d in file.dimensions) if file else ()
    )


def _text(spec: Any) -> str:
    if not isinstance(spec, str):
        raise ConfigError(f"`space` entries are NAME=VALUES text or Dimensions; got {shown(spec)}.", param="space")
    return spec


def run_sweep(
    space: Sequence[str] | Space = (),
    tasks: str | TaskSet = "held-out",
    *,
    model: Any = None,
    out: str | Path = "sweep-out",
    storage: str | Path | None = None,
    study: str = "refusion-sweep",
    progress: bool = True,
    plot: bool = True,
    evaluate: Callable[[Any, DecoderSpec, TaskSet], Result] | None = None,
    **options: Any,
) -> SweepResult:
    """Evaluate a space of decoders on ``tasks`` and write ``trials.csv``, ``pareto.png`` and ``preset.json`` to
    ``out``.

    ``space`` is a list of dimension specs (``"selector=threshold,topk"``,
    ``"slot_threshold=0.5:0.9:0.1"``) and/or the ``space_file`` option a
    YAML/TOML file; they vary the ``preset`` option (default: the model's
    ``refusion.json``). ``tasks`` is ``"held-out[:N]"``, a ``.jsonl`` file or
    ``"lm-eval:TASK[,TASK]"`` / a :class:`~refusion.sweep.harness.HarnessTasks`.
    ``options`` are :class:`SweepOptions`' fields (``mode``, ``trials``,
    ``minutes``, ``objective``, ``gen_length``, ``seed``,
    ``max_accuracy_drop``, ``warmup``, ``preset``, ``space_file``).
    ``storage`` (default ``out/sweep.db``) keeps every trial; the same storage
    and ``study`` resume a sweep. ``evaluate`` replaces the measurement (for
    tests). Never touches the model's weights.

    Limits (:mod:`refusion.limits`): ``gen_length`` <= 65,536 and within
    the model's positions after the longest prompt, ``trials`` <= 100,000, a
    grid search <= 100,000 points, ``minutes`` <= 43,200. Every input is
    checked (:func:`plan_sweep`) before the model is loaded; the task set's
    text against the model's tokenizer before the study is created.
    """
    plan = plan_sweep(space, tasks, SweepOptions.of(**options), out=out)
    return run_plan(
        plan, model=model, out=out, storage=storage, study=study, progress=progress, plot=plot, evaluate=evaluate
    )


def run_plan(
    plan: SweepPlan,
    *,
    model: Any = None,
    out: str | Path = "sweep-out",
    storage: str | Path | None = None,
    study: str = "refusion-sweep",
    progress: bool = True,
    plot: bool = True,
    evaluate: Callable[[Any, DecoderSpec, TaskSet], Result] | None = None,
) -> SweepResult:
    """Run a checked :class:`SweepPlan` on ``model`` (see :func:`run_sweep`)."""
    from refusion.api import load_model
    from refusion.files import check_output_dir
    from refusion.sweep.tasks import check_examples

    check_output_dir(out, "out")  # before the model loads
    adapter = load_model(model)
    if adapter.tokenizer is None:
        raise ConfigError("`refusion sweep` needs a model with a tokenizer (it scores decoded text).", param="model")
    options = plan.options
    space = plan.space
    if space is None:
        base = base_preset(adapter, options.preset)
        try:
            space = build_space(base, plan.dimensions)
        except ConfigError as exc:
            if exc.param in plan.file_dimensions:
                raise ConfigError(
                    f"{where('`space file`', str(options.space_file))}, field `space.{exc.param}`: {exc}",
                    param=exc.param,
                ) from None
            raise
    length = options.gen_length or space.base.gen_length or DEFAULT_GEN_LENGTH
    check_integer("gen_length", length, 1, MAX_GEN_LENGTH, "tokens generated per prompt")
    taskset = plan.tasks
    check_examples(taskset, adapter, length)
    size = space.grid_size()
    mode = options.mode
    if mode == "auto":
        mode = "grid" if size is not None and size <= GRID_LIMIT else "optuna"
    points = space.grid() if mode == "grid" else None
    trials = options.trials
    if mode == "optuna" and trials is None and options.minutes is None:
        trials = 30
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    signature = {
        "space": space.describe(),
        "base": attrs.evolve(space.base, description="").to_dict(),
        "tasks": taskset.name,
        "examples": len(taskset.examples),
        "gen_length": length,
        "objective": options.objective,
        "mode": mode,
    }
    db = Path(storage) if storage is not None else out / "sweep.db"
    the_study = open_study(db, study, signature)
    measure, measure_ar = _measures(taskset, options.warmup)
    measure = evaluate or measure

    ar = measure_ar(adapter, taskset, length)
    new, interrupted = 0, False
    try:
        new = _search(
            the_study,
            space,
            points,
            mode,
            adapter,
            taskset,
            length,
            ar,
            measure,
            options.objective,
            trials,
            options.minutes,
            options.seed,
            progress,
        )
    except KeyboardInterrupt:
        interrupted = True
    return _finish(
        the_study,
        db,
        space,
        length,
        ar,
        mode,
        options.objective,
        out,
        options.max_accuracy_drop,
        plot,
        new,
        interrupted,
    )


def _measures(taskset: Any, warmup: int) -> tuple[Callable, Callable]:
    """How a point and AR are measured on ``taskset``: held-out/JSONL examples, or lm-evaluation-harness tasks."""
    from refusion.sweep.harness import HarnessTasks, evaluate_harness

    if not isinstance(taskset, HarnessTasks):
        return (
            lambda a, p, t: evaluate_preset(a, p, t, warmup=warmup),
            lambda a, t, n: evaluate_ar(a, t, n, warmup=warmup),
        )

    task_dict = taskset.task_dict()

    def point(adapter: Any, preset: DecoderSpec, tasks: Any) -> Result:
        decoder = Decoder.from_spec(preset)
        return evaluate_harness(adapter, tasks, task_dict, decoder, preset.gen_length or DEFAULT_GEN_LENGTH)

    return point, lambda a, t, n: evaluate_harness(a, t, task_dict, None, n)


def _search(
    study: Any,
    space: Space,
    points: list | None,
    mode: str,
    adapter: Any,
    taskset: TaskSet,
    length: int,
    ar: Result,
    measure: Callable,
    objective: str,
    trials: int | None,
    minutes: float | None,
    seed: int,
    progress: bool,
) -> int:
    import optuna
    from tqdm.auto import tqdm

    done = {point_key(r.point) for r in completed(study)}
    start = time.monotonic()
    total: int | None
    if mode == "grid":
        todo = [p for p in points or () if point_key(p) not in done]
        total = len(todo) if trials is None else max(0, min(len(todo), trials - len(done)))
    else:
        total = None if trials is None else max(0, trials - len(done))
        sampler = optuna.samplers.TPESampler(seed=(seed + len(study.trials)) % SEED_LIMIT)
        study.sampler = sampler
    size = space.grid_size()
    new, repeats = 0, 0
    bar = tqdm(total=total, desc="sweep", unit="trial", disable=not progress, leave=False)
    try:
        while total is None or new < total:
            if minutes is not None and time.monotonic() - start > 60 * minutes:
                break
            if size is not None and len(done) >= size:
                break
            if mode == "grid":
                with warnings.catch_warnings():  # PartialFixedSampler is marked experimental
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    study.sampler = optuna.samplers.PartialFixedSampler(todo[new], optuna.samplers.RandomSampler(seed))
                trial = study.ask()
                point = space.suggest(trial, grid=True)
            else:
                trial = study.ask()
                point = space.suggest(trial)
                if point_key(point) in done:
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    repeats += 1
                    if repeats >= MAX_REPEATS:
                        break
                    continue
            repeats = 0
            trial.set_user_attr("point", point)
            try:
                metrics = measure(adapter, space.preset(point, length), taskset)
            except RefusionError as exc:
                trial.set_user_attr("error", f"{type(exc).__name__}: {exc}")
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                done.add(point_key(point))
                new += 1
                bar.update()
                continue
            except BaseException:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise
            values = _trial_metrics(metrics, ar)
            for key, value in values.items():
                trial.set_user_attr(key, value)
            study.tell(trial, [values["accuracy"], values[OBJECTIVES[objective]]])
            done.add(point_key(point))
            new += 1
            bar.update()
            bar.set_postfix_str(f"acc {values['accuracy']:.0%} x{values[outputs.SPEED[objective]]:.2f}")
    finally:
        bar.close()
    return new


def _finish(
    study: Any,
    db: Path,
    space: Space,
    length: int,
    ar: Result,
    mode: str,
    objective: str,
    out: Path,
    max_accuracy_drop: float,
    plot: bool,
    new: int,
    interrupted: bool,
) -> SweepResult:
    from refusion.sweep.space import describe_point

    records = completed(study)
    ar_row = _ar_metrics(ar)
    files = {"storage": db}
    files["csv"] = outputs.write_csv(out / "trials.csv", records, outputs.pareto_front(records, objective), ar_row)
    if not records:
        return SweepResult((), (), None, None, ar_row, mode, files, new, interrupted)
    front = outputs.pareto_front(records, objective)
    chosen = outputs.choose(front, ar.accuracy, objective, max_accuracy_drop)
    preset = attrs.evolve(
        space.preset(chosen.point, length),
        description=f"chosen by refusion sweep ({describe_point(chosen.point)}): accuracy {chosen['accuracy']:.1%} "
        f"(AR {ar.accuracy:.1%}), {chosen['forward_ratio']:.2f}x fewer forwards, {chosen['speedup']:.2f}x wall "
        "speed-up",
    )
    files["preset"] = outputs.write_preset(out / "preset.json", preset)
    if plot:
        files["png"] = outputs.write_front_png(out / "pareto.png", records, front, chosen, ar.accuracy, objective)
    score, _ = outputs.aup_front(records, ar_row)
    return SweepResult(tuple(records), tuple(front), chosen, preset, ar_row, mode, files, new, interrupted, score)
