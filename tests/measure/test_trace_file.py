"""The standard trace: every record fits the shipped schema, counters add up, the file reads back into steps."""

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refusion
from refusion.cli import main
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError
from refusion.measure.trace import read_trace, schema, write_trace
from tests.support.helpers import layouts, model_setups, tiny

MEASURED = (
    "confidence",
    "fed_tokens",
    "kv_appended",
    "kv_pending",
    "kv_encoded",
    "kv_invalidated",
    "kv_copied_bytes",
    "kv_written_bytes",
    "seconds",
)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _check_sums(result, engine_totals=True):
    steps = result.iterations
    assert sum(s.forwards for s in steps) == result.forwards
    assert all(len(s.fed_tokens) == s.forwards for s in steps)
    assert sum(sum(s.fed_tokens) for s in steps) == result.fed_tokens
    assert sum(s.kv_copied_bytes for s in steps) == result.kv_bytes.context
    assert sum(s.kv_written_bytes for s in steps) == result.kv_bytes.new
    committed = sum(n for s in steps for _, n in s.committed)
    assert sum(s.kv_appended + s.kv_pending for s in steps) == committed
    if engine_totals:  # one sequence on its own engine: its counters are the engine's totals
        totals = result.engine_totals
        assert totals["forwards"] == result.forwards and totals["fed_tokens"] == result.fed_tokens
        assert totals["kv_bytes"] == {"context": result.kv_bytes.context, "new": result.kv_bytes.new}


@settings(max_examples=8)
@given(
    setup=model_setups(),
    layout=layouts(),
    engine=st.sampled_from(["branch", "repeat"]),
    reorderer=st.sampled_from(["commit-order", "reencode"]),
    thresholds=st.sampled_from([(0.9, 0.9), (0.3, 0.2)]),
)
def test_trace_records_fit_the_schema_add_up_and_read_back(
    tmp_path_factory, setup, layout, engine, reorderer, thresholds
):
    model, prompt = setup
    slot, blocks, gen_length = layout
    decoder = Decoder.from_names(
        reorderer=reorderer,
        slot_size=slot,
        serial_num_blocks=blocks,
        engine=engine,
        slot_threshold=thresholds[0],
        token_threshold=thresholds[1],
    )
    session = decoder.session(model, prompt, decoder.fit_length(gen_length), record=True)
    result = session.run()
    _check_sums(result)
    # every pending entry is encoded by a later forward, except those still pending at the end
    encoded = sum(s.kv_encoded for s in result.iterations)
    assert (
        encoded == len(prompt) + sum(s.kv_pending + s.kv_invalidated for s in result.iterations) - session.cache.pending
    )

    path = write_trace(result, tmp_path_factory.mktemp("t") / "trace.jsonl", decoder=decoder)
    validator = jsonschema.Draft202012Validator(schema())
    records = _lines(path)
    for record in records:
        validator.validate(record)
    assert [r["record"] for r in records] == ["header"] + ["step"] * result.num_iterations + ["end"]
    (back,) = read_trace(path)
    assert back.iterations == result.iterations and back.forwards == result.forwards
    for ours, theirs in zip(result.iterations, back.iterations):
        assert all(getattr(ours, f) == pytest.approx(getattr(theirs, f)) for f in MEASURED)
    assert back.tokens.tolist() == result.tokens.tolist()
    assert back.commit_step.tolist() == result.commit_step.tolist()
    assert back.region_tokens == result.region_tokens
    assert back.partition == result.partition and back.stopped_at_eos == result.stopped_at_eos
    assert back.decoder["reorderer"]["name"] == reorderer


def test_a_batch_trace_keeps_each_sequence_and_the_engine_totals(tmp_path):
    model = refusion.load_model(None)
    path = tmp_path / "batch.jsonl"
    results = refusion.generate(["rev helloworld=", "copy abc=", "sort dcba="], model, trace=str(path), record=True)
    back = read_trace(path)
    assert [r.text for r in back] == [r.text for r in results] == ["dlrowolleh", "abc", "abcd"]
    for result in back:
        _check_sums(result, engine_totals=False)
    totals = results[0].engine_totals
    assert sum(r.fed_tokens for r in back) == totals["fed_tokens"]
    assert max(r.forwards for r in back) <= totals["forwards"] <= sum(r.forwards for r in back)


def test_generate_command_writes_a_trace_with_token_pieces(tmp_path):
    path = tmp_path / "cli.jsonl"
    assert main(["generate", "copy abcdefgh=", "--slot-size", "2", "--trace", str(path)]) == 0
    steps = [r for r in _lines(path) if r["record"] == "step"]
    commits = sorted((c for r in steps for c in r["committed"]), key=lambda c: c["start"])
    pieces = "".join(p for c in commits for p in c["pieces"])
    assert pieces.startswith("abcdefgh") and all(r["confidence"] for r in steps)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda lines: lines[:1] + ["{not json"] + lines[1:], ":2: field `(line)`: not a JSON object"),
        (
            lambda lines: [lines[0].replace('"gen_length": ', '"gen_len": ')] + lines[1:],
            ":1: header record, field `gen_length`: is missing",
        ),
        (
            lambda lines: lines[:1] + [lines[1].replace('"forwards": ', '"forwards": -')] + lines[2:],
            "step record, field `forwards`",
        ),
        (lambda lines: lines[1:], "before its header"),
        (lambda lines: lines[:-1], "has no end record"),
        (
            lambda lines: [lines[0].replace('"record": "header"', '"record": "head"')] + lines[1:],
            ":1: field `record`: must be 'header', 'step' or 'end'",
        ),
    ],
)
def test_a_malformed_trace_is_refused_naming_the_line_and_field(tmp_path, edit, message):
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1)
    good = write_trace(decoder.decode(tiny(vocab=16), [3, 4, 5], 4, record=True), tmp_path / "good.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(edit(good.read_text().splitlines())) + "\n")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_trace(bad)


def test_an_unreadable_trace_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="could not be read"):
        read_trace(tmp_path / "missing.jsonl")


def test_every_schema_field_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "trace.md").read_text()
    names = set()

    def walk(node, prefix=""):
        if isinstance(node, dict):
            for key, sub in node.get("properties", {}).items():
                names.add(prefix + key)
                walk(sub, prefix + key + "." if key == "cache" else prefix)
            for value in node.values():
                if isinstance(value, (dict, list)) and value is not node.get("properties"):
                    walk(value, prefix)
        elif isinstance(node, list):
            for item in node:
                walk(item, prefix)

    walk(schema())
    leaves = {n for n in names if not any(other.startswith(n + ".") for other in names)}
    missing = sorted(n for n in leaves if f"`{n}`" not in doc)
    assert not missing and "cache.encoded" in names


@pytest.mark.parametrize("preset", ["llada", "fast-dllm", "fast-dllm-dual"])
def test_canvas_decodes_of_bidirectional_models_add_up_too(tmp_path, preset):
    from refusion.config import PRESETS
    from refusion.models.mdm import tiny_bidirectional

    chosen = PRESETS[preset]
    decoder = Decoder.from_spec(chosen.with_params({"block_length": 8}))
    result = decoder.decode(tiny_bidirectional(vocab_size=16, seed=1), [3, 4, 5], 16, record=True)
    assert result.engine == "canvas"
    _check_sums(result)
    (back,) = read_trace(write_trace(result, tmp_path / "canvas.jsonl"))
    assert back.iterations == result.iterations and [s.fed_tokens for s in back.iterations] == [
        s.fed_tokens for s in result.iterations
    ]
