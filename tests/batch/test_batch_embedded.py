"""``refusion batch`` in one process: rows decode as ``refusion.generate`` would, a rerun resumes, bad rows become
error rows naming the field, options are refused before the model loads."""

import json
import warnings

import pytest

import refusion
from refusion.batch import output as batch_output
from refusion.batch import worker as batch_worker
from refusion.batch.embedded import run_batch
from refusion.batch.rows import parse_line
from refusion.cli import main
from refusion.errors import ConfigError, RefusionWarning, RowError

#: rows without `gen_length` under the 128-token "paper" preset get the longest length that fits, with a note
pytestmark = pytest.mark.filterwarnings("ignore::refusion.errors.RefusionWarning")

PROMPTS = ["rev hello=", "copy abc=", "add 12+34=", "sort dcba=", "rev abc=", "copy xyz=", "add 3+4=", "sort cab="]
#: each row's own options, besides id and prompt: mixed lengths, seeds, sampling, parts and presets
OPTIONS = [
    {},
    {"seed": 3, "temperature": 0.7},
    {"gen_length": 8},
    {"gen_length": 16, "selector": "topk", "params": {"k": 2}},
    {"seed": 11, "temperature": 1.0, "top_k": 5},
    {"temperature": 0.9, "top_p": 0.8, "seed": 5, "gen_length": 12},
    {"preset": "paper", "params": ["token_threshold=0.8", "slot_size=2"]},
    {"seed": 7, "temperature": 0.5, "selector": "leftmost"},
    {"gen_length": 20, "params": {"slot_threshold": 0.3}},
    {"seed": 1, "temperature": 0.8, "infiller": "greedy-verify"},
    {"partitioner": "semi-ar", "gen_length": 16},
]


def make_rows(count):
    return [{"id": f"r{i}", "prompt": PROMPTS[i % len(PROMPTS)], **OPTIONS[i % len(OPTIONS)]} for i in range(count)]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_rows(path):
    """The result rows by key: their id, or their input line for a row without a usable id."""
    return {
        row["id"] if row["id"] is not None else row["line"]: row
        for row in map(json.loads, path.read_text().splitlines())
    }


def expected_tokens(model, row, defaults=None):
    """The tokens ``refusion.generate`` gives for the row alone, with the run's defaults under the row's fields."""
    options = dict(defaults or {})
    options.update({k: v for k, v in row.items() if k not in ("id", "prompt", "params")})
    params = row.get("params", {})
    if isinstance(params, list):
        params = dict(p.split("=") for p in params)
        params = {k: float(v) if "." in v else int(v) for k, v in params.items()}
    options.update(params)
    return refusion.generate(row["prompt"], model, **options).tokens.tolist()


@pytest.fixture(scope="module")
def model():
    return refusion.load_model()


def test_every_row_decodes_as_generate_would_alone(tmp_path, model):
    rows = make_rows(22)
    defaults = {"seed": 9}  # under every row (rows with their own seed override it)
    summary = run_batch(
        write_jsonl(tmp_path / "in.jsonl", rows),
        tmp_path / "out.jsonl",
        model=model,
        max_rows=6,
        progress=False,
        **defaults,
    )
    out = read_rows(tmp_path / "out.jsonl")
    assert (summary.rows, summary.errors, summary.skipped) == (22, 0, 0)
    assert set(out) == {row["id"] for row in rows}
    for row in rows:
        got = out[row["id"]]
        assert got["error"] is None, got
        assert got["tokens"] == expected_tokens(model, row, defaults), row
        assert got["forwards"] >= 1 and got["text"] is not None
    assert summary.tokens == sum(len(r["tokens"]) for r in out.values())


def test_an_interrupted_run_resumes_to_the_same_file(tmp_path, model, monkeypatch):
    rows = make_rows(9)
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    run_batch(source, tmp_path / "whole.jsonl", model=model, max_rows=4, progress=False)
    whole = read_rows(tmp_path / "whole.jsonl")

    original, written = batch_output.ResultWriter.write, []

    def interrupted(self, row):
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(row["id"])
        return original(self, row)

    out = tmp_path / "out.jsonl"
    monkeypatch.setattr(batch_output.ResultWriter, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_batch(source, out, model=model, max_rows=4, progress=False)
    monkeypatch.setattr(batch_output.ResultWriter, "write", original)
    lines = out.read_text().splitlines(keepends=True)
    assert len(lines) == 3 and all(line.endswith("\n") for line in lines)
    with open(out, "a") as f:  # a crash in the middle of a write: the next run cuts it off
        f.write('{"id": "r8", "text": "ab')

    summary = run_batch(source, out, model=model, max_rows=4, progress=False)
    assert (summary.rows, summary.skipped) == (6, 3)
    final = out.read_text().splitlines()
    assert len(final) == 9 and sorted(json.loads(line)["id"] for line in final) == sorted(whole)
    assert read_rows(out) == whole
    again = run_batch(source, out, model=model, progress=False)  # nothing left to do
    assert (again.rows, again.skipped) == (0, 9) and out.read_text().splitlines() == final


BAD_ROWS = [
    (2, "not json at all", "row"),
    (3, "[1, 2]", "row"),
    ("u", {"id": "u", "prompt": "rev ab=", "colour": "red"}, "colour"),
    ("t", {"id": "t", "prompt": "rev ab=", "seed": "7"}, "seed"),
    (6, {"id": True, "prompt": "rev ab="}, "id"),
    ("m", {"id": "m"}, "prompt"),
    ("s", {"id": "s", "prompt": "rev <|mask|>="}, "prompt"),
    ("e", {"id": "e", "prompt": "copy a<|endoftext|>="}, "prompt"),
    ("x", {"id": "x", "prompt": "rev ab=", "selector": "nope"}, "selector"),
    ("y", {"id": "y", "prompt": "rev ab=", "selector": "os.path:join"}, "selector"),
    ("z", {"id": "z", "prompt": "rev ab=", "gen_length": 0}, "gen_length"),
    (13, {"id": "ok1", "prompt": "sort ba="}, "id"),
    ("c", {"id": "c", "messages": [{"role": "user", "content": "rev ab="}]}, "messages"),
    ("k", {"id": "k", "prompt": "rev ab=", "params": {"k": 2}}, "k"),
    ("p", {"id": "p", "prompt": "rev ab=", "params": {"seed": 2}}, "params.seed"),
    ("q", {"id": "q", "prompt": "rev ab=", "temperature": -1}, "temperature"),
]


def test_bad_rows_become_error_rows_naming_the_field_and_the_run_goes_on(tmp_path, model):
    good = [{"id": "ok1", "prompt": "rev hello="}, {"id": "ok2", "prompt": "copy abc=", "seed": 2}]
    lines = [
        good[0],
        *[row for _, row, _ in BAD_ROWS[:11]],
        BAD_ROWS[11][1],
        *[row for _, row, _ in BAD_ROWS[12:]],
        good[1],
    ]
    summary = run_batch(write_jsonl(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl", model=model, progress=False)
    out = read_rows(tmp_path / "out.jsonl")
    for row_id, _, field in BAD_ROWS:
        assert out[row_id]["error"].startswith(f"{field}: "), (row_id, out[row_id])
        assert out[row_id]["tokens"] is None
    for row in good:
        assert out[row["id"]]["error"] is None
        assert out[row["id"]]["tokens"] == expected_tokens(model, row)
    assert (summary.rows, summary.errors) == (len(BAD_ROWS) + 2, len(BAD_ROWS))


def test_parse_line_names_the_row_and_the_field():
    row = parse_line('{"id": 7, "prompt": [5, 6], "params": ["k=2"], "selector": "topk"}', 1)
    assert (row.id, row.prompt, row.chat, row.options) == ("7", [5, 6], False, {"selector": "topk", "k": 2})
    with pytest.raises(RowError) as caught:
        parse_line('{"id": "a", "prompt": "x", "infiller": "pkg.mod:Infill"}', 4)
    assert (caught.value.row_id, caught.value.param) == ("a", "infiller")
    assert parse_line('{"id": "a", "prompt": "x", "infiller": "pkg.mod:Infill"}', 4, allow_imports=True).options == {
        "infiller": "pkg.mod:Infill"
    }
    with pytest.raises(RowError) as caught:
        parse_line('{"prompt": "x"}', 9)
    assert (caught.value.row_id, caught.value.line, caught.value.param) == (None, 9, "id")


def test_the_command_writes_results_and_a_json_summary_then_resumes(tmp_path, capsys, monkeypatch):
    model = refusion.load_model()
    monkeypatch.setattr(batch_worker, "load", lambda given: model)  # the flags' model, loaded once for the test
    source = write_jsonl(tmp_path / "in.jsonl", make_rows(4))
    out = tmp_path / "out.jsonl"
    argv = [
        "batch",
        str(source),
        "--out",
        str(out),
        "--json",
        "--no-progress",
        "--max-rows",
        "2",
        "--seed",
        "4",
        "--temperature",
        "0.5",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rows"], summary["errors"], summary["skipped"]) == (4, 0, 0)
    for row in make_rows(4):
        assert read_rows(out)[row["id"]]["tokens"] == expected_tokens(model, row, {"seed": 4, "temperature": 0.5})
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == 4
    assert refusion.run_batch([{"id": "more", "prompt": "rev ab="}], out, model=model, progress=False).rows == 1


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--max-rows", "0"], "--max-rows"),
        (["--max-tokens", "-5"], "--max-tokens"),
        (["--workers", "2"], "--workers"),
        (["--ray", "--workers", "0"], "--workers"),
        (["--ray", "--gpus-per-worker", "-1"], "--gpus-per-worker"),
        (["--ray", "--cpus-per-worker", "0"], "--cpus-per-worker"),
        (["--gen-length", "0"], "--gen-length"),
        (["--selector", "nope"], "selector"),
        (["--temperature", "-1"], "temperature"),
        (["--model", "/no/such/checkpoint"], "model"),
        (["--missing-input"], "INPUT"),
        (["--out-in-missing-folder"], "--out"),
        (["--out-is-input"], "--out"),
    ],
)
def test_options_are_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, flags, named):
    def refuse(given):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(batch_worker, "load", refuse)
    source = write_jsonl(tmp_path / "in.jsonl", make_rows(1))
    out = str(tmp_path / "out.jsonl")
    if flags == ["--missing-input"]:
        source, flags = tmp_path / "missing.jsonl", []
    elif flags == ["--out-in-missing-folder"]:
        out, flags = str(tmp_path / "nowhere" / "out.jsonl"), []
    elif flags == ["--out-is-input"]:
        out, flags = str(source), []
    assert main(["batch", str(source), "--out", out, "--no-progress", *flags]) == 2
    error = capsys.readouterr().err
    assert error.startswith("refusion: error: ") and named in error, error


def test_rows_reuse_shared_prompt_prefixes_unless_told_not_to(tmp_path, model, monkeypatch):
    from refusion.generator import Generator

    engines = []
    original = Generator.__init__

    def keep_engine(self, *args, **kwargs):
        original(self, *args, **kwargs)
        engines.append(self.engine)

    monkeypatch.setattr(Generator, "__init__", keep_engine)
    rows = [{"id": str(i), "prompt": f"copy abcdefghijklmnop{c}="} for i, c in enumerate("qrst")]  # one shared page
    for reuse in (None, False):
        run_batch(rows, tmp_path / f"{reuse}.jsonl", model=model, progress=False, prefix_cache=reuse)
    on, off = engines
    assert on.prefixes.stats.hits == 3 * 16 and off.prefixes is None  # rows 2-4 waited a step for row 1's page
    with_reuse, without = read_rows(tmp_path / "None.jsonl"), read_rows(tmp_path / "False.jsonl")
    for row in rows:
        assert with_reuse[row["id"]]["tokens"] == without[row["id"]]["tokens"] == expected_tokens(model, row, {})
    with pytest.raises(ConfigError, match="prefix_cache"):
        run_batch(rows, tmp_path / "bad.jsonl", model=model, progress=False, prefix_cache="no")


def test_the_serve_and_batch_commands_turn_prefix_reuse_off_by_flag():
    from refusion.cli import build_parser
    from refusion.cli.serve import server_options

    parser = build_parser()
    assert server_options(parser.parse_args(["serve"]))[0]["prefix_cache"] is None
    assert server_options(parser.parse_args(["serve", "--no-prefix-cache"]))[0]["prefix_cache"] is False
    assert parser.parse_args(["batch", "in.jsonl", "--out", "o.jsonl", "--no-prefix-cache"]).prefix_cache is False


def test_rows_too_large_for_kv_memory_are_error_rows_naming_it_and_the_flag_sets_it(tmp_path, model):
    from refusion.cli import build_parser
    from refusion.cli.serve import server_options
    from refusion.engines.branch import BranchEngine

    page = BranchEngine(model, kv_memory=1).kv.pool.page_bytes
    rows = [
        {"id": "small", "prompt": "rev hello=", "gen_length": 8},
        {"id": "big", "prompt": "rev hello=", "gen_length": 64},
    ]
    run_batch(rows, tmp_path / "out.jsonl", model=model, progress=False, kv_memory=8 * page)  # 8 pages of 16 tokens
    out = read_rows(tmp_path / "out.jsonl")
    assert out["small"]["error"] is None and out["small"]["tokens"] == expected_tokens(model, rows[0])
    assert "kv_memory" in out["big"]["error"] and out["big"]["tokens"] is None
    with pytest.raises(ConfigError, match="kv_memory"):
        run_batch(rows, tmp_path / "bad.jsonl", model=model, progress=False, kv_memory=0)

    parser = build_parser()
    assert parser.parse_args(["batch", "in.jsonl", "--out", "o.jsonl", "--kv-memory", "2GiB"]).kv_memory == 2 << 30
    assert server_options(parser.parse_args(["serve", "--kv-memory", "512MiB"]))[0]["kv_memory"] == 512 << 20


def test_a_fitted_length_warning_points_at_the_line_that_called_refusion(model, tmp_path):
    prompt = "rev " + "a" * (model.max_positions - 15) + "="  # leaves 10 positions, fewer than the preset's length
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"id": 1, "prompt": prompt}])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_batch(rows, tmp_path / "out.jsonl", model=model, progress=False)
        refusion.generate(prompt, model)
    fitted = [w for w in caught if w.category is RefusionWarning and "`gen_length` not given" in str(w.message)]
    assert len(fitted) == 2 and {w.filename for w in fitted} == {__file__}
