"""AUP (accuracy under parallelism) is d3LLM's: the authors' own ``get_aup`` outputs on their leaderboard data and on
hand-made corner curves (tests/fixtures/peers/aup/golden.json, made by tools/peer_fixtures/aup.py), plus the rule's
invariants."""

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refusion.errors import ConfigError
from refusion.measure.aup import aup, best_accuracy, weight

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "peers" / "aup" / "golden.json").read_text())
CURVES = GOLDEN["curves"]


@pytest.mark.parametrize("curve", CURVES, ids=[c["source"] for c in CURVES])
def test_aup_equals_the_authors_get_aup_on_their_leaderboard_and_corner_curves(curve):
    points = [tuple(p) for p in curve["points"]]
    if curve["aup"] is None:
        with pytest.raises(ConfigError, match="more than 5"):
            aup(points, curve["y_max"], strict=True)
    else:
        assert aup(points, curve["y_max"], strict=True) == pytest.approx(curve["aup"], rel=1e-12, abs=1e-12)


def test_the_golden_file_covers_the_leaderboard_and_a_refused_curve():
    assert GOLDEN["commit"] and len(GOLDEN["peer_files"]) == 4
    assert sum(c["source"].startswith("data_") for c in CURVES) >= 70
    assert any(c["aup"] is None for c in CURVES)


def test_without_strict_a_curve_that_fell_too_far_keeps_its_points_within_five():
    points = [(1.0, 70.0), (2.0, 68.0), (6.0, 60.0)]
    assert aup(points, 72.0) == pytest.approx(aup(points[:2], 72.0))


def test_the_first_point_counts_unweighted_and_the_rest_is_a_weighted_trapezoid():
    assert aup([(2.0, 30.0)], 90.0) == 60.0
    w = weight(30.0, 90.0)
    assert w == pytest.approx(math.exp(-2.0))
    assert aup([(2.0, 30.0), (4.0, 30.0)], 90.0) == pytest.approx(60.0 + 2.0 * 30.0 * w)


def test_best_accuracy_is_the_highest_point_of_every_curve():
    assert best_accuracy([[(1.0, 3.0), (2.0, 9.0)], [(1.0, 7.0)]]) == 9.0


@pytest.mark.parametrize(
    "points, y_max, param",
    [
        ([], 50.0, "points"),
        ([(0.0, 50.0)], 50.0, "points"),
        ([(float("nan"), 50.0)], 50.0, "points"),
        ([(1.0, 101.0)], 50.0, "points"),
        ([(1.0, -1.0)], 50.0, "points"),
        ([(1.0, 50.0)], 0.0, "y_max"),
    ],
)
def test_bad_curves_are_refused_naming_the_argument(points, y_max, param):
    with pytest.raises(ConfigError) as err:
        aup(points, y_max)
    assert err.value.param == param


accuracy = st.floats(0.0, 100.0, allow_nan=False)
curve = st.lists(st.tuples(st.floats(0.1, 64.0, allow_nan=False), accuracy), min_size=1, max_size=8)


@given(curve)
def test_a_more_parallel_point_at_the_best_accuracy_never_lowers_aup(points):
    y_max = best_accuracy([points])
    if y_max <= 0:
        return
    further = (max(r for r, _ in points) + 1.0, y_max)  # at least the least parallel point's accuracy: kept
    assert aup([*points, further], y_max) >= aup(points, y_max) - 1e-9


@given(curve, st.floats(1.0, 100.0))
def test_aup_is_at_least_the_first_points_area_and_at_most_all_points_at_their_best(points, y_max):
    y_max = max(y_max, best_accuracy([points]))
    first = min(points, key=lambda p: p[0])  # ties: the first given, as the stable sort keeps it
    value = aup(points, y_max)
    assert value >= first[0] * first[1] - 1e-9
    assert value <= max(r for r, _ in points) * y_max + 1e-9


def _result(method, correct, forwards, tokens=120):
    from refusion.measure.results import Result

    return Result(method, 100, correct, forwards, tokens, 1.0)


def test_bench_gives_each_method_the_aup_of_the_curve_from_ar_to_it():
    from refusion.measure.bench import aups, table

    rows = [_result("AR", 90, 120), _result("fast", 88, 40), _result("lossy", 80, 20), _result("best", 92, 60)]
    ar, fast, lossy, best = aups(rows, "AR")
    assert ar == pytest.approx(1.0 * 90)
    assert fast == pytest.approx(aup([(1.0, 90.0), (3.0, 88.0)], 92.0))
    assert lossy is None  # 10 points below AR: a curve AUP's authors refuse
    assert best == pytest.approx(aup([(1.0, 90.0), (2.0, 92.0)], 92.0))
    printed = table(rows, "AR")
    assert "AUP" in printed.splitlines()[0]
    assert f"{fast:.1f}" in next(line for line in printed.splitlines() if line.startswith("fast "))
    assert next(line for line in printed.splitlines() if line.startswith("lossy ")).split()[4] == "-"


def test_a_sweeps_aup_runs_from_ar_through_the_trials_no_other_beats_on_parallelism_and_accuracy():
    from refusion.sweep.outputs import aup_front
    from refusion.sweep.study import TrialRecord

    ar = {"accuracy": 0.90, "tokens_per_forward": 1.0}
    trials = [
        TrialRecord(0, {}, {"accuracy": 0.90, "tokens_per_forward": 2.0}),
        TrialRecord(1, {}, {"accuracy": 0.85, "tokens_per_forward": 1.5}),  # beaten by trial 0
        TrialRecord(2, {}, {"accuracy": 0.88, "tokens_per_forward": 4.0}),
        TrialRecord(3, {}, {"accuracy": 0.70, "tokens_per_forward": 9.0}),  # on the front, 20 points down: left out
    ]
    score, curve = aup_front(trials, ar)
    assert [r.number for r in curve] == [0, 2, 3]
    assert score == pytest.approx(aup([(1.0, 90.0), (2.0, 90.0), (4.0, 88.0)], 90.0))
    assert aup_front([], ar) == (None, [])
