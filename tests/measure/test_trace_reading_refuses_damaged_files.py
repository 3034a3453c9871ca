"""Reading a damaged trace: every kind of damage is a ConfigError naming the file, the line and the field.

A small valid trace (two sequences, token pieces) is written by the code, then
damaged by hand (one case per kind of damage) or at random (hypothesis): the
reader either accepts the file or refuses it with a ConfigError, never another
exception, never an allocation the file does not pay for.
"""

import json
import tracemalloc

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError
from refusion.measure import trace
from refusion.measure.trace import load_records, read_trace, schema, write_trace
from tests.support.helpers import tiny


class Letters:
    def decode(self, ids):
        return chr(97 + ids[0] % 26)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """The records of a valid trace: line 1 header, 2-5 steps, 6 end (sequence 0); 7 header, 8-9 steps, 10 end."""
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=2)
    model = tiny(vocab=16)
    results = [decoder.decode(model, [3, 4, 5], 8, record=True), decoder.decode(model, [6, 7], 4, record=True)]
    path = write_trace(results, tmp_path_factory.mktemp("valid") / "valid.jsonl", tokenizer=Letters(), decoder=decoder)
    out = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["record"] for r in out] == ["header"] + ["step"] * 4 + ["end", "header"] + ["step"] * 2 + ["end"]
    return out


def _lines(records):
    return [json.dumps(r).encode() for r in records]


def _write(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def change(number, edit):
    """Apply ``edit`` to the record on line ``number``."""

    def damage(records):
        edit(records[number - 1])
        return _lines(records)

    return damage


def replace(number, old, new):
    """Replace bytes ``old`` with ``new`` on line ``number``."""

    def damage(records):
        lines = _lines(records)
        assert old in lines[number - 1]
        lines[number - 1] = lines[number - 1].replace(old, new, 1)
        return lines

    return damage


def first_committed(**fields):
    return lambda r: r["committed"][0].update(fields)


CASES = {
    # committed tokens
    "committed slot longer than the slot": (
        change(2, first_committed(tokens=[12, 12, 12])),
        2,
        "committed.0.tokens",
        "slot 1 has 2 positions",
    ),
    "committed slot not in the header": (change(2, first_committed(slot=9)), 2, "committed.0.slot", "4 slots"),
    "committed at the wrong position": (change(2, first_committed(start=4)), 2, "committed.0.start", "starts at"),
    "more pieces than tokens": (
        change(2, first_committed(pieces=["m", "m", "m"])),
        2,
        "committed.0.pieces",
        "3 pieces",
    ),
    # integers out of range
    "integer of 10**30": (change(2, lambda r: r.update(forwards=10**30)), 2, "forwards", "64 bits"),
    "integer of 2**63": (
        change(4, lambda r: r["cache"].update(copied_bytes=2**63)),
        4,
        "cache.copied_bytes",
        "64 bits",
    ),
    "negative position": (change(2, first_committed(start=-5)), 2, "committed.0.start", "must be >= 0"),
    "negative slot offset": (change(1, lambda r: r["slots"][1].update(offset=-2)), 1, "slots.1.offset", ">= 0"),
    "gen_length 10**12": (change(1, lambda r: r.update(gen_length=10**12)), 1, "gen_length", "at most"),
    "gen_length beside the slots": (change(1, lambda r: r.update(gen_length=9)), 1, "gen_length", "cover 8"),
    "slot past gen_length": (change(7, lambda r: r["slots"][1].update(length=5)), 7, "slots.1.length", "past"),
    "slot index past the header's": (change(3, lambda r: r.update(selected=[7])), 3, "selected.0", "not one of"),
    "block past the header's": (change(3, lambda r: r.update(block=2)), 3, "block", "2 blocks"),
    "slot listed in another block": (
        change(1, lambda r: r.update(blocks=[[0], [1, 2, 3]])),
        1,
        "blocks.1.0",
        "belongs to block 0",
    ),
    "slot listed twice": (change(1, lambda r: r.update(blocks=[[0, 1, 1], [2, 3]])), 1, "blocks.0.2", "listed twice"),
    "slot not listed": (change(1, lambda r: r.update(blocks=[[0], [2, 3]])), 1, "blocks.0", "not listed"),
    # bytes and JSON that cannot be read
    "non-UTF-8 bytes": (replace(2, b'"tokens": [12, 12]', b'"tokens": [\xff\xfe]'), 2, "tokens", "not UTF-8"),
    "deep nesting in a field": (
        lambda records: _lines(records[:2]) + [b'{"record": "step", "planned": ' + b"[" * 100_000],
        3,
        "planned",
        "nested too deep",
    ),
    "deep nesting, the whole line": (
        lambda records: _lines(records[:2]) + [b"[" * 100_000],
        3,
        "(line)",
        "nested too deep",
    ),
    "integer of 5000 digits": (replace(2, b'"forwards": 4', b'"forwards": 1' + b"0" * 4999), 2, "forwards", "digits"),
    "float out of range": (replace(3, b'"seconds": ', b'"seconds": 1e999, "x": '), 3, "seconds", "finite"),
    "not JSON": (replace(5, b'"block": 1', b'"block": 1,,'), 5, "block", "not a JSON object"),
    # wrong types
    "string for an integer": (change(2, lambda r: r.update(forwards="4")), 2, "forwards", "must be an integer"),
    "true for an integer": (change(2, lambda r: r.update(iteration=True)), 2, "iteration", "must be an integer"),
    "float for an integer": (change(8, lambda r: r.update(planned=[0.0])), 8, "planned.0", "must be an integer"),
    "NaN for a confidence": (
        change(2, lambda r: r.update(confidence=[float("nan"), 0.5])),
        2,
        "confidence.0",
        "finite",
    ),
    "confidence above 1": (change(2, lambda r: r.update(confidence=[0.5, 1.5])), 2, "confidence.1", "<= 1"),
    "list for an object": (change(2, lambda r: r.update(cache=[1, 2])), 2, "cache", "must be an object"),
    "a line that is a list": (lambda records: _lines(records[:1]) + [b"[1, 2]"], 2, "(line)", "not a JSON object"),
    "unknown record kind": (change(6, lambda r: r.update(record="finish")), 6, "record", "'header', 'step' or 'end'"),
    "unknown field": (change(9, lambda r: r.update(extra=1)), 9, "extra", "not a field"),
    "missing field": (change(4, lambda r: r["cache"].pop("pending")), 4, "cache.pending", "missing"),
    "wrong schema version": (change(7, lambda r: r.update(version=2)), 7, "version", "must be 1"),
    # missing, repeated or disagreeing records
    "missing header": (lambda records: _lines(records[1:]), 1, "sequence", "before its header"),
    "missing step": (lambda records: _lines(records[:2] + records[3:]), 3, "iteration", "expected 1"),
    "missing last step": (lambda records: _lines(records[:4] + records[5:]), 5, "iterations", "4"),
    "missing end record": (lambda records: _lines(records[:5] + records[6:]), 9, "record", "has no end record"),
    "second header": (change(7, lambda r: r.update(sequence=0)), 7, "sequence", "second header"),
    "step after the end": (
        lambda records: _lines(records[:6] + records[4:5] + records[6:]),
        7,
        "sequence",
        "after its end record",
    ),
    "totals that do not add up": (
        change(6, lambda r: r.update(fed_tokens=r["fed_tokens"] + 1)),
        6,
        "fed_tokens",
        "add up to",
    ),
    "bytes that do not add up": (change(10, lambda r: r["kv_bytes"].update(new=0)), 10, "kv_bytes.new", "add up to"),
    "answer that was not committed": (
        change(10, lambda r: r["tokens"].__setitem__(3, 13)),
        10,
        "tokens.3",
        "committed token",
    ),
    "answer longer than the region": (change(10, lambda r: r["tokens"].append(1)), 10, "tokens", "4 positions"),
    # truncation
    "truncated last line": (
        lambda records: _lines(records)[:-1] + [_lines(records)[-1][:60]],
        10,
        None,
        "not a JSON object",
    ),
    "cut after a whole line": (lambda records: _lines(records[:-1]), 9, "record", "cut short"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_kind_of_damage_is_refused_naming_the_line_and_field(tmp_path, records, case):
    damage, number, param, words = CASES[case]
    path = _write(tmp_path / "bad.jsonl", damage(json.loads(json.dumps(records))))
    with pytest.raises(ConfigError) as caught:
        read_trace(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{number}: ") and words in message
    assert caught.value.param is not None and f"field `{caught.value.param}`" in message
    if param is not None:
        assert caught.value.param == param


def test_the_valid_trace_reads_back(tmp_path, records):
    first, second = read_trace(_write(tmp_path / "good.jsonl", _lines(records)))
    assert first.num_iterations == 4 and second.num_iterations == 2
    assert second.tokens.tolist() == records[-1]["tokens"] and second.commit_step.tolist() == [0, 0, 1, 1]
    assert "".join(second.pieces[i] for i in range(4)) == "".join(
        p for r in records[7:9] for p in r["committed"][0]["pieces"]
    )


def test_a_huge_gen_length_is_refused_before_anything_is_allocated(tmp_path, records):
    records = json.loads(json.dumps(records))
    records[0]["gen_length"] = records[0]["slots"][-1]["length"] = 10**12
    path = _write(tmp_path / "huge.jsonl", _lines(records))
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=":1: header record, field `gen_length`"):
            read_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000


def test_the_positions_of_all_sequences_together_are_bounded(tmp_path, records, monkeypatch):
    monkeypatch.setattr(trace, "MAX_POSITIONS", 10)  # sequence 0 has 8 positions, sequence 1 another 4
    path = _write(tmp_path / "two.jsonl", _lines(records))
    with pytest.raises(ConfigError, match=r":7: header record, field `gen_length`: is 4; .* all sequences together"):
        read_trace(path)


@pytest.mark.parametrize("text", [b"", b"\n  \n"])
def test_an_empty_trace_is_refused(tmp_path, text):
    (tmp_path / "empty.jsonl").write_bytes(text)
    for read in (read_trace, load_records):
        with pytest.raises(ConfigError, match="the trace is empty") as caught:
            read(tmp_path / "empty.jsonl")
        assert caught.value.param == "trace"


# -- random damage ------------------------------------------------------------------------------------------------

VALUES = st.one_of(
    st.integers(-(10**30), 10**30),
    st.sampled_from([-1, 0, 1, 2, 3, 9, 10**12, 2**63 - 1, 2**63, -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.booleans(),
    st.none(),
    st.lists(st.integers(-2, 20), max_size=4),
    st.dictionaries(st.sampled_from(["slot", "start", "tokens", "x"]), st.integers(-2, 20), max_size=3),
)


def _nodes(value, path=()):
    """Paths to every value inside ``value`` (not ``value`` itself)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, sub in items:
        yield path + (key,)
        yield from _nodes(sub, path + (key,))


def _damage(data, lines):
    how = data.draw(st.sampled_from(["value", "delete", "truncate", "garbage", "lines"]), label="how")
    at = data.draw(st.integers(0, len(lines) - 1), label="line")
    line = lines[at]
    if how in ("value", "delete"):
        record = json.loads(line)
        path = data.draw(st.sampled_from(list(_nodes(record))), label="path")
        parent = record
        for key in path[:-1]:
            parent = parent[key]
        if how == "delete":
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(VALUES, label="value")
        lines[at] = json.dumps(record).encode()
    elif how == "truncate":
        lines[at] = line[: data.draw(st.integers(0, len(line) - 1), label="cut")]
        if data.draw(st.booleans(), label="drop the rest"):
            del lines[at + 1 :]
    elif how == "garbage":
        start = data.draw(st.integers(0, len(line) - 1), label="start")
        junk = data.draw(st.binary(min_size=1, max_size=6), label="junk")
        lines[at] = line[:start] + junk + line[start + len(junk) :]
    else:
        other = data.draw(st.integers(0, len(lines) - 1), label="other line")
        edit = data.draw(st.sampled_from(["drop", "repeat", "swap"]), label="edit")
        if edit == "drop":
            del lines[at]
        elif edit == "repeat":
            lines.insert(other, line)
        else:
            lines[at], lines[other] = lines[other], line
    return lines


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damage_is_read_or_refused_with_a_config_error(tmp_path, records, data):
    path = _write(tmp_path / "damaged.jsonl", _damage(data, _lines(records)))
    try:
        results = read_trace(path)
    except ConfigError as exc:  # any other exception fails the test
        assert str(exc).startswith(f"{path}:") and exc.param
    else:
        for result in results:
            assert result.commit_step.shape[0] == result.partition.gen_length
            assert result.tokens.tolist() == result.region_tokens[: len(result.tokens)]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_reader_refuses_every_record_the_schema_refuses(tmp_path, records, data):
    """The reader's own checks are at least as strict as JSON Schema's (they add 64 bits and finiteness)."""
    record = json.loads(json.dumps(data.draw(st.sampled_from(records), label="record")))
    path = data.draw(st.sampled_from(list(_nodes(record))), label="path")
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans(), label="delete"):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(VALUES, label="value")
    line = _write(tmp_path / "one.jsonl", [json.dumps(record).encode()])
    if next(jsonschema.Draft202012Validator(schema()).iter_errors(record), None) is not None:
        with pytest.raises(ConfigError, match=":1: "):
            load_records(line)
