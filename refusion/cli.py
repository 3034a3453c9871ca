"""The ``refusion`` command line: generate, visualize, bench, eval, sweep, reproduce, train, plugins, serve.

Every subcommand explains its options in ``--help``; ``--json`` prints
machine-readable output; long work shows a progress bar on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from refusion.config import PRESETS
from refusion.errors import ConfigError, RefusionError
from refusion.config.params import parse_param


def _param(text: str) -> tuple[str, Any]:
    try:
        return parse_param(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- shared options -------------------------------------------------------------
def _model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", default=None,
                       help="checkpoint directory: LLaDA, Dream, SDAR and ReFusion checkpoints are recognised from "
                       "their config.json (default: the model shipped with refusion)")
    group.add_argument("--device", default=None, help="torch device for the model, e.g. cuda")
    group.add_argument("--dtype", default="auto", help="model dtype: auto, float32, bfloat16, ...")
    group.add_argument("--mask-token-id", type=int, default=None, help="mask token id, if the checkpoint does not say")
    group.add_argument("--eos-token-id", type=int, action="append", default=None, help="EOS id (repeatable)")
    group.add_argument("--adapter", default=None,
                       help="for architectures outside the supported families only: hf-causal (causal LMs), hf-mdm "
                       "(bidirectional MDMs) or hf-block (block diffusion); default: recognised from config.json")
    group.add_argument("--logit-shift", type=int, default=None, choices=(0, 1),
                       help="with --adapter hf-mdm: 0 = LLaDA-style, 1 = Dream-style (logits predict the next position)")
    group.add_argument("--model-block-length", type=int, default=None, metavar="N",
                       help="block length of a block-diffusion model (SDAR: config.json's block_size, else 4)")
    group.add_argument("--trust-remote-code", action="store_true", default=False,
                       help="run the checkpoint's own code (only for architectures outside the supported families)")


def _decoding_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("decoding (see `refusion plugins` for every part and parameter)")
    group.add_argument("--preset", default=None, choices=sorted(PRESETS),
                       help="named configuration (default: the checkpoint's refusion.json, else paper)")
    group.add_argument("--preset-file", default=None, metavar="FILE",
                       help="a preset JSON file, e.g. the preset.json `refusion sweep` writes (instead of --preset)")
    group.add_argument("--gen-length", type=int, default=None,
                       help="tokens to generate, exactly (the last slot or block may be shorter; a length the "
                       "partitioner cannot split is refused with the nearest allowed ones). Default: the preset's, "
                       "shortened to fit the model's positions (the shipped model has 128) with a note")
    group.add_argument("--partitioner", default=None, help="partitioner name, e.g. fixed, semi-ar")
    group.add_argument("--selector", default=None, help="slot selector name, e.g. threshold, topk, factor")
    group.add_argument("--infiller", default=None, help="infiller name, e.g. parallel-ar, greedy-verify, draft")
    group.add_argument("--reorderer", default=None, help="cache reorderer name, e.g. commit-order, reencode")
    group.add_argument("--slot-size", type=int, default=None, help="tokens per slot (partitioner `slot_size`)")
    group.add_argument("--serial-blocks", type=int, default=None, help="serial blocks (partitioner `serial_num_blocks`)")
    group.add_argument("--slot-threshold", type=float, default=None, help="selector `slot_threshold` in [0, 1]")
    group.add_argument("--token-threshold", type=float, default=None, help="infiller `token_threshold` in [0, 1]")
    group.add_argument("-p", "--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
                       help="any part parameter, e.g. -p k=2 or -p selector.k=2 (repeatable)")
    group.add_argument("--temperature", type=float, default=None, help="sampling temperature for drafts (0 = greedy)")
    group.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    group.add_argument("--top-p", type=float, default=None, help="sample within the top-p probability mass")
    group.add_argument("--seed", type=int, default=None, help="seed of the sampling (each prompt has its own generator)")
    group.add_argument("--engine", default=None,
                       help="what runs the model calls: branch (batched, shared-prefix branches, in-place cache), "
                       "repeat (the reference's), canvas (bidirectional models); default: the best for the model")
    group.add_argument("--no-stop-at-eos", dest="stop_at_eos", action="store_false", default=None,
                       help="decode every position even after an EOS (the answer is still cut at the first EOS)")
    group.add_argument("--chat", dest="chat", action="store_true", default=None, help="apply the tokenizer's chat template")
    group.add_argument("--no-chat", dest="chat", action="store_false", help="feed the prompt as is")


FLAG_PARAMS = (("slot_size", "slot_size"), ("serial_blocks", "serial_num_blocks"), ("slot_threshold", "slot_threshold"),
               ("token_threshold", "token_threshold"), ("temperature", "temperature"), ("top_k", "top_k"),
               ("top_p", "top_p"), ("seed", "seed"), ("engine", "engine"), ("stop_at_eos", "stop_at_eos"))


def _load(args: argparse.Namespace):
    import torch

    from refusion.api import load_model

    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype, None)
    if not isinstance(dtype, (str, torch.dtype)):
        raise ConfigError(f"`--dtype` must be auto or a torch dtype name such as float32 or bfloat16; got {args.dtype!r}.")
    kwargs: dict[str, Any] = {"dtype": dtype}
    for flag, key in (("device", "device"), ("mask_token_id", "mask_token_id"), ("eos_token_id", "eos_token_id"),
                      ("model_block_length", "block_length")):
        if getattr(args, flag) is not None:
            kwargs[key] = getattr(args, flag)
    if args.adapter == "hf-mdm":
        kwargs["logit_shift"] = args.logit_shift or 0
    elif args.logit_shift is not None:
        raise ConfigError(f"`--logit-shift` {args.logit_shift} applies only with `--adapter hf-mdm` (bidirectional "
                          f"models); the adapter is {args.adapter!r}. Drop it or add `--adapter hf-mdm`.")
    return load_model(args.model, adapter=args.adapter, trust_remote_code=args.trust_remote_code, **kwargs)


NAMED = ("gen_length", "preset", "chat", "partitioner", "selector", "infiller", "reorderer")


def _decode(args: argparse.Namespace, prompts: list[Any], model: Any) -> list[Any]:
    from refusion.api import generate

    params = dict(args.param)
    for key in NAMED:  # `-p selector=topk` means `--selector topk`
        if key in params:
            if getattr(args, key) is not None:
                raise ConfigError(f"`{key}` is given twice (as an option and as -p {key}=...); keep one.")
            setattr(args, key, params.pop(key))
    _add_flag_params(args, params)
    return generate(prompts, model, gen_length=args.gen_length, preset=_chosen_preset(args), chat=args.chat,
                    partitioner=args.partitioner, selector=args.selector, infiller=args.infiller,
                    reorderer=args.reorderer, trace=getattr(args, "trace", None), **params)


def _add_flag_params(args: argparse.Namespace, params: dict[str, Any]) -> None:
    """Add the part-parameter flags (``--slot-size`` ...) to ``params``; a key given both ways is refused."""
    for flag, key in FLAG_PARAMS:
        if getattr(args, flag) is not None:
            if key in params:
                raise ConfigError(f"`{key}` is given twice (as an option and as -p {key}=...); keep one.")
            params[key] = getattr(args, flag)


def _chosen_preset(args: argparse.Namespace) -> Any:
    """``--preset NAME`` or the preset read from ``--preset-file FILE`` (not both)."""
    if getattr(args, "preset_file", None) is None:
        return args.preset
    if args.preset is not None:
        raise ConfigError("Give either `--preset` or `--preset-file`, not both.")
    from refusion.config import load_preset

    return load_preset(args.preset_file)


def _prompts(args: argparse.Namespace) -> list[Any]:
    prompts: list[Any] = list(args.prompt)
    if getattr(args, "ids", False):
        try:
            prompts = [[int(t) for t in p.split(",")] for p in prompts]
        except ValueError:
            raise ConfigError(f"`prompt` with --ids must be comma-separated integers; got {args.prompt!r}.") from None
    return prompts


def _result_json(result: Any) -> dict:
    return {
        "text": result.text,
        "tokens": result.tokens.tolist(),
        "forwards": result.forwards,
        "tokens_per_forward": result.tokens_per_forward,
        "iterations": len(result.steps),
        "commit_step": result.commit_step.tolist(),
        "steps": [{"block": s.block, "selected": s.selected, "committed": s.committed, "forwards": s.forwards}
                  for s in result.steps],
    }


def _at_least(flag: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"`{flag}` must be an integer >= {low}; got {value}.")


# -- subcommands ----------------------------------------------------------------
def _generate(args: argparse.Namespace) -> int:
    model = _load(args)
    for result in _decode(args, _prompts(args), model):
        if args.json:
            print(json.dumps(_result_json(result)))
        else:
            print(result.text if result.text is not None else " ".join(map(str, result.tokens.tolist())))
            print(f"[{len(result.tokens)} tokens, {result.forwards} forwards, "
                  f"{result.tokens_per_forward:.2f} tokens/forward, {len(result.steps)} iterations]", file=sys.stderr)
    return 0


def _visualize(args: argparse.Namespace) -> int:
    from refusion.viz.plot import GIF_FORMATS, HTML_FORMATS, check_output_path, render_gif, render_png
    from refusion.viz.html import render_html

    if (args.from_trace is None) == (args.prompt is None):
        raise ConfigError("`refusion visualize` takes either a PROMPT or `--from-trace FILE`, not both or neither.")
    out = args.out or (None if args.gif or args.html else "trace.png")
    if out:
        check_output_path(out, "--out")  # before the model loads or anything is decoded
    if args.gif:
        check_output_path(args.gif, "--gif", GIF_FORMATS)
    if args.html:
        check_output_path(args.html, "--html", HTML_FORMATS)
    if args.from_trace is not None:
        from refusion.measure.trace import read_trace

        results, tokenizer = read_trace(args.from_trace), None
        if not 0 <= args.sequence < len(results):
            raise ConfigError(f"`--sequence` must be in [0, {len(results)}) for this trace; got {args.sequence}.")
        result = results[args.sequence]
    else:
        model = _load(args)
        args.prompt = [args.prompt]
        (result,) = _decode(args, _prompts(args), model)
        tokenizer = model.tokenizer
    written = [str(render_png(result, out, tokenizer=tokenizer))] if out else []
    if args.gif:
        written.append(str(render_gif(result, args.gif, tokenizer=tokenizer)))
    if args.html:
        written.append(str(render_html(result, args.html, tokenizer=tokenizer)))
    if args.json:
        print(json.dumps({"files": written, **_result_json(result)}))
    else:
        print(f"{result.text!r}: {len(result.steps)} iterations, {result.forwards} forwards -> {', '.join(written)}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from refusion.measure.bench import AR_METHOD, run_bench, table
    from refusion.config import load_preset, preset as get_preset
    from refusion.training.tasks import held_out

    if args.cost_model is not None:
        from refusion.measure.costmodel import parse

        parse(args.cost_model)  # before any work
    _at_least("--per-task", args.per_task, 1)
    _at_least("--gen-length", args.gen_length, 1)
    files = [(f"file {f}", load_preset(f)) for f in args.preset_file or ()]  # bad files refused before any work
    names = args.method or ([] if files else ["model", "ar", "fast-dllm"])
    for name in names:  # unknown presets are refused before the model loads
        if name != "model":
            get_preset(name)
    model = _load(args)
    if model.tokenizer is None:
        raise ConfigError("`refusion bench` needs a model with a tokenizer (it decodes the synthetic tasks' text).")
    methods: list[tuple[str, Any]] = [(AR_METHOD, None)] if model.capabilities.causal else []
    chosen_presets = [(name, model.preset if name == "model" and getattr(model, "preset", None) else get_preset(
        "paper" if name == "model" else name)) for name in names]
    for name, chosen in chosen_presets + files:  # every method takes the same --gen-length, checked before AR runs
        decoder = chosen.build()
        try:
            decoder.partition(args.gen_length)
        except ConfigError as exc:
            raise ConfigError(f"method {name!r} cannot decode `--gen-length` {args.gen_length}: {exc}") from None
        methods.append((name, decoder))
    examples = held_out(args.per_task)
    rows = run_bench(model, examples, methods, args.gen_length, progress=not args.json, cost_model=args.cost_model)
    if args.json or args.record:
        from refusion.engines import choose_engine
        from refusion.measure.records import bench_record, environment

        settings = {"per_task": args.per_task, "gen_length": args.gen_length, "methods": names,
                    "preset_files": list(args.preset_file or ()), "cost_model": args.cost_model,
                    "model": model_settings(args)}
        engines = [None if d is None else choose_engine(model, d).name for _, d in methods]
        record = bench_record(rows, [d for _, d in methods], settings, environment(model), engines)
        write_record(record, args.record, args.json)
    if not args.json:
        print(table(rows, rows[0].method, args.cost_model))
    return 0


MODEL_FLAGS = ("model", "device", "dtype", "mask_token_id", "eos_token_id", "adapter", "logit_shift",
               "model_block_length", "trust_remote_code")


def model_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The model options of a command, as a record stores them (``refusion reproduce`` loads the model from them)."""
    return {flag: getattr(args, flag) for flag in MODEL_FLAGS}


def write_record(record: dict, path: str | None, to_stdout: bool) -> None:
    """Print ``record`` as JSON and/or write it to ``path``."""
    text = json.dumps(record)
    if to_stdout:
        print(text)
    if path:
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as exc:
            raise ConfigError(f"`--record` file {path!r} could not be written: {exc}") from exc


def _eval(args: argparse.Namespace) -> int:
    if args.limit is not None:
        _at_least("--limit", args.limit, 1)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ConfigError(f"`--tasks` must name at least one task; got {args.tasks!r}.")
    try:
        from refusion.measure.lmeval import evaluate
    except ImportError as exc:
        raise ConfigError(f"`refusion eval` needs lm-evaluation-harness: pip install 'refusion[eval]' ({exc}).") from None
    try:
        results = evaluate(tasks, model_args=args.model_args, include_path=args.include_path, limit=args.limit)
    except KeyError as exc:  # lm-eval's "not a registered task" and friends
        raise ConfigError(f"`--tasks` {args.tasks!r}: {exc.args[0] if exc.args else exc}") from None
    scores = results["results"]
    print(json.dumps(scores, indent=None if args.json else 2, default=str))
    if args.record:
        write_record(results["refusion_record"], args.record, False)
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from refusion.measure.records import load_record
    from refusion.measure.reproduce import reproduce

    outcome = reproduce(load_record(args.record), progress=not args.json)
    print(json.dumps(outcome.as_dict()) if args.json else outcome.report())
    return 0 if outcome.matches else 1


def _train(args: argparse.Namespace) -> int:
    import attrs
    import torch

    from refusion.inputs import check_output_dir
    from refusion.training.trainer import TrainConfig, train

    for flag, value in (("--threads", args.threads), ("--steps", args.steps), ("--batch-size", args.batch_size)):
        if value is not None:
            _at_least(flag, value, 1)
    check_output_dir(args.out, "--out")  # before 30 minutes of training, not after
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    overrides = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size)) if v is not None}
    config = attrs.evolve(TrainConfig(seed=args.seed), **overrides)
    summary = train(config, args.out, progress=not args.no_progress)
    print(json.dumps({k: summary[k] for k in ("parameters", "train_seconds", "torch_threads", "final_loss")}))
    return 0


def _plugins(args: argparse.Namespace) -> int:
    from refusion.plugins.registry import registry

    rows = [
        {
            "kind": r.kind, "name": r.name, "class": f"{r.cls.__module__}.{r.cls.__qualname__}",
            "source": r.source, "package": r.package, "plugin": r.plugin, "parameters": r.parameters(),
        }
        for r in registry()
    ]
    if args.json:
        print(json.dumps(rows, indent=2, default=repr))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        params = ", ".join(f"{k}={v!r}" for k, v in r["parameters"].items()) or "-"
        print(f"{r['kind']:<13} {r['name']:<{width}}  {r['source']:<12} {r['class']}  ({params})")
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        from refusion.serve import ServeDefaults, serve
    except ImportError as exc:
        raise ConfigError(f"`refusion serve` needs the serve extra: pip install 'refusion[serve]' ({exc}).") from exc
    params = dict(args.param)
    parts = {key: params.pop(key) for key in ("partitioner", "selector", "infiller", "reorderer") if key in params}
    parts.update({key: getattr(args, key) for key in ("partitioner", "selector", "infiller", "reorderer")
                  if getattr(args, key) is not None})
    _add_flag_params(args, params)
    engine = params.pop("engine", None)
    defaults = ServeDefaults(preset=_chosen_preset(args), parts=parts, params=params, gen_length=args.gen_length)
    serve(_load(args), host=args.host, port=args.port, model_name=args.served_model_name or
          (args.model.rstrip("/").rsplit("/", 1)[-1] if args.model else "refusion-default"), defaults=defaults,
          max_rows=args.max_rows, max_batch_tokens=args.max_batch_tokens, max_queue=args.max_queue or None,
          engine=engine, retry_after=args.retry_after, shutdown_timeout=args.shutdown_timeout,
          log_level=args.log_level, torch_threads=args.threads)
    return 0


def _serve_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server on continuous batching",
                           description="Serve the model over OpenAI's /v1/completions and /v1/chat/completions "
                           "(streaming too), /v1/models, /health and /metrics; requests join the running batch "
                           "between steps. The decoding options below are every request's defaults. "
                           "See docs/serving.md.")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--served-model-name", default=None,
                       help="the `model` clients send (default: the checkpoint folder's name, or refusion-default)")
    serve.add_argument("--max-rows", type=int, default=16, help="requests decoding at once (default 16)")
    serve.add_argument("--max-batch-tokens", type=int, default=None,
                       help="positions (prompts plus answers) the live requests may reserve together")
    serve.add_argument("--max-queue", type=int, default=256,
                       help="waiting requests before new ones get 503 with Retry-After (default 256; 0 = unbounded)")
    serve.add_argument("--retry-after", type=int, default=1, help="seconds in Retry-After when the queue is full")
    serve.add_argument("--shutdown-timeout", type=float, default=30.0,
                       help="seconds live streams may take to finish on shutdown before they are cut (default 30)")
    serve.add_argument("--threads", type=int, default=None, help="torch threads")
    serve.add_argument("--log-level", default="info", help="uvicorn log level (default info)")
    _model_options(serve)
    _decoding_options(serve)
    serve.set_defaults(func=_serve)


def _sweep(args: argparse.Namespace) -> int:
    from refusion.search import sweep

    tasks: Any = args.tasks
    options = {k: getattr(args, k) for k in ("limit", "include_path", "metric") if getattr(args, k) is not None}
    if tasks.startswith("lm-eval:"):
        from refusion.search.harness import parse_harness

        tasks = parse_harness(tasks, **options)
    elif options:
        raise ConfigError(f"`--{next(iter(options)).replace('_', '-')}` is for --tasks lm-eval:TASK; got --tasks {tasks}.")
    result = sweep(args.space, tasks, model=_load(args), preset=args.preset, space_file=args.space_file,
                   mode=args.mode, trials=args.trials, minutes=args.minutes, objective=args.objective, out=args.out,
                   storage=args.storage, study=args.study, gen_length=args.gen_length, seed=args.seed,
                   max_accuracy_drop=args.max_accuracy_drop, progress=not args.json, plot=not args.no_plot)
    from refusion.search.outputs import describe_point

    if args.json:
        row = lambda r: {"trial": r.number, "point": r.point, **r.metrics}  # noqa: E731
        print(json.dumps({"mode": result.mode, "trials": len(result.records), "new_trials": result.new_trials,
                          "interrupted": result.interrupted, "ar": result.ar, "front": [row(r) for r in result.front],
                          "chosen": row(result.chosen) if result.chosen else None,
                          "files": {k: str(v) for k, v in result.files.items()}}))
    else:
        print(f"{result.mode} sweep: {len(result.records)} trials in the study ({result.new_trials} new); AR accuracy "
              f"{result.ar['accuracy']:.1%}, {result.ar['forwards']} forwards")
        print(f"{'trial':>5} {'acc':>6} {'forwards':>8} {'tok/fwd':>7} {'fwd ratio':>9} {'speed-up':>8}  point (Pareto front)")
        for r in result.front:
            mark = "*" if r is result.chosen else " "
            print(f"{r.number:>5} {r['accuracy']:>6.1%} {r['forwards']:>8} {r['tokens_per_forward']:>7.2f} "
                  f"{r['forward_ratio']:>8.2f}x {r['speedup']:>7.2f}x {mark}{describe_point(r.point)}")
        print("wrote " + ", ".join(str(v) for v in result.files.values()), file=sys.stderr)
    if result.interrupted:
        print("refusion: interrupted; every finished trial is kept in the storage (run again to resume).",
              file=sys.stderr)
        return 130
    return 0


def _sweep_parser(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="search a space of decoders for the best accuracy/speed trade-offs",
                        description="Evaluate a space of decoders (part names and parameter ranges) on a task set "
                        "against AR on the same prompts; grid search for small spaces, optuna multi-objective search "
                        "(accuracy up, forwards or wall time down) for large ones. Every trial is kept in an SQLite "
                        "file (run again to resume); writes trials.csv, pareto.png and preset.json (use it with "
                        "--preset-file). Needs `pip install refusion[research]`.")
    sw.add_argument("-s", "--space", action="append", default=[], metavar="NAME=VALUES",
                    help="a dimension: part names (selector=threshold,topk), values (slot_size=4,8) or a range "
                    "LOW:HIGH[:STEP] (slot_threshold=0.5:0.9:0.1); repeatable")
    sw.add_argument("--space-file", default=None, metavar="FILE", help="a YAML or TOML file with a `space` table")
    sw.add_argument("--tasks", default="held-out",
                    help="held-out, held-out:N (N per shipped task), a .jsonl file of prompt/answer objects, or "
                    "lm-eval:TASK[,TASK] (lm-evaluation-harness tasks; needs refusion[eval])")
    sw.add_argument("--limit", type=int, default=None, help="with lm-eval tasks: examples per task")
    sw.add_argument("--include-path", default=None, help="with lm-eval tasks: a directory of task YAML files")
    sw.add_argument("--metric", default=None, help="with lm-eval tasks: the metric to maximise (default: the first)")
    sw.add_argument("--preset", default=None, choices=["model", *sorted(PRESETS)],
                    help="the preset the space varies (default: the checkpoint's refusion.json)")
    sw.add_argument("--gen-length", type=int, default=None, help="tokens to generate (default: the preset's)")
    sw.add_argument("--mode", default="auto", choices=("auto", "grid", "optuna"),
                    help="grid, optuna, or auto (grid up to 64 points)")
    sw.add_argument("--trials", type=int, default=None, help="trials in the study, earlier runs included")
    sw.add_argument("--minutes", type=float, default=None, help="time budget of this run")
    sw.add_argument("--objective", default="forwards", choices=("forwards", "wall"),
                    help="what to minimise besides maximising accuracy (wall = seconds per token)")
    sw.add_argument("--out", default="sweep-out", help="output directory (default sweep-out)")
    sw.add_argument("--storage", default=None, help="SQLite file of the trials (default OUT/sweep.db)")
    sw.add_argument("--study", default="refusion-sweep", help="study name inside the storage")
    sw.add_argument("--seed", type=int, default=0, help="seed of optuna's sampler")
    sw.add_argument("--max-accuracy-drop", type=float, default=0.0,
                    help="the chosen preset is the fastest front point within this much of AR's accuracy")
    sw.add_argument("--no-plot", action="store_true", help="skip the PNG")
    sw.add_argument("--json", action="store_true", help="print the front, the chosen point and the files as JSON")
    _model_options(sw)
    sw.set_defaults(func=_sweep)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refusion", description="Plan-and-infill decoding for diffusion LMs (ReFusion).")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode prompts", description="Decode prompts with ReFusion's algorithm "
                         "(or any registered strategy); several prompts are decoded as one batch.")
    gen.add_argument("prompt", nargs="+", help="prompt text (or token ids with --ids)")
    gen.add_argument("--ids", action="store_true", help="the prompts are comma-separated token ids, not text")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt (text, tokens, trace)")
    gen.add_argument("--trace", default=None, metavar="FILE",
                     help="write the standard JSON Lines trace (one record per iteration; docs/trace.md) to FILE")
    _model_options(gen)
    _decoding_options(gen)
    gen.set_defaults(func=_generate)

    vis = sub.add_parser("visualize", help="draw when each position of an answer was committed",
                         description="Decode one prompt and draw its generation region, each token coloured by the "
                         "iteration that committed it (PNG), optionally animated (GIF) or as one HTML page; or draw a "
                         "decode read from a trace file (--from-trace).")
    vis.add_argument("prompt", nargs="?", default=None, help="prompt text (or token ids with --ids)")
    vis.add_argument("--from-trace", default=None, metavar="FILE",
                     help="draw a decode read from a trace file (generate --trace) instead of decoding a prompt")
    vis.add_argument("--sequence", type=int, default=0, help="with --from-trace: which sequence of a batch (default 0)")
    vis.add_argument("--ids", action="store_true", help="the prompt is comma-separated token ids")
    vis.add_argument("--out", default=None, help="PNG file to write (default: trace.png unless --gif/--html is given)")
    vis.add_argument("--gif", default=None, help="also write an animated GIF, one frame per iteration")
    vis.add_argument("--html", default=None, metavar="FILE",
                     help="also write one self-contained HTML page: the grid, a slider over iterations, the trace table")
    vis.add_argument("--trace", default=None, metavar="FILE", help="also write the decode's JSON Lines trace to FILE")
    vis.add_argument("--json", action="store_true", help="print the written files and the trace as JSON")
    _model_options(vis)
    _decoding_options(vis)
    vis.set_defaults(func=_visualize)

    bench = sub.add_parser("bench", help="accuracy and speed on the synthetic held-out tasks",
                           description="Decode the synthetic held-out tasks with AR (transformers generate) and the "
                           "named presets ('model' = the checkpoint's refusion.json); print accuracy, forwards, "
                           "tokens per forward, wall time and ratios to AR.")
    bench.add_argument("--per-task", type=int, default=10, help="held-out examples per task (default 10)")
    bench.add_argument("--method", action="append", default=None, metavar="PRESET",
                       help="a preset to measure (repeatable; default: model, ar, fast-dllm)")
    bench.add_argument("--preset-file", action="append", default=None, metavar="FILE",
                       help="also measure the preset in this JSON file, e.g. a sweep's preset.json (repeatable)")
    bench.add_argument("--gen-length", type=int, default=32, help="tokens to generate per prompt (default 32)")
    bench.add_argument("--json", action="store_true",
                       help="print a reproducible record as JSON: rows, outputs, environment, decoder specs")
    bench.add_argument("--record", default=None, metavar="FILE",
                       help="also write the record to FILE (re-run it with `refusion reproduce FILE`)")
    bench.add_argument("--cost-model", default=None, metavar="MODEL@GPU",
                       help="also estimate tokens/s of the same forwards on a GPU at a model size, e.g. qwen3-8b@h100 "
                       "(roofline; see refusion/costmodel.py)")
    _model_options(bench)
    bench.set_defaults(func=_bench)

    ev = sub.add_parser("eval", help="run lm-evaluation-harness tasks with a refusion strategy",
                        description="Run EleutherAI lm-evaluation-harness tasks with the `refusion` model type "
                        "(needs `pip install refusion[eval]`).")
    ev.add_argument("--tasks", required=True, help="comma-separated task names")
    ev.add_argument("--model-args", default="", help="e.g. pretrained=DIR,preset=gsm8k,selector=topk,k=2")
    ev.add_argument("--include-path", default=None, help="directory with extra task YAML files")
    ev.add_argument("--limit", type=int, default=None, help="examples per task")
    ev.add_argument("--json", action="store_true", help="compact JSON")
    ev.add_argument("--record", default=None, metavar="FILE",
                    help="write the run's reproducible record (environment, decoder spec, settings) to FILE")
    ev.set_defaults(func=_eval)

    rep = sub.add_parser("reproduce", help="re-run a bench or eval record and compare numbers and tokens",
                         description="Re-run the run a record describes (`bench --record FILE`, `eval --record FILE`) "
                         "with its decoder specs, settings and thread count; report what differs and what changed in "
                         "the environment. Exit status 0 when every number and token matches, 1 otherwise.")
    rep.add_argument("record", help="record file (JSON)")
    rep.add_argument("--json", action="store_true", help="print the comparison as JSON")
    rep.set_defaults(func=_reproduce)

    train = sub.add_parser(
        "train", help="train a small ReFusion model on the synthetic tasks (CPU)",
        description="Train the Qwen3-architecture ReFusion model that ships with refusion (defaults reproduce it).",
    )
    train.add_argument("--out", required=True, help="output directory (weights, config, tokenizer)")
    train.add_argument("--seed", type=int, default=0, help="seed of the data, masks and initial weights")
    train.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the shipped model's)")
    train.add_argument("--batch-size", type=int, default=None, help="examples per step")
    train.add_argument("--threads", type=int, default=None, help="torch threads (weights are reproducible per count)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.set_defaults(func=_train)

    _sweep_parser(sub)

    plugins = sub.add_parser("plugins", help="list registered strategies and model adapters",
                             description="List every registered part: kind, name, source (built-in or package), "
                             "class and parameters with defaults.")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(func=_plugins)
    _serve_parser(sub)
    for command in sub.choices.values():  # `refusion generate ... --debug` works too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of a failure")
    return parser


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings are printed as one line, ``refusion: note: ...`` (no file and line)."""
    print(f"refusion: note: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Bad input (argparse errors, :class:`RefusionError`, :class:`OSError`) gives
    ``refusion: error: ...`` on stderr and status 2; any other failure status 1
    with the exception's one-line summary. ``--debug`` re-raises instead, with
    the traceback.
    """
    import warnings

    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False)
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _note
        try:
            return args.func(args)
        except KeyboardInterrupt:
            print("refusion: interrupted", file=sys.stderr)
            return 130
        except (RefusionError, OSError) as exc:
            if debug:
                raise
            print(f"refusion: error: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:
            if debug:
                raise
            print(f"refusion: error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
            return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
