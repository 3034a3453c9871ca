"""Requests with different decoders submitted together share forwards: 12 requests, 4 decoders, one Generator.

On the shipped model, 12 held-out prompts, each request with one of four decoders (the model's preset, ``topk``
with k=2, sampling at temperature 0.8, the lossless ``leftmost`` + ``greedy-verify``), submitted together to one
:class:`~refusion.generator.Generator`: the engine's forwards against the longest request alone (goal: at most
1.25x) and against the sum of the requests alone; CPU time of the 12 together against one by one, interleaved round
by round; the tokens must be each request's alone.

    python benchmarks/mixed_decoders.py --rounds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, header, interleave

DECODERS = [
    {},
    {"selector": "topk", "k": 2},
    {"temperature": 0.8, "seed": 3},
    {"selector": "leftmost", "infiller": "greedy-verify"},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import refusion
    from refusion.training.tasks import held_out

    model = refusion.load_model(None, dtype="float32")
    prompts = [e.prompt for e in held_out(args.requests // 6 + 1)][: args.requests]
    jobs = [(p, DECODERS[i % len(DECODERS)]) for i, p in enumerate(prompts)]

    def alone() -> dict:
        results = [refusion.generate(p, model, **options) for p, options in jobs]
        return {"forwards": [r.forwards for r in results], "rows": [r.tokens.tolist() for r in results]}

    def together() -> dict:
        generator = refusion.Generator(model, max_rows=len(jobs))
        requests = [generator.submit(p, **options) for p, options in jobs]
        generator.run_until_idle()
        results = [r.wait() for r in requests]
        return {"forwards": generator.engine.counters.forwards, "rows": [r.tokens.tolist() for r in results]}

    rows = interleave({"one by one": alone, "together": together}, model, rounds=args.rounds, memory=False)
    one, both = rows
    each, shared = one.counts["forwards"], both.counts["forwards"]
    print(header())
    print(f"# {len(jobs)} requests, {len(DECODERS)} decoders, the shipped model, gen_length 32")
    print()
    print(
        "| forwards: sum alone / longest alone / together | together / longest | CPU s one by one | CPU s together "
        "| CPU alone / together | same tokens |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    print(
        f"| {sum(each)} / {max(each)} / {shared} | {shared / max(each):.2f}x | {fmt_spread(one, 'cpu')} "
        f"| {fmt_spread(both, 'cpu')} | {fmt_ratio(both)} | {one.counts['rows'] == both.counts['rows']} |"
    )


if __name__ == "__main__":
    main()
