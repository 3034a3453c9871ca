"""``refusion bench``, ``refusion eval`` and ``refusion reproduce``: measure decoders, re-run records."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from refusion.cli.options import add_model_options, integer, load, model_settings, write_record
from refusion.errors import ConfigError
from refusion.limits import MAX_EXAMPLES, MAX_GEN_LENGTH, MAX_PER_TASK


def run_bench(args: argparse.Namespace) -> int:
    from refusion.api import named_preset
    from refusion.config import load_preset
    from refusion.config import preset as get_preset
    from refusion.decoding.decoder import Decoder
    from refusion.measure.bench import AR_METHOD, table
    from refusion.measure.bench import run_bench as bench
    from refusion.training.tasks import held_out

    if args.cost_model is not None:
        from refusion.measure.costmodel import parse

        parse(args.cost_model)  # before any work
    files = [(f"file {f}", load_preset(f)) for f in args.preset_file or ()]  # bad files refused before any work
    names = args.method or ([] if files else ["model", "ar", "fast-dllm"])
    for name in names:  # unknown presets are refused before the model loads
        if name != "model":
            get_preset(name)
    for name, spec in files + [(n, get_preset(n)) for n in names if n != "model"]:
        _fits(name, Decoder.from_spec(spec), args.gen_length)  # bad parameters and lengths too
    model = load(args)
    if model.tokenizer is None:
        raise ConfigError(
            "`refusion bench` needs a model with a tokenizer (it decodes the synthetic tasks' text).", param="model"
        )
    methods: list[tuple[str, Any]] = [(AR_METHOD, None)] if model.capabilities.causal else []
    chosen = [
        (
            name,
            model.preset
            if name == "model" and getattr(model, "preset", None)
            else named_preset(model, "paper" if name == "model" else name),
        )
        for name in names
    ]
    for name, spec in chosen + files:  # every method takes the same --gen-length, checked before AR runs
        methods.append((name, _fits(name, Decoder.from_spec(spec), args.gen_length)))
    rows = bench(
        model, held_out(args.per_task), methods, args.gen_length, progress=not args.json, cost_model=args.cost_model
    )
    if args.json or args.record:
        from refusion.engines import choose_engine
        from refusion.measure.records import bench_record, environment

        settings = {
            "per_task": args.per_task,
            "gen_length": args.gen_length,
            "methods": names,
            "preset_files": list(args.preset_file or ()),
            "cost_model": args.cost_model,
            "model": model_settings(args),
        }
        engines = [None if d is None else choose_engine(model, d).name for _, d in methods]
        record = bench_record(rows, [d for _, d in methods], settings, environment(model), engines)
        write_record(record, args.record, args.json)
    if not args.json:
        print(table(rows, rows[0].method, args.cost_model))
    return 0


def _fits(name: str, decoder: Any, gen_length: int) -> Any:
    """``decoder`` if it can decode ``gen_length`` tokens, else a ConfigError naming the method."""
    try:
        decoder.partition(gen_length)
    except ConfigError as exc:
        raise ConfigError(
            f"method {name!r} cannot decode `--gen-length` {gen_length}: {exc}", param="gen_length"
        ) from None
    return decoder


def run_eval(args: argparse.Namespace) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ConfigError(f"`--tasks` must name at least one task; got {args.tasks!r}.", param="--tasks")
    if args.log_samples and args.output_path is None:
        raise ConfigError(
            "`--log-samples` needs `--output-path` (the samples are written there), as in lm-eval.",
            param="--log-samples",
        )
    try:
        from refusion.measure.lmeval import evaluate, make_tables
    except ImportError as exc:
        raise ConfigError(
            f"`refusion eval` needs lm-evaluation-harness: pip install 'refusion[eval]' ({exc}).", param="tasks"
        ) from None
    model_args = args.model_args
    if args.batch_size is not None:
        model_args = ",".join(filter(None, [model_args, f"batch_size={args.batch_size}"]))
    try:
        results = evaluate(
            tasks,
            model_args=model_args,
            include_path=args.include_path,
            limit=args.limit,
            num_fewshot=args.num_fewshot,
            apply_chat_template=args.apply_chat_template,
            log_samples=args.log_samples,
            output_path=args.output_path,
        )
    except KeyError as exc:  # lm-eval's "not a registered task" and friends
        raise ConfigError(f"`--tasks` {args.tasks!r}: {exc.args[0] if exc.args else exc}", param="--tasks") from None
    if args.output_path is not None:
        print(f"refusion: results written under {args.output_path}", file=sys.stderr)
    if args.json:
        print(json.dumps(results["results"], default=str))
    else:
        print(make_tables(results))
    if args.record:
        write_record(results["refusion_record"], args.record, False)
    return 0


def run_reproduce(args: argparse.Namespace) -> int:
    from refusion.files import where
    from refusion.measure.records import load_record
    from refusion.measure.reproduce import reproduce

    outcome = reproduce(
        load_record(args.record),
        progress=not args.json,
        allow_imports=args.allow_imports,
        source=where("`RECORD` file", args.record),
    )
    print(json.dumps(outcome.as_dict()) if args.json else outcome.report())
    return 0 if outcome.matches else 1


def add_parsers(sub: Any) -> None:
    bench = sub.add_parser(
        "bench",
        help="accuracy and speed on the synthetic held-out tasks",
        description="Decode the synthetic held-out tasks with AR (transformers generate) and the "
        "named presets ('model' = the checkpoint's refusion.json); print accuracy, forwards, "
        "tokens per forward, wall time and ratios to AR, and each method's AUP (accuracy under parallelism, "
        "d3LLM's: the area under the accuracy / tokens-per-forward curve from AR's point to the method's, "
        "weighted by min(exp(-3 (1 - acc / best acc)), 1); '-' where the method lost more than 5 points, a "
        "curve AUP's authors refuse; see docs/benchmarks.md).",
    )
    bench.add_argument(
        "--per-task",
        type=integer(1, MAX_PER_TASK, "held-out examples per task"),
        default=10,
        help="held-out examples per task, 1 to 1000 (default 10)",
    )
    bench.add_argument(
        "--method",
        action="append",
        default=None,
        metavar="PRESET",
        help="a preset to measure (repeatable; default: model, ar, fast-dllm)",
    )
    bench.add_argument(
        "--preset-file",
        action="append",
        default=None,
        metavar="FILE",
        help="also measure the decoder spec in this JSON file, e.g. a sweep's preset.json (repeatable)",
    )
    bench.add_argument(
        "--gen-length",
        type=integer(1, MAX_GEN_LENGTH),
        default=32,
        help="tokens to generate per prompt, 1 to 65536 and within the model's positions (default 32)",
    )
    bench.add_argument(
        "--json",
        action="store_true",
        help="print a reproducible record as JSON: rows, outputs, environment, decoder specs",
    )
    bench.add_argument(
        "--record",
        default=None,
        metavar="FILE",
        help="also write the record to FILE (re-run it with `refusion reproduce FILE`)",
    )
    bench.add_argument(
        "--cost-model",
        default=None,
        metavar="MODEL@GPU",
        help="also estimate tokens/s of the same forwards on a GPU at a model size, e.g. qwen3-8b@h100 "
        "(roofline; see refusion/measure/costmodel.py)",
    )
    add_model_options(bench)
    bench.set_defaults(func=run_bench)

    ev = sub.add_parser(
        "eval",
        help="run lm-evaluation-harness tasks with a refusion strategy",
        description="Run EleutherAI lm-evaluation-harness tasks with the `refusion` model type "
        "(needs `pip install refusion[eval]`) and print lm-eval's results table. The flags are "
        "lm-eval's own (`lm_eval --model refusion ...`).",
    )
    ev.add_argument("--tasks", required=True, help="comma-separated task names")
    ev.add_argument("--model-args", default="", help="e.g. pretrained=DIR,preset=gsm8k,selector=topk,k=2")
    ev.add_argument("--include-path", default=None, help="directory with extra task YAML files")
    ev.add_argument("--limit", type=integer(1, MAX_EXAMPLES), default=None, help="examples per task (1 to 100000)")
    ev.add_argument(
        "--num-fewshot",
        type=integer(0),
        default=None,
        help="few-shot examples in each prompt (default: the task's own)",
    )
    ev.add_argument(
        "--batch-size",
        type=integer(1),
        default=None,
        help="prompts decoded together (default 1; the same as batch_size= in --model-args)",
    )
    ev.add_argument(
        "--output-path",
        default=None,
        metavar="DIR",
        help="write lm-eval's results JSON (and, with --log-samples, each task's samples) under DIR",
    )
    ev.add_argument(
        "--log-samples", action="store_true", help="also write every prompt and answer (needs --output-path)"
    )
    ev.add_argument(
        "--apply-chat-template",
        action="store_true",
        help="wrap each prompt in the tokenizer's chat template (multi-turn few-shot, as lm-eval does)",
    )
    ev.add_argument("--json", action="store_true", help="print the scores as compact JSON instead of the table")
    ev.add_argument(
        "--record",
        default=None,
        metavar="FILE",
        help="write the run's reproducible record (environment, decoder spec, settings) to FILE",
    )
    ev.set_defaults(func=run_eval)

    rep = sub.add_parser(
        "reproduce",
        help="re-run a bench or eval record and compare numbers and tokens",
        description="Re-run the run a record describes (`bench --record FILE`, `eval --record FILE`) "
        "with its decoder specs, settings and thread count; report what differs and what changed in "
        "the environment. Exit status 0 when every number and token matches, 1 otherwise.",
    )
    rep.add_argument("record", help="record file (JSON)")
    rep.add_argument("--json", action="store_true", help="print the comparison as JSON")
    rep.add_argument(
        "--allow-imports",
        action="store_true",
        default=False,
        help='build decoders whose parts or engine the record names by module path ("module:Class"), '
        "which imports and runs that module; only for records you trust (refused otherwise)",
    )
    rep.set_defaults(func=run_reproduce)
