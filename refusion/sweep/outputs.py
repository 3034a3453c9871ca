"""What a sweep writes: the trials as CSV, the Pareto front as a PNG, the chosen point as a preset JSON.

The front is taken over (accuracy, up) and the objective's cost (forwards or
wall seconds per token, down); speed-ups are ratios to the AR baseline
measured in the run that evaluated the point.
"""

from __future__ import annotations

import csv
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from refusion.config import DecoderSpec
from refusion.sweep.space import describe_point
from refusion.sweep.study import OBJECTIVES, TrialRecord

METRICS = (
    "accuracy",
    "correct",
    "examples",
    "forwards",
    "tokens",
    "tokens_per_forward",
    "seconds",
    "seconds_per_token",
    "speedup",
    "forward_ratio",
    "ar_accuracy",
    "ar_forwards",
    "ar_seconds_per_token",
)

#: the x axis of the front for each objective: the ratio to AR it is measured by
SPEED = {"forwards": "forward_ratio", "wall": "speedup"}


def pareto_front(records: Sequence[TrialRecord], objective: str) -> list[TrialRecord]:
    """The records no other record beats on both accuracy (higher) and cost (lower), fastest first."""
    cost = OBJECTIVES[objective]

    def dominated(r: TrialRecord) -> bool:
        return any(
            o["accuracy"] >= r["accuracy"]
            and o[cost] <= r[cost]
            and (o["accuracy"] > r["accuracy"] or o[cost] < r[cost])
            for o in records
        )

    front = [r for r in records if not dominated(r)]
    return sorted(front, key=lambda r: (r[cost], -r["accuracy"], r.number))


def aup_front(records: Sequence[TrialRecord], ar: dict[str, Any]) -> tuple[float | None, list[TrialRecord]]:
    """The sweep's AUP (:mod:`refusion.measure.aup`, d3LLM's accuracy under parallelism) and the trials its curve
    runs through.

    The curve starts at AR's point (its tokens per forward, about 1, and accuracy: the least parallel point of
    every d3LLM curve) and goes through the trials no other trial beats on both tokens per forward and accuracy
    (higher is better for both), in percent; ``y_max`` is the best accuracy of AR and every trial. As in the
    authors' filter, points more than 5 below the least parallel point's accuracy are left out (a sweep's
    fastest trials often are). ``None`` without trials or when every accuracy is 0.
    """
    from refusion.measure.aup import aup

    def beaten(r: TrialRecord) -> bool:
        return any(
            o["tokens_per_forward"] >= r["tokens_per_forward"]
            and o["accuracy"] >= r["accuracy"]
            and (o["tokens_per_forward"] > r["tokens_per_forward"] or o["accuracy"] > r["accuracy"])
            for o in records
        )

    curve = sorted((r for r in records if not beaten(r)), key=lambda r: (r["tokens_per_forward"], r.number))
    y_max = 100 * max([ar["accuracy"], *(r["accuracy"] for r in records)])
    if not curve or y_max <= 0 or ar["tokens_per_forward"] <= 0:
        return None, curve
    points = [(ar["tokens_per_forward"], 100 * ar["accuracy"])]
    points += [(r["tokens_per_forward"], 100 * r["accuracy"]) for r in curve if r["tokens_per_forward"] > 0]
    return aup(points, y_max), curve


def choose(
    front: Sequence[TrialRecord], ar_accuracy: float, objective: str, max_accuracy_drop: float = 0.0
) -> TrialRecord:
    """The fastest front point whose accuracy is at least AR's minus ``max_accuracy_drop``, else the most accurate.

    Ties on the objective and accuracy go to the other measure of speed (wall time per token for the forwards
    objective, forwards for the wall objective), then to the earlier trial.
    """
    cost = OBJECTIVES[objective]
    other = OBJECTIVES["wall" if objective == "forwards" else "forwards"]
    good = [r for r in front if r["accuracy"] >= ar_accuracy - max_accuracy_drop - 1e-12]
    if good:
        return min(good, key=lambda r: (r[cost], -r["accuracy"], r.metrics.get(other, 0), r.number))
    return max(front, key=lambda r: (r["accuracy"], -r[cost], -r.metrics.get(other, 0), -r.number))


def write_csv(path: Path, records: Sequence[TrialRecord], front: Sequence[TrialRecord], ar: dict[str, Any]) -> Path:
    """One row for AR, then one per trial: the point's values, every metric, whether it is on the front."""
    names: list[str] = []
    for r in records:
        names += [k for k in r.point if k not in names]
    on_front = {r.number for r in front}
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["trial", "label", *names, *METRICS, "pareto"])
        writer.writerow(
            ["", "AR: transformers generate", *[""] * len(names), *[_fmt(ar.get(m, "")) for m in METRICS], ""]
        )
        for r in records:
            writer.writerow(
                [
                    r.number,
                    describe_point(r.point),
                    *[r.point.get(n, "") for n in names],
                    *[_fmt(r.metrics.get(m, "")) for m in METRICS],
                    r.number in on_front,
                ]
            )
    return path


def _fmt(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def write_front_png(
    path: Path,
    records: Sequence[TrialRecord],
    front: Sequence[TrialRecord],
    chosen: TrialRecord | None,
    ar_accuracy: float,
    objective: str,
) -> Path:
    """Accuracy against speed-up over AR: every trial grey, the front joined and labelled, the chosen point ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speed = SPEED[objective]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.scatter([r[speed] for r in records], [r["accuracy"] for r in records], color="0.75", s=18, label="trials")
    ax.plot([r[speed] for r in front], [r["accuracy"] for r in front], "o-", color="tab:blue", label="Pareto front")
    same: dict[tuple[float, float], list[str]] = {}
    for r in front:  # points at the same place share one label
        same.setdefault((round(r[speed], 9), round(r["accuracy"], 9)), []).append(describe_point(r.point))
    middle = (min([1.0, *(x for x, _ in same)]) + max(x for x, _ in same)) / 2
    top = max(y for _, y in same)
    for (x, y), labels in same.items():
        text = labels[0] + (f" (+{len(labels) - 1} alike)" if len(labels) > 1 else "")
        right, high = x > middle, y >= top and len(same) > 1
        ax.annotate(
            textwrap.fill(text, 34, break_on_hyphens=False),
            (x, y),
            fontsize=6.5,
            xytext=(-8 if right else 8, -8 if high else 8),
            textcoords="offset points",
            ha="right" if right else "left",
            va="top" if high else "bottom",
        )
    ax.margins(x=0.15, y=0.12)
    ax.scatter([1.0], [ar_accuracy], marker="s", color="tab:red", zorder=3, label="AR")
    if chosen is not None:
        ax.scatter(
            [chosen[speed]],
            [chosen["accuracy"]],
            s=160,
            facecolors="none",
            edgecolors="tab:green",
            linewidths=2,
            zorder=4,
            label="chosen preset",
        )
    ax.set_xlabel("speed-up over AR (" + ("forward ratio" if objective == "forwards" else "wall time per token") + ")")
    ax.set_ylabel("accuracy (exact match)")
    ax.set_title(f"refusion sweep: {len(records)} trials, {len(front)} on the front")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def write_preset(path: Path, preset: DecoderSpec) -> Path:
    """Write the chosen point as a decoder spec file (what ``refusion.json`` and ``--preset-file`` read)."""
    preset.save(path)
    return path
