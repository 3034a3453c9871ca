"""``refusion batch``: generate for every row of a JSON Lines file, resumably, in one process or on Ray."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from refusion.cli.options import (
    add_decoding_options,
    add_kv_cache_options,
    add_model_options,
    add_trust_options,
    chosen_preset,
    decoding_params,
    integer,
    model_settings,
    number,
)
from refusion.config import PART_KINDS
from refusion.limits import DEFAULT_MAX_ROWS
from refusion.wording import counted

#: run_batch()'s keywords spelled as this command's flags (errors name the flag)
FLAGS = {
    "input": "INPUT",
    "out": "--out",
    "max_rows": "--max-rows",
    "max_batch_tokens": "--max-batch-tokens",
    "workers": "--workers",
    "gpus_per_worker": "--gpus-per-worker",
    "cpus_per_worker": "--cpus-per-worker",
    "gen_length": "--gen-length",
    "prefix_cache": "--no-prefix-cache",
    "kv_memory": "--kv-memory",
}


def run_batch_command(args: argparse.Namespace) -> int:
    from refusion.batch.embedded import run_batch

    params = decoding_params(args)
    parts = {kind: getattr(args, kind) for kind in PART_KINDS if getattr(args, kind) is not None}
    summary = run_batch(
        args.input,
        args.out,
        model=model_settings(args),
        ray=args.ray,
        workers=args.workers,
        gpus_per_worker=args.gpus_per_worker,
        cpus_per_worker=args.cpus_per_worker,
        max_rows=args.max_rows,
        max_batch_tokens=args.max_batch_tokens,
        prefix_cache=args.prefix_cache,
        kv_memory=args.kv_memory,
        allow_imports=args.allow_imports,
        progress=args.progress,
        names=FLAGS,
        preset=chosen_preset(args),
        gen_length=args.gen_length,
        chat=args.chat,
        allow_special=args.allow_special_tokens,
        **parts,
        **params,
    )
    record = {
        "out": args.out,
        "rows": summary.rows,
        "skipped": summary.skipped,
        "errors": summary.errors,
        "tokens": summary.tokens,
        "seconds": round(summary.seconds, 3),
        "load_seconds": round(summary.load_seconds, 3),
        "tokens_per_second": round(summary.tokens_per_second, 2),
    }
    if args.json:
        print(json.dumps(record))
    else:
        loading = f", {summary.load_seconds:.1f} s of them loading the model" if summary.load_seconds else ""
        print(
            f"{counted(summary.rows, 'row')} written to {args.out} ({counted(summary.errors, 'error')}, "
            f"{summary.skipped} already there), {counted(summary.tokens, 'token')} in {summary.seconds:.1f} s"
            f"{loading}; {summary.tokens_per_second:.1f} tokens/s while generating",
            file=sys.stderr,
        )
    return 0


def add_parsers(sub: Any) -> None:
    batch = sub.add_parser(
        "batch",
        help="generate for every row of a JSON Lines file (resumable; --ray for Ray Data)",
        description="Generate for every row of INPUT, a JSON Lines file of requests: `id` (unique), `prompt` (text or "
        "token ids) or chat `messages`, optionally `gen_length`, `seed`, `preset`, part names, `params` and sampling "
        "(`temperature`, `top_k`, `top_p`). Results are appended to OUTPUT as they finish (`id`, `text`, `tokens`, "
        "`forwards`, `tokens_per_forward`, `error`); a bad row becomes an error row naming the field and the run goes "
        "on. A rerun skips the ids already in OUTPUT, so an interrupted run resumes. The decoding options below are "
        "every row's defaults; a row's own fields override them. See docs/scaling.md.",
    )
    batch.add_argument("input", metavar="INPUT", help="JSON Lines file, one request per line")
    batch.add_argument(
        "--out",
        required=True,
        metavar="OUTPUT",
        help="JSON Lines file the results are appended to (created if missing; its ids are skipped)",
    )
    batch.add_argument(
        "--max-rows",
        type=integer(1),
        default=DEFAULT_MAX_ROWS,
        help=f"rows decoding at once per worker (default {DEFAULT_MAX_ROWS})",
    )
    batch.add_argument(
        "--max-batch-tokens",
        type=integer(1),
        default=8192,
        help="positions (prompts plus answers) the live rows may reserve together (default 8192)",
    )
    add_kv_cache_options(batch, what="rows")
    add_trust_options(batch, what="rows")
    batch.add_argument(
        "--no-progress", dest="progress", action="store_false", default=True, help="no progress bar on stderr"
    )
    batch.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    ray = batch.add_argument_group('Ray (pip install "refusion[ray]"; see docs/scaling.md)')
    ray.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="run the rows on Ray Data: a local Ray without ADDRESS, else the cluster at ADDRESS "
        "(e.g. ray://head:10001 or auto)",
    )
    ray.add_argument(
        "--workers", type=integer(1), default=1, help="with --ray: actors, each with its own model (default 1)"
    )
    ray.add_argument("--gpus-per-worker", type=number(0), default=0, help="with --ray: GPUs per actor (default 0)")
    ray.add_argument(
        "--cpus-per-worker", type=number(0, low_open=True), default=1, help="with --ray: CPUs per actor (default 1)"
    )
    add_model_options(batch)
    add_decoding_options(batch)
    batch.set_defaults(func=run_batch_command)
