"""Cache policies on a bidirectional model: dKV-Cache's delayed cache against recomputing the whole canvas.

A random LLaDA-style (bidirectional, logit shift 0) Qwen3 of ``--hidden`` width and ``--layers`` layers, in
float32, 1 torch thread; 8 prompts of 4-11 tokens decoded together with LLaDA's semi-AR schedule (the ``dkv``
preset's parts: blocks of 32, one token per step, float64 confidences), gen 128: reorderer ``no-cache`` (every
forward feeds the whole canvas) against ``dkv`` refreshing every 2, 4 and 8 steps (``cache_reloading_step``),
interleaved round by round. Reports CPU and wall time (medians [min-max]), the ratio to ``no-cache`` in the same
round, forwards, tokens fed per forward, and how many of the 8 answers equal ``no-cache``'s (a random network's
answers move with any approximation; on a trained one dKV-Cache reports small accuracy changes).

    python benchmarks/cache_policies.py --rounds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, header, interleave

PROMPTS = [
    [5, 6, 7, 8],
    [9, 10, 11, 12, 13],
    [14, 15, 16],
    [17, 18, 19, 20, 21, 22],
    [23, 24],
    [25, 26, 27, 28, 29, 30],
    [31, 32, 33, 34, 35, 36, 37],
    [38, 39, 40, 41, 42, 43, 44, 45, 46],
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--gen", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import refusion
    from refusion.models.mdm import tiny_bidirectional

    model = tiny_bidirectional(
        vocab_size=512,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=8,
        num_kv_heads=8,
        max_positions=1024,
        dtype=torch.float32,
        logit_scale=4.0,
    )
    common = dict(preset="dkv", gen_length=args.gen, block_length=32, steps=args.gen)
    answers: dict[str, list] = {}

    def competitor(name: str, **options):
        def run() -> dict:
            results = refusion.generate(PROMPTS, model, **common, **options)
            answers[name] = [r.region_tokens for r in results]
            return {"fed": sum(r.fed_tokens for r in results)}

        return run

    competitors = {"no-cache": competitor("no-cache", enable_cache=False)}
    for k in (2, 4, 8):
        competitors[f"dkv, refresh every {k}"] = competitor(f"dkv{k}", cache_reloading_step=k)
    rows = interleave(competitors, model, rounds=args.rounds, memory=False)
    print(header())
    print(
        f"# random bidirectional Qwen3, hidden {args.hidden}, {args.layers} layers, vocab 512, float32; 8 prompts "
        f"together, gen {args.gen}, blocks of 32, 1 token/step"
    )
    print()
    print("| policy | CPU s | wall s | CPU vs no-cache | forwards | fed tokens / forward | answers = no-cache's |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row, name in zip(rows, ["no-cache", "dkv2", "dkv4", "dkv8"]):
        forwards = row.median("network_forwards")
        same = sum(a == b for a, b in zip(answers[name], answers["no-cache"]))
        print(
            f"| {row.name} | {fmt_spread(row, 'cpu')} | {fmt_spread(row, 'wall')} | {fmt_ratio(row)} | "
            f"{forwards:.0f} | {row.counts['fed'] / max(forwards, 1):.1f} | {same}/8 |"
        )


if __name__ == "__main__":
    main()
