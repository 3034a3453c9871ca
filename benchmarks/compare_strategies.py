"""Decoding strategies of the field side by side on the shipped model and its held-out tasks.

Run:  python benchmarks/compare_strategies.py [--per-task 30] [--out benchmarks/results]

One run, same weights, same 180 held-out prompts, batch 1, warm-up first:
greedy AR (transformers ``generate``), LLaDA-style masked diffusion (semi-AR
blocks, fixed tokens per step or LLaDA's step schedule, no cache), Dream's
timestep schedule over one block, Fast-dLLM confidence-threshold and
factor-based parallel decoding (exact prefix cache, since the model is
causal), CreditDecoding (``credit``, arXiv 2510.06133: the threshold rule on
logits fused with each position's decaying credit), d3LLM's multi-block
decoding (``d3llm``, arXiv 2601.07568: several blocks in flight, an entropy
threshold across them), the EB-sampler
(``entropy-bound``, arXiv 2505.24857), and ReFusion.
``--only EB,threshold`` runs a subset (AR always). Prints a table, writes ``compare_strategies.csv`` and
``compare_strategies.png`` (accuracy against wall-time speed-up over AR).

Block-diffusion decoding needs a block-causal model, which the shipped model
is not and no trained one ships: the run ends with the rows of
``benchmarks/block_diffusion.py`` (a random block-diffusion Qwen3, exact block
cache against recomputing, counts and CPU time; ``--no-block`` skips them).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

from refusion.api import load_model
from refusion.decoding.decoder import Decoder
from refusion.measure.bench import ar_method, decoder_method, measure, table
from refusion.training.tasks import held_out

GEN_LENGTH = 32
MDM = dict(partitioner="semi-ar", infiller="draft", slot_size=1)
#: one block over the whole answer, recomputed at every step (Dream's schedule, d3LLM's blocks in flight)
CANVAS = dict(partitioner="fixed", infiller="draft", slot_size=1, serial_num_blocks=1, reorderer="no-cache")

METHODS = {
    "LLaDA low-confidence, block 8, 1 tok/step, no cache": dict(
        MDM, selector="topk", k=1, block_length=8, reorderer="no-cache"
    ),
    "LLaDA low-confidence, block 8, 2 tok/step, no cache": dict(
        MDM, selector="topk", k=2, block_length=8, reorderer="no-cache"
    ),
    "LLaDA random, block 8, 1 tok/step, no cache": dict(
        MDM, selector="random", k=1, block_length=8, reorderer="no-cache"
    ),
    "LLaDA steps schedule, block 8, 16 steps (2 tok/step), no cache": dict(
        MDM, selector="llada-steps", steps=16, block_length=8, reorderer="no-cache"
    ),
    "LLaDA steps schedule, block 8, 12 steps (3,3,2 tok/step), no cache": dict(
        MDM, selector="llada-steps", steps=12, block_length=8, reorderer="no-cache"
    ),
    "Dream entropy schedule, 16 steps, one block, no cache": dict(
        CANVAS, selector="dream-steps", steps=16, alg="entropy"
    ),
    "Fast-dLLM threshold 0.9, block 8, prefix cache": dict(
        MDM, selector="threshold", slot_threshold=0.9, block_length=8
    ),
    "Fast-dLLM threshold 0.7, block 32, prefix cache": dict(
        MDM, selector="threshold", slot_threshold=0.7, block_length=32
    ),
    "Fast-dLLM factor 1.0, block 8, prefix cache": dict(MDM, selector="factor", factor=1.0, block_length=8),
    "CreditDecoding threshold 0.9, block 8, prefix cache": dict(MDM, selector="credit", threshold=0.9, block_length=8),
    "CreditDecoding threshold 0.7, block 32, prefix cache": dict(
        MDM, selector="credit", threshold=0.7, block_length=32
    ),
    "entropy top-1, block 8, prefix cache": dict(MDM, selector="entropy", k=1, block_length=8),
    "d3LLM multi-block, entropy 0.5, blocks of 8, no cache": dict(
        CANVAS, selector="d3llm", threshold=0.5, block_size=8
    ),
    "d3LLM multi-block, entropy 1.0, blocks of 8, add 0.1 / activate 0.95, no cache": dict(
        CANVAS, selector="d3llm", threshold=1.0, block_size=8, block_add_threshold=0.1, decoded_token_threshold=0.95
    ),
    "EB-sampler, entropy bound 0.1, block 8, prefix cache": dict(
        MDM, selector="entropy-bound", entropy_bound=0.1, block_length=8
    ),
    "EB-sampler, entropy bound 1.0, block 8, prefix cache": dict(
        MDM, selector="entropy-bound", entropy_bound=1.0, block_length=8
    ),
    "ReFusion paper, slot 4, 0.7/0.5": dict(slot_size=4, serial_num_blocks=1, slot_threshold=0.7, token_threshold=0.5),
    "ReFusion paper, slot 8, 0.9/0.9": dict(slot_size=8, serial_num_blocks=1, slot_threshold=0.9, token_threshold=0.9),
}


def plot(rows, baseline, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next(r for r in rows if r.method == baseline)
    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    markers = {"AR": "s", "LLaDA": "o", "Fast-dLLM": "^", "entropy": "v", "ReFusion": "*"}
    for number, r in enumerate(rows, 1):
        family = "AR" if r.method.startswith("AR") else r.method.split(" ")[0].rstrip(",")
        x, y = base.seconds / r.seconds, 100 * r.accuracy
        ax.scatter(
            x,
            y,
            s=180 if family == "ReFusion" else 80,
            marker=markers.get(family, "o"),
            label=f"{number}. {r.method} ({x:.2f}x, {y:.1f}%)",
        )
        ax.annotate(str(number), (x, y), fontsize=9, xytext=(6, 5), textcoords="offset points")
    ax.set_xlabel("wall-time speed-up over greedy AR (x)")
    ax.set_ylabel("exact match on held-out tasks (%)")
    ax.set_title(
        f"Decoding strategies on the shipped ReFusion model ({base.examples} held-out prompts, batch 1, CPU)",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    low = min(100 * r.accuracy for r in rows)
    ax.set_ylim(low - 1.0, 100.5)
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--per-task", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--no-block", action="store_true", help="skip the block-diffusion rows")
    parser.add_argument(
        "--only", default=None, help="comma-separated substrings: run only the methods whose names hold one (AR always)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    adapter = load_model(args.model, dtype=torch.float32)
    examples = held_out(args.per_task)
    print(
        f"# {len(examples)} held-out examples, gen_length {GEN_LENGTH}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    ar_name = "AR: transformers generate (greedy, KV cache)"
    rows = [measure(ar_name, ar_method(adapter, GEN_LENGTH), adapter, examples)]
    chosen = [n for n in METHODS if args.only is None or any(w.strip() in n for w in args.only.split(","))]
    for name in chosen:
        params = METHODS[name]
        rows.append(measure(name, decoder_method(Decoder.from_names(**params), adapter, GEN_LENGTH), adapter, examples))
        print(f"  done: {name}", file=sys.stderr, flush=True)
    print(table(rows, ar_name))
    with open(out / "compare_strategies.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "method",
                "accuracy",
                "forwards",
                "tokens",
                "tokens_per_forward",
                "seconds",
                "speedup_vs_ar",
                "forward_ratio_vs_ar",
                *[f"acc_{t}" for t in rows[0].per_task],
            ]
        )
        for r in rows:
            writer.writerow(
                [
                    r.method,
                    f"{r.accuracy:.4f}",
                    r.forwards,
                    r.tokens,
                    f"{r.tokens_per_forward:.3f}",
                    f"{r.seconds:.3f}",
                    f"{rows[0].seconds / r.seconds:.3f}",
                    f"{rows[0].forwards / r.forwards:.3f}",
                    *[f"{v:.4f}" for v in r.per_task.values()],
                ]
            )
    plot(rows, ar_name, out / "compare_strategies.png")
    print(f"\nwrote {out / 'compare_strategies.csv'} and {out / 'compare_strategies.png'}")
    if not args.no_block:
        sys.path.insert(0, str(Path(__file__).parent))
        import block_diffusion

        print("\n## block-diffusion models (a random block-causal Qwen3; no trained one ships, so no accuracy)")
        block_diffusion.main(["--out", str(out)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
