"""The paper's hyperparameter map on the shipped model: slot size x slot threshold x token threshold (x serial blocks).

Run:  python benchmarks/hyperparameters.py [--per-task 10] [--rounds 3] [--threads 1]
          [--slot-sizes 2,4,8] [--slot-thresholds 0.3,0.6,0.9] [--token-thresholds 0.1,0.4,0.7,0.9]
          [--serial-blocks 1,2] [--png docs/hyperparameters.png] [--csv benchmarks/results/hyperparameters.csv]

Each round is one grid ``refusion.sweep`` over the whole space on the same
held-out prompts (batch 1, ``gen_length`` 32, one torch thread), with its own
AR baseline (transformers ``generate``) measured at the start of the round;
a point's wall speed-up is its AR time per token / its time per token within
the round, and the figure shows the median over rounds (spread in the CSV).
Accuracy and forwards do not change between rounds. The heatmaps show
accuracy and speed-up over AR per (slot threshold, token threshold), one
column per slot size and a pair of rows per number of serial blocks; a cell
is outlined where the point is at least as accurate as AR *and* faster.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from refusion.api import load_model
from refusion.sweep import run_sweep

ROOT = Path(__file__).resolve().parent.parent


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def run_rounds(args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """Every point's metrics per round: {(slot_size, blocks, slot_t, token_t): [metrics, ...]}, and each round's AR."""
    adapter = load_model(args.model, dtype=torch.float32)
    space = [
        f"slot_size={','.join(map(str, args.slot_sizes))}",
        f"serial_num_blocks={','.join(map(str, args.serial_blocks))}",
        f"slot_threshold={','.join(map(str, args.slot_thresholds))}",
        f"token_threshold={','.join(map(str, args.token_thresholds))}",
    ]
    points: dict[tuple, list[dict]] = {}
    ars = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            start = time.perf_counter()
            result = run_sweep(
                space,
                f"held-out:{args.per_task}",
                model=adapter,
                preset="model",
                mode="grid",
                gen_length=32,
                out=Path(tmp) / f"round{r}",
                plot=False,
                progress=not args.quiet,
            )
            ars.append(result.ar)
            for rec in result.records:
                p = rec.point
                key = (p["slot_size"], p["serial_num_blocks"], p["slot_threshold"], p["token_threshold"])
                points.setdefault(key, []).append(rec.metrics)
            print(
                f"round {r + 1}/{args.rounds}: {len(result.records)} points, AR {result.ar['accuracy']:.1%} "
                f"{1e3 * result.ar['seconds_per_token']:.2f} ms/token, {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
            )
    return points, ars


def summarise(points: dict, ars: list[dict]) -> list[dict]:
    rows = []
    for (size, blocks, slot_t, token_t), runs in sorted(points.items()):
        speedups = [m["speedup"] for m in runs]
        rows.append(
            {
                "slot_size": size,
                "serial_num_blocks": blocks,
                "slot_threshold": slot_t,
                "token_threshold": token_t,
                "accuracy": runs[0]["accuracy"],
                "forwards": runs[0]["forwards"],
                "tokens_per_forward": runs[0]["tokens_per_forward"],
                "forward_ratio": runs[0]["forward_ratio"],
                "speedup": statistics.median(speedups),
                "speedup_min": min(speedups),
                "speedup_max": max(speedups),
                "ar_accuracy": ars[0]["accuracy"],
                "rounds": len(runs),
            }
        )
    return rows


def draw(rows: list[dict], args: argparse.Namespace, ar_accuracy: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    sizes, blocks = args.slot_sizes, args.serial_blocks
    ys, xs = args.slot_thresholds, args.token_thresholds
    index = {(r["slot_size"], r["serial_num_blocks"], r["slot_threshold"], r["token_threshold"]): r for r in rows}
    fig, axes = plt.subplots(
        2 * len(blocks), len(sizes), figsize=(3.2 * len(sizes), 2.9 * 2 * len(blocks)), squeeze=False
    )
    accs = [r["accuracy"] for r in rows]
    speeds = [r["speedup"] for r in rows]
    # colours diverge at AR: green is better than AR, red worse
    norms = {
        "accuracy": TwoSlopeNorm(ar_accuracy, min(min(accs), ar_accuracy - 0.05), max(max(accs), ar_accuracy + 0.05)),
        "speedup": TwoSlopeNorm(1.0, min(min(speeds), 0.5), max(max(speeds), 1.5)),
    }
    for b, nblocks in enumerate(blocks):
        for c, size in enumerate(sizes):
            for k, metric in enumerate(("accuracy", "speedup")):
                ax = axes[2 * b + k][c]
                grid = np.array([[index[(size, nblocks, y, x)][metric] for x in xs] for y in ys])
                ax.imshow(grid, cmap="RdYlGn", norm=norms[metric], origin="lower", aspect="auto")
                for i, y in enumerate(ys):
                    for j, x in enumerate(xs):
                        row = index[(size, nblocks, y, x)]
                        text = (
                            f"{row['accuracy']:.1%}"
                            if metric == "accuracy"
                            else f"{row['speedup']:.2f}x\n({row['forward_ratio']:.2f}x fwd)"
                        )
                        ax.text(j, i, text, ha="center", va="center", fontsize=6.5)
                        if row["accuracy"] >= ar_accuracy - 1e-12 and row["speedup"] > 1.0:
                            ax.add_patch(
                                Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="tab:cyan", linewidth=2.2)
                            )
                ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs], fontsize=7)
                ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys], fontsize=7)
                ax.set_title(
                    f"{'accuracy' if k == 0 else 'wall speed-up (forward ratio)'}: slot {size}, "
                    f"{nblocks} block{'s' if nblocks > 1 else ''}",
                    fontsize=8,
                )
                if c == 0:
                    ax.set_ylabel("slot threshold", fontsize=8)
                if 2 * b + k == 2 * len(blocks) - 1:
                    ax.set_xlabel("token threshold", fontsize=8)
    fig.suptitle(
        f"ReFusion hyperparameter map on the shipped model (AR accuracy {ar_accuracy:.1%})\n"
        "outlined: at least AR's accuracy and faster than AR",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the shipped model)")
    parser.add_argument("--per-task", type=int, default=10, help="held-out examples per task")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slot-sizes", type=_ints, default=[2, 4, 8])
    parser.add_argument("--slot-thresholds", type=_floats, default=[0.3, 0.6, 0.9])
    parser.add_argument("--token-thresholds", type=_floats, default=[0.1, 0.4, 0.7, 0.9])
    parser.add_argument("--serial-blocks", type=_ints, default=[1, 2])
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "hyperparameters.png")
    parser.add_argument("--csv", type=Path, default=ROOT / "benchmarks" / "results" / "hyperparameters.csv")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--replot", action="store_true", help="redraw the PNG from the CSV of an earlier run")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.replot:
        rows = [{k: float(v) if "." in v else int(v) for k, v in r.items()} for r in csv.DictReader(args.csv.open())]
        draw(rows, args, rows[0]["ar_accuracy"], args.png)
        print(f"redrew {args.png} from {args.csv}")
        return 0

    start = time.perf_counter()
    points, ars = run_rounds(args)
    rows = summarise(points, ars)
    ar_accuracy = ars[0]["accuracy"]
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    draw(rows, args, ar_accuracy, args.png)
    good = [r for r in rows if r["accuracy"] >= ar_accuracy and r["speedup"] > 1.0]
    print(
        f"{len(rows)} points x {args.rounds} rounds in {time.perf_counter() - start:.0f} s; AR accuracy "
        f"{ar_accuracy:.1%}; {len(good)} points at least as accurate as AR and faster "
        f"(median wall speed-up {statistics.median(r['speedup'] for r in good) if good else 0:.2f}x, "
        f"forward ratio {min((r['forward_ratio'] for r in good), default=0):.2f}-"
        f"{max((r['forward_ratio'] for r in good), default=0):.2f}x)"
    )
    best = sorted(rows, key=lambda r: (-r["accuracy"], -r["speedup"]))[:5]
    for r in best:
        print(
            f"  slot {r['slot_size']:>2} blocks {r['serial_num_blocks']} thresholds {r['slot_threshold']}/"
            f"{r['token_threshold']}: {r['accuracy']:.1%}, {r['speedup']:.2f}x "
            f"[{r['speedup_min']:.2f}-{r['speedup_max']:.2f}], {r['forward_ratio']:.2f}x fewer forwards"
        )
    print(f"wrote {args.csv} and {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
