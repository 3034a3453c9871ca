"""``refusion sweep``: search a space of decoders."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from refusion.cli.options import add_model_options, integer, load, number
from refusion.config import PRESETS
from refusion.errors import ConfigError
from refusion.limits import MAX_EXAMPLES, MAX_GEN_LENGTH, MAX_MINUTES, MAX_TRIALS, SEED_LIMIT
from refusion.wording import counted


def run_sweep_command(args: argparse.Namespace) -> int:
    from refusion.sweep.run import SweepOptions, plan_sweep, run_plan

    tasks: Any = args.tasks
    harness = {k: getattr(args, k) for k in ("limit", "include_path", "metric") if getattr(args, k) is not None}
    if tasks.startswith("lm-eval:"):
        from refusion.sweep.harness import parse_harness

        tasks = parse_harness(tasks, **harness)
    elif harness:
        flag = next(iter(harness))
        raise ConfigError(f"`--{flag.replace('_', '-')}` is for --tasks lm-eval:TASK; got --tasks {tasks}.", param=flag)
    options = SweepOptions(
        preset=args.preset,
        space_file=args.space_file,
        mode=args.mode,
        trials=args.trials,
        minutes=args.minutes,
        objective=args.objective,
        gen_length=args.gen_length,
        seed=args.seed,
        max_accuracy_drop=args.max_accuracy_drop,
    )
    plan = plan_sweep(args.space, tasks, options, out=args.out)  # every input, before the model loads
    result = run_plan(
        plan,
        model=load(args),
        out=args.out,
        storage=args.storage,
        study=args.study,
        progress=not args.json,
        plot=not args.no_plot,
    )
    from refusion.sweep.outputs import describe_point

    if args.json:
        row = lambda r: {"trial": r.number, "point": r.point, **r.metrics}  # noqa: E731
        print(
            json.dumps(
                {
                    "mode": result.mode,
                    "trials": len(result.records),
                    "new_trials": result.new_trials,
                    "interrupted": result.interrupted,
                    "aup": result.aup,
                    "ar": result.ar,
                    "front": [row(r) for r in result.front],
                    "chosen": row(result.chosen) if result.chosen else None,
                    "files": {k: str(v) for k, v in result.files.items()},
                }
            )
        )
    else:
        print(
            f"{result.mode} sweep: {counted(len(result.records), 'trial')} in the study ({result.new_trials} new); "
            f"AR accuracy {result.ar['accuracy']:.1%}, {counted(result.ar['forwards'], 'forward')}"
            + ("" if result.aup is None else f"; AUP {result.aup:.1f}")
        )
        print(
            f"{'trial':>5} {'acc':>6} {'forwards':>8} {'tok/fwd':>7} {'fwd ratio':>9} {'speed-up':>8}  "
            "point (Pareto front)"
        )
        for r in result.front:
            mark = "*" if r is result.chosen else " "
            print(
                f"{r.number:>5} {r['accuracy']:>6.1%} {r['forwards']:>8} {r['tokens_per_forward']:>7.2f} "
                f"{r['forward_ratio']:>8.2f}x {r['speedup']:>7.2f}x {mark}{describe_point(r.point)}"
            )
        print("wrote " + ", ".join(str(v) for v in result.files.values()), file=sys.stderr)
    if result.interrupted:
        print(
            "refusion: interrupted; every finished trial is kept in the storage (run again to resume).", file=sys.stderr
        )
        return 130
    return 0


def add_parsers(sub: Any) -> None:
    sw = sub.add_parser(
        "sweep",
        help="search a space of decoders for the best accuracy/speed trade-offs",
        description="Evaluate a space of decoders (part names and parameter ranges) on a task set "
        "against AR on the same prompts; grid search for small spaces, optuna multi-objective search "
        "(accuracy up, forwards or wall time down) for large ones. Every trial is kept in an SQLite "
        "file (run again to resume); writes trials.csv, pareto.png and preset.json (use it with "
        "--preset-file); reports the AUP (accuracy under parallelism, d3LLM's area under the accuracy / "
        "tokens-per-forward curve) of the trials' front from AR's point. Needs `pip install refusion[research]`.",
    )
    sw.add_argument(
        "-s",
        "--space",
        action="append",
        default=[],
        metavar="NAME=VALUES",
        help="a dimension: part names (selector=threshold,topk), values (slot_size=4,8) or a range "
        "LOW:HIGH[:STEP] (slot_threshold=0.5:0.9:0.1); repeatable",
    )
    sw.add_argument("--space-file", default=None, metavar="FILE", help="a YAML or TOML file with a `space` table")
    sw.add_argument(
        "--tasks",
        default="held-out",
        help="held-out, held-out:N (N per shipped task), a .jsonl file of prompt/answer objects, or "
        "lm-eval:TASK[,TASK] (lm-evaluation-harness tasks; needs refusion[eval])",
    )
    sw.add_argument(
        "--limit",
        type=integer(1, MAX_EXAMPLES),
        default=None,
        help="with lm-eval tasks: examples per task (1 to 100000)",
    )
    sw.add_argument("--include-path", default=None, help="with lm-eval tasks: a directory of task YAML files")
    sw.add_argument("--metric", default=None, help="with lm-eval tasks: the metric to maximise (default: the first)")
    sw.add_argument(
        "--preset",
        default=None,
        choices=["model", *sorted(PRESETS)],
        help="the preset the space varies (default: the checkpoint's refusion.json)",
    )
    sw.add_argument(
        "--gen-length",
        type=integer(1, MAX_GEN_LENGTH),
        default=None,
        help="tokens to generate, 1 to 65536 and within the model's positions (default: the preset's)",
    )
    sw.add_argument(
        "--mode",
        default="auto",
        choices=("auto", "grid", "optuna"),
        help="grid (at most 100000 points), optuna, or auto (grid up to 64 points)",
    )
    sw.add_argument(
        "--trials",
        type=integer(1, MAX_TRIALS),
        default=None,
        help="trials in the study, earlier runs included (1 to 100000)",
    )
    sw.add_argument(
        "--minutes",
        type=number(0, MAX_MINUTES, low_open=True),
        default=None,
        help="time budget of this run (> 0, at most 43200)",
    )
    sw.add_argument(
        "--objective",
        default="forwards",
        choices=("forwards", "wall"),
        help="what to minimise besides maximising accuracy (wall = seconds per token)",
    )
    sw.add_argument("--out", default="sweep-out", help="output directory (default sweep-out)")
    sw.add_argument("--storage", default=None, help="SQLite file of the trials (default OUT/sweep.db)")
    sw.add_argument("--study", default="refusion-sweep", help="study name inside the storage")
    sw.add_argument(
        "--seed", type=integer(0, SEED_LIMIT - 1), default=0, help="seed of optuna's sampler (0 to 2**32-1)"
    )
    sw.add_argument(
        "--max-accuracy-drop",
        type=number(0, 1),
        default=0.0,
        help="the chosen preset is the fastest front point within this much of AR's accuracy (0 to 1)",
    )
    sw.add_argument("--no-plot", action="store_true", help="skip the PNG")
    sw.add_argument("--json", action="store_true", help="print the front, the chosen point and the files as JSON")
    add_model_options(sw)
    sw.set_defaults(func=run_sweep_command)
