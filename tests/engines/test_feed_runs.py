"""A feed's many-lane run packs the same tokens as one run per lane."""

import numpy as np
import pytest

from refusion.engines.feed import Feed, causal_spans


def _runs(feed: Feed, tables: list[object]) -> list[int]:
    return [feed.lane(("state", i), table) for i, table in enumerate(tables)]


def test_many_lane_run_packs_like_one_run_per_lane():
    tables = [object(), object(), object()]
    counts = [3, 1, 2]
    ids = np.arange(10, 16)
    columns = np.array([4, 5, 6, 0, 7, 8])
    one, many = Feed(), Feed()
    lanes = _runs(one, tables)
    starts, at = [], 0
    for lane, c in zip(lanes, counts):
        starts.append(
            one.add(
                lane, ids[at : at + c], columns[at : at + c], columns[at : at + c], causal_spans(columns[at : at + c])
            )
        )
        at += c
    got = many.add_runs(_runs(many, tables), counts, ids, columns, columns, causal_spans(columns))
    assert got.tolist() == starts == [0, 3, 4]
    for a, b in zip(one.arrays(), many.arrays()):
        np.testing.assert_array_equal(a, b)
    assert many.arrays()[2].tolist() == [0, 0, 0, 1, 2, 2]


def test_many_lane_run_refuses_a_lane_fed_earlier_in_the_forward():
    feed = Feed()
    a, b = feed.lane("a", object()), feed.lane("b", object())
    feed.add(a, [1], [0], [0], causal_spans(np.array([0])))
    feed.add(b, [2], [0], [0], causal_spans(np.array([0])))
    with pytest.raises(RuntimeError, match="consecutively"):
        feed.add_runs([a], [1], [3], [1], [1], causal_spans(np.array([1])))
    with pytest.raises(RuntimeError, match="consecutively"):
        feed.add_runs([b, b], [1, 1], [3, 4], [1, 2], [1, 2], causal_spans(np.array([1, 2])))


def test_many_lane_run_mixes_with_single_runs_and_rolls_back():
    feed = Feed()
    a, b, c = (feed.lane(name, object()) for name in "abc")
    feed.add(a, [1, 2], [0, 1], [0, 1], causal_spans(np.array([0, 1])))
    mark = feed.checkpoint()
    feed.add_runs([b, c], [1, 1], [3, 4], [0, 0], [0, 0], causal_spans(np.array([0, 0])))
    assert feed.arrays()[2].tolist() == [0, 0, 1, 2]
    feed.rollback(mark)
    assert len(feed) == 2 and feed.arrays()[0].tolist() == [1, 2]
