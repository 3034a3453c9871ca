"""``refusion generate`` and ``refusion visualize``: decode prompts, draw a decode."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from refusion.cli.options import (
    add_decoding_options,
    add_model_options,
    add_prompt_options,
    check_decoding,
    decode,
    integer,
    load,
    prompts,
)
from refusion.errors import ConfigError
from refusion.wording import counted


def result_json(result: Any) -> dict:
    """A decode's result as the ``--json`` output prints it."""
    return {
        "text": result.text,
        "tokens": result.tokens.tolist(),
        "forwards": result.forwards,
        "tokens_per_forward": result.tokens_per_forward,
        "iterations": result.num_iterations,
        "commit_step": result.commit_step.tolist(),
        "steps": [
            {"block": s.block, "selected": s.selected, "committed": s.committed, "forwards": s.forwards}
            for s in result.iterations
        ],
    }


def run_generate(args: argparse.Namespace) -> int:
    texts = prompts(args)
    check_decoding(args)  # a bad part, parameter or length before the model loads
    model = load(args)
    for result in decode(args, texts, model, record=args.json):
        if args.json:
            print(json.dumps(result_json(result)))
        else:
            print(result.text if result.text is not None else " ".join(map(str, result.tokens.tolist())))
            print(
                f"[{counted(len(result.tokens), 'token')}, {counted(result.forwards, 'forward')}, "
                f"{result.tokens_per_forward:.2f} tokens/forward, {counted(result.num_iterations, 'iteration')}]",
                file=sys.stderr,
            )
    return 0


def run_visualize(args: argparse.Namespace) -> int:
    from refusion.viz.html import render_html
    from refusion.viz.plot import GIF_FORMATS, HTML_FORMATS, check_output_path, render_gif, render_png

    if (args.from_trace is None) == (args.prompt is None):
        raise ConfigError(
            "`refusion visualize` takes either a PROMPT or `--from-trace FILE`, not both or neither.", param="prompt"
        )
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
            raise ConfigError(
                f"`--sequence` must be in [0, {len(results)}) for this trace; got {args.sequence}.", param="--sequence"
            )
        result = results[args.sequence]
    else:
        check_decoding(args)
        model = load(args)
        args.prompt = [args.prompt]
        (result,) = decode(args, prompts(args), model, record=True)
        tokenizer = model.tokenizer
    written = [str(render_png(result, out, tokenizer=tokenizer))] if out else []
    if args.gif:
        written.append(str(render_gif(result, args.gif, tokenizer=tokenizer)))
    if args.html:
        written.append(str(render_html(result, args.html, tokenizer=tokenizer)))
    if args.json:
        print(json.dumps({"files": written, **result_json(result)}))
    else:
        print(
            f"{result.text!r}: {counted(result.num_iterations, 'iteration')}, {counted(result.forwards, 'forward')} "
            f"-> {', '.join(written)}"
        )
    return 0


def add_parsers(sub: Any) -> None:
    gen = sub.add_parser(
        "generate",
        help="decode prompts",
        description="Decode prompts with ReFusion's algorithm "
        "(or any registered strategy); several prompts are decoded as one batch.",
    )
    gen.add_argument("prompt", nargs="+", help="prompt text (or token ids with --ids)")
    add_prompt_options(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt (text, tokens, trace)")
    gen.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help="write the standard JSON Lines trace (one record per iteration; docs/trace.md) to FILE",
    )
    add_model_options(gen)
    add_decoding_options(gen)
    gen.set_defaults(func=run_generate)

    vis = sub.add_parser(
        "visualize",
        help="draw when each position of an answer was committed",
        description="Decode one prompt and draw its generation region, each token coloured by the "
        "iteration that committed it (PNG), optionally animated (GIF) or as one HTML page; or draw a "
        "decode read from a trace file (--from-trace).",
    )
    vis.add_argument("prompt", nargs="?", default=None, help="prompt text (or token ids with --ids)")
    vis.add_argument(
        "--from-trace",
        default=None,
        metavar="FILE",
        help="draw a decode read from a trace file (generate --trace) instead of decoding a prompt",
    )
    vis.add_argument(
        "--sequence", type=integer(0), default=0, help="with --from-trace: which sequence of a batch (default 0)"
    )
    add_prompt_options(vis)
    vis.add_argument("--out", default=None, help="PNG file to write (default: trace.png unless --gif/--html is given)")
    vis.add_argument("--gif", default=None, help="also write an animated GIF, one frame per iteration")
    vis.add_argument(
        "--html",
        default=None,
        metavar="FILE",
        help="also write one self-contained HTML page: the grid, a slider over iterations, the trace table",
    )
    vis.add_argument("--trace", default=None, metavar="FILE", help="also write the decode's JSON Lines trace to FILE")
    vis.add_argument("--json", action="store_true", help="print the written files and the trace as JSON")
    add_model_options(vis)
    add_decoding_options(vis)
    vis.set_defaults(func=run_visualize)
