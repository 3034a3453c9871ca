"""Every family batches: 8 prompts of different lengths decoded one by one, then together, with the family's preset.

For each tiny checkpoint under ``tests/fixtures/peers`` (built by the authors' own classes), in the family's default
preset, as a new user would call it (``refusion.generate(prompts, model)``): the forwards of the eight prompts
decoded alone (their sum and the longest), the forwards of the batch, and CPU and wall time of both, interleaved
round by round (the goal: the batch takes at most 1.25x the longest member's forwards and at least 3x less CPU
than one by one); the tokens must be the same both ways.

    python benchmarks/family_batching.py --rounds 3 [--families llada,dream] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import fmt_ratio, fmt_spread, header, interleave  # noqa: E402

FIXTURES = HERE.parent / "tests" / "fixtures" / "peers"
FAMILIES = ("refusion", "llada", "dream", "sdar", "llada2", "diffusion_gemma")
PROMPTS = ["a", "hello", "rev abc", "copy xyzw", "the quick fox", "count 1 2 3 4", "sort dcba hgfe", "a b c d e f g h"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import refusion

    print(header())
    print(f"# 8 prompts of {min(map(len, PROMPTS))}-{max(map(len, PROMPTS))} characters, each family's preset")
    print()
    print(
        "| family | engine | forwards: 8 alone (sum) / longest alone / the batch | batch / longest | CPU s one by one "
        "| CPU s together | CPU alone / batch | wall alone / batch | same tokens |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for family in args.families.split(","):
        model = refusion.load_model(str(FIXTURES / family), dtype=args.dtype)

        def alone(model=model) -> dict:
            results = [refusion.generate(p, model) for p in PROMPTS]
            return {
                "forwards": [r.forwards for r in results],
                "rows": [r.tokens.tolist() for r in results],
                "engine": results[0].engine,
            }

        def together(model=model) -> dict:
            results = refusion.generate(PROMPTS, model)
            return {"forwards": results[0].engine_totals["forwards"], "rows": [r.tokens.tolist() for r in results]}

        rows = interleave({"one by one": alone, "together": together}, model, rounds=args.rounds, memory=False)
        one, both = rows
        each = one.counts["forwards"]
        batch = both.counts["forwards"]
        wall = statistics.median(a.wall / b.wall for a, b in zip(one.runs, both.runs))
        print(
            f"| {family} | {one.counts['engine']} | {sum(each)} / {max(each)} / {batch} | {batch / max(each):.2f}x "
            f"| {fmt_spread(one, 'cpu')} | {fmt_spread(both, 'cpu')} | {fmt_ratio(both)} | {wall:.2f}x "
            f"| {one.counts['rows'] == both.counts['rows']} |"
        )


if __name__ == "__main__":
    main()
