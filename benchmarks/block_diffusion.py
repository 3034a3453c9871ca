"""Block-diffusion decoding with the exact cache of finished blocks against recomputing everything.

Run:  python benchmarks/block_diffusion.py [--rounds 3] [--out benchmarks/results]

A random block-diffusion Qwen3 (``refusion.models.block.tiny_block_diffusion``,
float32; no trained block model ships, so no accuracy column), 4 prompts of
24 tokens, 64 new tokens in blocks of 16, 1 torch thread. For each selector
the ``block`` engine and ``block-recompute`` run interleaved round by round
(benchmarks/common.py); both give the same tokens (checked). Rows: forwards,
tokens fed per forward, tokens generated per forward, CPU seconds (median
[min-max]) and the CPU-time ratio to recompute, per round. Writes
``block_diffusion.csv``.

The last rows run Fast-dLLM v2's decoder (selector ``fast-dllm-v2``: sub-blocks,
a block's first position by argmax from the block before) on the same random
network made token-shifted (``logit_shift=1``, blocks from position 0, as
Fast-dLLM v2 checkpoints), against its one-position-a-step setting
(``threshold`` 1, the authors' default), and with its sub-block cache
(``sub-block-cache``: a step inside a sub-block feeds that sub-block alone;
an approximation, so its tokens are not checked against recomputing).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import fmt_ratio, fmt_spread, header, interleave, refusion_counts

from refusion.decoding.decoder import Decoder
from refusion.models.block import tiny_block_diffusion

BLOCK, GEN = 16, 64
SELECTORS = {
    "threshold 0.3": dict(selector="threshold", slot_threshold=0.3),
    "topk 2": dict(selector="topk", k=2),
    "llada-steps 32 (2/step)": dict(selector="llada-steps", steps=32),
}
#: Fast-dLLM v2 on the token-shifted twin (blocks from position 0: ``align="absolute"``)
SHIFTED = {
    "fast-dllm-v2 threshold 1 (1/step)": dict(selector="fast-dllm-v2", threshold=1.0, small_block_size=BLOCK),
    "fast-dllm-v2 sub-blocks 4, threshold 0.3": dict(selector="fast-dllm-v2", threshold=0.3, small_block_size=4),
    "fast-dllm-v2 sub-blocks 8, threshold 0.1": dict(selector="fast-dllm-v2", threshold=0.1, small_block_size=8),
    "fast-dllm-v2 sub-blocks 4, threshold 1": dict(selector="fast-dllm-v2", threshold=1.0, small_block_size=4),
    "fast-dllm-v2 sub-blocks 4, threshold 1, sub-block cache": dict(
        selector="fast-dllm-v2", threshold=1.0, small_block_size=4, reorderer="sub-block-cache"
    ),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    network = dict(
        block_length=BLOCK,
        vocab_size=512,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        dtype=torch.float32,
        logit_scale=8.0,
        seed=0,
    )
    plain = tiny_block_diffusion(**network)
    shifted = tiny_block_diffusion(**network, layout="absolute", logit_shift=1)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 500, (24,), generator=generator).tolist() for _ in range(4)]
    print(header())
    print("| selector | engine | forwards | fed/forward | tokens/forward | CPU s | CPU ratio vs recompute |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    rows_out = []
    runs = [(label, params, plain) for label, params in SELECTORS.items()]
    runs += [(label, {**params, "align": "absolute", "slot_size": 1}, shifted) for label, params in SHIFTED.items()]
    for label, params, model in runs:
        decoder = Decoder.from_names(partitioner="semi-ar", infiller="draft", block_length=BLOCK, **params)
        competitors = {
            engine: (lambda e=engine, d=decoder, m=model: refusion_counts(d.decode_batch(m, prompts, GEN, engine=e)))
            for engine in ("block-recompute", "block")
        }
        rows = interleave(competitors, model, rounds=args.rounds, baseline="block-recompute", memory=False)
        if params.get("reorderer") != "sub-block-cache" and rows[0].counts["rows"] != rows[1].counts["rows"]:
            raise SystemExit(f"{label}: the cached and recomputed decodes differ")
        for row in rows:
            c = row.counts
            print(
                f"| {label} | {row.name} | {c['forwards']} | {c['fed'] / c['forwards']:.1f} | "
                f"{c['tokens'] / c['forwards']:.2f} | {fmt_spread(row, 'cpu')} | {fmt_ratio(row)} |"
            )
            rows_out.append(
                [
                    label,
                    row.name,
                    c["forwards"],
                    f"{c['fed'] / c['forwards']:.2f}",
                    f"{c['tokens'] / c['forwards']:.3f}",
                    f"{row.median('cpu'):.3f}",
                    f"{statistics.median(row.ratios):.3f}",
                ]
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "block_diffusion.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "selector",
                "engine",
                "forwards",
                "fed_per_forward",
                "tokens_per_forward",
                "cpu_s",
                "cpu_ratio_vs_recompute",
            ]
        )
        writer.writerows(rows_out)
    print(f"\nwrote {out / 'block_diffusion.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
