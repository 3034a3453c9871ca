"""AUP, *accuracy under parallelism* (d3LLM, arXiv 2601.07568): one number for a decoder's accuracy / parallelism curve.

A curve is a list of ``(tokens_per_forward, accuracy)`` points of one decoding method on one task, accuracy in
percent (0-100). Its authors' definition (``AUP_leaderboard/aup_utils.py`` of hao-ai-lab/d3LLM), restated:

* sort the points by tokens per forward ``rho``; ``y_1`` is the accuracy of the least parallel point;
* keep the points with accuracy at least ``y_1 - y_min_offset`` (5 points);
* ``W(y) = min(exp(-alpha * (1 - y / y_max)), 1)`` with ``alpha = 3``, where ``y_max`` is the best accuracy of
  *every* method on that task (AR included);
* ``AUP = rho_1 * y_1 + sum_i (rho_i - rho_{i-1}) * (y_i * W(y_i) + y_{i-1} * W(y_{i-1})) / 2``: the first point
  unweighted, then the trapezoid under the weighted curve.

The authors' function refuses a curve whose most parallel point lost more than ``y_min_offset`` against the
least parallel one (an assertion); :func:`aup` does the same with ``strict=True`` and otherwise keeps the points
within the offset, as the filter after that assertion does (what a sweep's front needs: its fastest points may
fall further).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from refusion.errors import ConfigError

#: the authors' defaults
ALPHA = 3.0
Y_MIN_OFFSET = 5.0


def weight(accuracy: float, y_max: float, alpha: float = ALPHA) -> float:
    """``W(y) = min(exp(-alpha * (1 - y / y_max)), 1)``: 1 at the task's best accuracy, falling below it."""
    return min(math.exp(-alpha * (1.0 - accuracy / y_max)), 1.0)


def aup(
    points: Iterable[tuple[float, float]],
    y_max: float,
    *,
    alpha: float = ALPHA,
    y_min_offset: float = Y_MIN_OFFSET,
    strict: bool = False,
) -> float:
    """The AUP of ``points`` (``(tokens_per_forward, accuracy_percent)`` pairs, any order; points of equal tokens
    per forward keep their given order, as the authors' stable sort does).

    ``y_max`` is the best accuracy (percent) of every method measured on the task. Raises
    :class:`~refusion.errors.ConfigError` for an empty curve, a non-positive tokens-per-forward, an accuracy
    outside 0-100 or a ``y_max`` not above 0; with ``strict=True`` also for a curve whose most parallel point is
    more than ``y_min_offset`` below its least parallel one (the authors' assertion).
    """
    curve = sorted(((float(r), float(y)) for r, y in points), key=lambda p: p[0])  # stable, as the authors'
    if not curve:
        raise ConfigError("`points`: AUP needs at least one (tokens per forward, accuracy) point.", param="points")
    if any(not r > 0 or not math.isfinite(r) for r, _ in curve):
        raise ConfigError("`points`: every tokens-per-forward must be a positive number.", param="points")
    if any(not 0.0 <= y <= 100.0 for _, y in curve):
        raise ConfigError("`points`: accuracies are percentages, 0 to 100.", param="points")
    if not y_max > 0 or not math.isfinite(y_max):
        raise ConfigError("`y_max`: the task's best accuracy must be a percentage above 0.", param="y_max")
    first = curve[0][1]
    if strict and first - curve[-1][1] > y_min_offset:
        raise ConfigError(
            f"`points`: the most parallel point's accuracy ({curve[-1][1]:.2f}) is more than {y_min_offset:g} "
            f"below the least parallel one's ({first:.2f}); AUP's authors refuse such a curve.",
            param="points",
        )
    kept = [(r, y) for r, y in curve if y >= first - y_min_offset]
    total = kept[0][0] * kept[0][1]
    for (r0, y0), (r1, y1) in zip(kept, kept[1:]):
        total += 0.5 * (r1 - r0) * (y1 * weight(y1, y_max, alpha) + y0 * weight(y0, y_max, alpha))
    return total


def best_accuracy(curves: Sequence[Sequence[tuple[float, float]]]) -> float:
    """``y_max`` of a task: the highest accuracy over every point of every curve."""
    return max(y for curve in curves for _, y in curve)
