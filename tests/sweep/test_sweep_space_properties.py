"""Invariants of spaces and Pareto fronts (hypothesis), on hand-made data: no model."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.config import preset
from refusion.sweep.outputs import choose, pareto_front
from refusion.sweep.space import build_space, point_key
from refusion.sweep.study import TrialRecord

BASE = preset("paper")


@settings(max_examples=20)
@given(low=st.integers(0, 20), width=st.integers(0, 30), step=st.integers(1, 7))
def test_a_stepped_range_covers_low_to_high_in_steps(low, width, step):
    (dim,) = build_space(BASE, [f"slot_size={low + 1}:{low + 1 + width}:{step}"]).dimensions
    values = dim.grid()
    assert values[0] == low + 1 and values[-1] <= low + 1 + width < values[-1] + step
    assert all(b - a == step for a, b in zip(values, values[1:]))


@settings(max_examples=20)
@given(
    selectors=st.lists(
        st.sampled_from(["threshold", "topk", "leftmost", "margin"]), min_size=1, max_size=4, unique=True
    ),
    ks=st.lists(st.integers(1, 4), min_size=1, max_size=3, unique=True),
    thresholds=st.lists(st.sampled_from([0.3, 0.5, 0.7, 0.9]), min_size=1, max_size=3, unique=True),
)
def test_grid_points_are_distinct_and_only_carry_parameters_their_parts_take(selectors, ks, thresholds):
    specs = ["selector=" + ",".join(selectors)]
    if "threshold" in selectors:
        specs.append("slot_threshold=" + ",".join(map(str, thresholds)))
    if {"topk", "margin"} & set(selectors):
        specs.append("k=" + ",".join(map(str, ks)))
    space = build_space(BASE, specs)
    points = space.grid()
    assert len({point_key(p) for p in points}) == len(points)
    for p in points:
        parts = {**space.base_names(), "selector": p["selector"]}
        assert all(space.accepts(parts, name) for name in p if name != "selector")
        built = space.preset(p)
        assert built.selector.name == p["selector"]
        assert all(built.selector.params[k] == v for k, v in p.items() if k != "selector")
    expected = sum(
        (len(thresholds) if s == "threshold" else len(ks) if s in ("topk", "margin") else 1) for s in selectors
    )
    assert len(points) == expected


records = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 8)), min_size=1, max_size=12)


@settings(max_examples=30)
@given(rows=records)
def test_the_front_is_exactly_the_undominated_points(rows):
    recs = [TrialRecord(i, {"i": i}, {"accuracy": a / 5, "forwards": f}) for i, (a, f) in enumerate(rows)]
    front = pareto_front(recs, "forwards")
    on = {r.number for r in front}

    def beats(o, r):
        return (
            o["accuracy"] >= r["accuracy"]
            and o["forwards"] <= r["forwards"]
            and (o["accuracy"] > r["accuracy"] or o["forwards"] < r["forwards"])
        )

    for r in recs:
        assert (r.number in on) == (not any(beats(o, r) for o in recs))
    chosen = choose(front, ar_accuracy=0.6, objective="forwards")
    assert chosen in front
    good = [r for r in front if r["accuracy"] >= 0.6]
    if good:
        assert chosen["forwards"] == min(r["forwards"] for r in good)
    else:
        assert chosen["accuracy"] == max(r["accuracy"] for r in recs)


def test_a_preset_keeps_base_parameters_only_for_the_base_parts():
    space = build_space(BASE, ["selector=threshold,topk", "k=2"])
    topk = space.preset({"selector": "topk", "k": 2})
    assert dict(topk.selector.params) == {"k": 2} and topk.partitioner.params["slot_size"] == 8
    assert space.preset({"selector": "threshold"}).selector.params["slot_threshold"] == pytest.approx(0.9)
