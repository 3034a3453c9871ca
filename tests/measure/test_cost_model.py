"""The GPU cost model: hand-computed rooflines, and shapes recorded by the engines."""

import pytest

from refusion.counters import ForwardShape
from refusion.decoding.decoder import Decoder
from refusion.engines import open_engine
from refusion.errors import ConfigError, UnknownNameError
from refusion.measure.costmodel import (
    GPUS,
    MODELS,
    autoregressive,
    counted_seconds,
    forward_seconds,
    head_seconds,
    parse,
    recording,
)
from tests.support.helpers import tiny

QWEN8B, H100 = MODELS["qwen3-8b"], GPUS["h100"]


def test_qwen3_8b_counts_match_its_published_shape():
    per_layer = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 12288
    assert QWEN8B.body_params == 36 * per_layer == 6_945_767_424
    assert QWEN8B.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2


def test_one_token_decode_is_bound_by_reading_the_weights():
    shape = ForwardShape(rows=1, tokens=1, pairs=1000, keys=999)
    moved = 6_945_767_424 * 2 + QWEN8B.kv_bytes_per_token * 1000
    expected = moved / (3.35e12 * 0.8) + 20e-6
    assert forward_seconds(shape, QWEN8B, H100) == pytest.approx(expected, rel=1e-9)
    assert 5e-3 < expected < 6e-3


def test_a_long_prefill_is_bound_by_compute():
    n = 4096
    shape = ForwardShape(rows=1, tokens=n, pairs=n * (n + 1) // 2, keys=0)
    flops = 2 * 6_945_767_424 * n + 4 * 36 * 32 * 128 * shape.pairs
    assert forward_seconds(shape, QWEN8B, H100) == pytest.approx(flops / (989e12 * 0.6) + 20e-6, rel=1e-9)


def test_head_passes_cost_a_weight_read_until_the_rows_make_them_compute_bound():
    one = head_seconds(1, QWEN8B, H100)
    assert one == pytest.approx(4096 * 151936 * 2 / (3.35e12 * 0.8), rel=1e-9)
    assert head_seconds(64, QWEN8B, H100) == one  # still memory-bound
    assert head_seconds(4096, QWEN8B, H100) > 2 * one


def test_autoregressive_shapes():
    forwards, heads = autoregressive([3, 5], 4)
    assert [f.tokens for f in forwards] == [8, 2, 2, 2]
    assert forwards[0].pairs == 6 + 15 and forwards[1].keys == 3 + 5 and forwards[3].keys == 5 + 7
    assert heads == [2, 2, 2, 2]


def test_parse_names_the_choices():
    assert parse("Qwen3-8B@H100") == (QWEN8B, H100)
    with pytest.raises(ConfigError, match="must look like MODEL@GPU"):
        parse("qwen3-8b")
    with pytest.raises(UnknownNameError, match="Unknown cost-model GPU 'v100'"):
        parse("qwen3-8b@v100")


@pytest.mark.parametrize("engine", ["branch", "repeat"])
def test_engines_record_one_shape_per_forward_and_every_head_pass(engine):
    model = tiny(vocab=16, seed=3)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1)
    live = open_engine(model, decoder, engine)
    with recording(live) as counters:
        results = decoder.decode_batch(model, [[1, 2], [3, 4, 5]], 8, engine=live)
        shapes, heads = list(counters.shapes), list(counters.head_rows)
        estimated = counted_seconds(counters, QWEN8B, H100)
    assert len(shapes) == results[0].engine_totals["forwards"]
    assert sum(f.tokens for f in shapes) >= sum(r.fed_tokens for r in results)
    assert heads and all(rows >= 1 for rows in heads)
    assert estimated > len(shapes) * 5e-3
    assert live.counters.shapes is None and live.model.head[1].counters is None
