"""Cache policies on a bidirectional model: dKV-Cache's delayed cache, d3LLM's delayed, periodically refreshed
prefix cache and D2F's exact cache of finished block-causal blocks, each against recomputing the whole canvas.

A random LLaDA-style (bidirectional, logit shift 0) Qwen3 of ``--hidden`` width and ``--layers`` layers, in
float32, 1 torch thread; 8 prompts of 2-9 tokens decoded together, gen 128, two groups, each interleaved round by
round with its own baseline:

* ``dkv``: LLaDA's semi-AR schedule (the ``dkv`` preset's parts: blocks of 32, one token per step, float64
  confidences): reorderer ``no-cache`` against ``dkv`` refreshing every 2, 4 and 8 steps (``cache_reloading_step``);
* ``d3llm``: d3LLM's multi-block decoding (the ``d3llm`` preset: blocks of 32 in flight, entropy threshold
  ``--entropy``), no cache, against the ``d3llm-kv`` preset's ``periodic`` reorderer at d3LLM's published
  settings (delay 2 / refresh every 4, delay 1 / no periodic refresh) and with no delay;
* ``d2f``: D2F's pipelined blocks (the ``d2f`` preset: blocks of 32 attending block-causally, the authors' LLaDA
  HumanEval thresholds) with the whole canvas fed every forward (``cache_finished=False``) against finished blocks
  cached (exact: the answers must be equal).

Reports CPU and wall time (medians [min-max]), the ratio to the group's baseline in the same round, forwards,
tokens fed per forward, and how many of the 8 answers equal the baseline's (a random network's answers move with
any approximation; on trained ones both papers report small accuracy changes).

    python benchmarks/cache_policies.py --rounds 3 [--only dkv|d3llm|d2f]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, header, interleave

import refusion

GROUPS = ("dkv", "d3llm", "d2f")
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


def competitors_of(group: str, model, gen: int, entropy: float, answers: dict) -> dict:
    """The group's competitors, its baseline first: name -> a callable decoding the 8 prompts."""

    def competitor(name: str, **options):
        def run() -> dict:
            results = refusion.generate(PROMPTS, model, gen_length=gen, **options)
            answers[name] = [r.region_tokens for r in results]
            return {"fed": sum(r.fed_tokens for r in results), "tokens": sum(len(r.region_tokens) for r in results)}

        return run

    if group == "dkv":
        llada = dict(preset="dkv", block_length=32, steps=gen)
        found = {"no-cache": competitor("no-cache", **llada, enable_cache=False)}
        for k in (2, 4, 8):
            found[f"dkv, refresh every {k}"] = competitor(f"dkv, refresh every {k}", **llada, cache_reloading_step=k)
        return found
    if group == "d2f":
        d2f = dict(preset="d2f", block_size=32)
        return {
            "d2f, whole canvas": competitor("d2f, whole canvas", **d2f, cache_finished=False),
            "d2f, finished blocks cached": competitor("d2f, finished blocks cached", **d2f),
        }
    d3llm = dict(block_size=32, threshold=entropy)
    found = {"d3llm, no cache": competitor("d3llm, no cache", preset="d3llm", **d3llm)}
    for delay, refresh in ((2, 4), (1, 10000), (0, 10000)):
        name = f"d3llm-kv, delay {delay}, " + (f"refresh every {refresh}" if refresh < 10000 else "no refresh")
        found[name] = competitor(name, preset="d3llm-kv", **d3llm, cache_delay_iter=delay, refresh_interval=refresh)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--entropy", type=float, default=0.5, help="d3LLM's entropy threshold (nats)")
    parser.add_argument("--only", choices=GROUPS, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
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
    print(header())
    print(
        f"# random bidirectional Qwen3, hidden {args.hidden}, {args.layers} layers, vocab 512, float32; 8 prompts "
        f"together, gen {args.gen}"
    )
    for group in GROUPS if args.only is None else (args.only,):
        answers: dict[str, list] = {}
        competitors = competitors_of(group, model, args.gen, args.entropy, answers)
        rows = interleave(competitors, model, rounds=args.rounds, memory=False)
        baseline = next(iter(competitors))
        print()
        print(
            f"| policy | CPU s | wall s | CPU vs {baseline} | forwards | fed tokens / forward | tokens / forward "
            f"| answers = {baseline}'s |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for row in rows:
            forwards = row.median("network_forwards")
            same = sum(a == b for a, b in zip(answers[row.name], answers[baseline]))
            print(
                f"| {row.name} | {fmt_spread(row, 'cpu')} | {fmt_spread(row, 'wall')} | {fmt_ratio(row)} | "
                f"{forwards:.0f} | {row.counts['fed'] / max(forwards, 1):.1f} | "
                f"{row.counts['tokens'] / max(forwards, 1):.2f} | {same}/8 |"
            )


if __name__ == "__main__":
    main()
