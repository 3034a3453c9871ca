"""``refusion batch`` never loses or damages data (issue 30): the output is checked before anything is written or
cut, ids the batch makes up cannot collide with given ones, any id is written, prompts are bounded before they are
tokenised, errors name the row's own field, progress and summary agree, and a finished run loads no model."""

from __future__ import annotations

import json
import os
import time

import pytest

import refusion
from refusion.batch import embedded as batch_embedded
from refusion.batch import worker as batch_worker
from refusion.batch.embedded import run_batch
from refusion.cli import main
from refusion.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore::refusion.errors.RefusionWarning")


@pytest.fixture(scope="module")
def model():
    return refusion.load_model()


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: everything here is refused (or skipped) before that."""
    monkeypatch.setattr(batch_worker, "load", lambda given: pytest.fail("the model was loaded"))


def write(path, *rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def results(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("refusion: error: ") and "Traceback" not in err, err
    return err


# -- the output is checked before anything is written or cut ---------------------------------------------------------


def test_an_output_hard_linked_to_the_input_is_refused_and_the_input_kept(tmp_path, capsys, no_model):
    source = write(tmp_path / "in.jsonl", {"id": "a", "prompt": "rev ab="})
    with open(source, "a") as f:
        f.write('{"id": "b", "prompt": "rev ab="}')  # a last line without its newline
    before = source.read_bytes()
    os.link(source, tmp_path / "out.jsonl")
    err = refused(capsys, ["batch", str(source), "--out", str(tmp_path / "out.jsonl"), "--no-progress"])
    assert "`--out`" in err and "is the input file" in err
    assert source.read_bytes() == before
    os.symlink(source, tmp_path / "link.jsonl")
    assert "is the input file" in refused(capsys, ["batch", str(source), "--out", str(tmp_path / "link.jsonl")])
    assert source.read_bytes() == before


def test_an_output_that_holds_no_result_rows_is_refused_untouched(tmp_path, capsys, no_model):
    source = write(tmp_path / "in.jsonl", {"id": "a", "prompt": "rev ab="})
    notes = tmp_path / "notes.txt"
    for text in ("my notes\nthe last line, no newline", "only one line, no newline", '{"id": 5}\n{"id": "x", "te'):
        notes.write_text(text)
        err = refused(capsys, ["batch", str(source), "--out", str(notes), "--no-progress"])
        assert "`--out`" in err and "not a result row" in err and "left as it is" in err
        assert notes.read_text() == text


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_an_output_that_is_not_a_regular_file_is_refused_naming_out(tmp_path, capsys, no_model, kind):
    source = write(tmp_path / "in.jsonl", {"id": "a", "prompt": "rev ab="})
    if kind == "device":
        out = "/dev/zero"  # read until MemoryError before
    elif kind == "fifo":
        out = str(tmp_path / "pipe")
        os.mkfifo(out)
    else:
        out = str(tmp_path)
    err = refused(capsys, ["batch", str(source), "--out", out, "--no-progress"])
    assert f"`--out` {out!r} is" in err, err
    with pytest.raises(ConfigError) as info:
        run_batch(source, out, progress=False)
    assert info.value.param == "out"


def test_a_row_cut_short_by_a_crash_is_cut_and_a_whole_last_row_kept(tmp_path, model):
    source = write(
        tmp_path / "in.jsonl",
        {"id": "a", "prompt": "rev ab=", "gen_length": 4},
        {"id": "b", "prompt": "rev ab=", "gen_length": 4},
    )
    out = tmp_path / "out.jsonl"
    run_batch(source, out, model=model, progress=False)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0].rstrip("\n"))  # a whole row, its newline lost
    assert run_batch(source, out, model=model, progress=False).skipped == 1
    assert sorted(r["id"] for r in results(out)) == ["a", "b"]
    out.write_text(lines[0] + lines[1][:20])  # a row cut short mid-write
    summary = run_batch(source, out, model=model, progress=False)
    assert (summary.rows, summary.skipped) == (1, 1) and sorted(r["id"] for r in results(out)) == ["a", "b"]


# -- ids -----------------------------------------------------------------------------------------------------------


def test_an_id_the_batch_makes_up_never_collides_with_a_given_one(tmp_path, model, monkeypatch):
    source = write(
        tmp_path / "in.jsonl",
        {"id": "line-3", "prompt": "rev ab=", "gen_length": 4},
        {"id": "ok", "prompt": "copy ab=", "gen_length": 4},
        "not json",
    )
    out = tmp_path / "out.jsonl"
    summary = run_batch(source, out, model=model, progress=False)
    rows = {(r["id"], r["line"]): r for r in results(out)}
    assert (summary.rows, summary.errors) == (3, 1)
    assert rows[("line-3", 1)]["error"] is None and rows[("line-3", 1)]["tokens"]
    assert rows[(None, 3)]["error"].startswith("row: ")
    monkeypatch.setattr(batch_worker, "load", lambda given: pytest.fail("the model was loaded"))
    again = run_batch(source, out, model=model, progress=False)  # every row is there: nothing runs, nothing loads
    assert (again.rows, again.skipped) == (0, 3) and len(results(out)) == 3


def test_an_id_that_is_not_valid_unicode_is_written_and_resumed(tmp_path, model):
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"id": "\\ud800x", "prompt": "rev ab=", "gen_length": 4}\n{"id": "ok", "prompt": "rev ab=", "gen_length": 4}\n'
    )
    out = tmp_path / "out.jsonl"
    assert main(["batch", str(source), "--out", str(out), "--no-progress"]) == 0
    out.read_bytes().decode("utf-8")  # the file is UTF-8 (the id is a JSON escape)
    assert {r["id"] for r in results(out)} == {"\ud800x", "ok"}
    assert run_batch(source, out, model=model, progress=False).skipped == 2
    assert (
        run_batch([{"id": "\udc00", "prompt": "rev ab=", "gen_length": 4}], out, model=model, progress=False).rows == 1
    )  # the Python API too


# -- prompts -------------------------------------------------------------------------------------------------------


def test_prompt_errors_name_the_row_field_and_long_text_is_never_tokenised(tmp_path, model, monkeypatch):
    tokenizer = model.tokenizer
    calls = []
    original = type(tokenizer).__call__

    def counting(self, text, *args, **kwargs):
        calls.append(len(text) if isinstance(text, str) else 0)
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", counting)
    source = write(
        tmp_path / "in.jsonl",
        {"id": "ids", "prompt": [3, 999999]},
        {"id": "long", "prompt": "rev " + "a" * 300_000 + "="},
        {"id": "chat", "messages": [{"role": "user", "content": "a" * 300_000}]},
    )
    out = tmp_path / "out.jsonl"
    run_batch(source, out, model=model, progress=False)
    rows = {r["id"]: r for r in results(out)}
    assert rows["ids"]["error"].startswith("prompt: `prompt` must be token ids in [0, 48)"), rows["ids"]
    assert rows["long"]["error"].startswith("prompt: `prompt` holds 300005 characters"), rows["long"]
    assert rows["chat"]["error"].startswith("messages: "), rows["chat"]
    assert max(calls, default=0) < 1000  # the long texts were refused before the tokenizer saw them


def test_max_tokens_is_the_row_and_run_spelling_of_gen_length(tmp_path, model):
    source = write(
        tmp_path / "in.jsonl",
        {"id": "a", "prompt": "rev ab=", "max_tokens": 4},
        {"id": "b", "prompt": "rev ab=", "max_tokens": 4, "gen_length": 4},
    )
    out = tmp_path / "out.jsonl"
    run_batch(source, out, model=model, progress=False, max_tokens=8)
    rows = {r["id"]: r for r in results(out)}
    assert len(rows["a"]["tokens"]) <= 4 and rows["a"]["error"] is None
    assert rows["b"]["error"].startswith("max_tokens: ")


# -- the run -------------------------------------------------------------------------------------------------------


def test_the_progress_bar_and_the_summary_count_the_same_tokens_per_second(tmp_path, model, monkeypatch):
    postfixes = []

    class Bar:
        def update(self, n):
            pass

        def close(self):
            pass

        def set_postfix_str(self, text, refresh=True):
            postfixes.append((text, time.monotonic()))

    def slow_load(given):
        time.sleep(1.0)  # a model that takes a second to load
        return model

    monkeypatch.setattr(batch_embedded, "progress_bar", lambda total, show: Bar())
    monkeypatch.setattr(batch_worker, "load", slow_load)
    source = write(tmp_path / "in.jsonl", *[{"id": f"r{i}", "prompt": "rev ab=", "gen_length": 8} for i in range(6)])
    summary = run_batch(source, tmp_path / "out.jsonl", progress=False)
    assert summary.load_seconds >= 1.0
    assert summary.tokens_per_second == pytest.approx(summary.tokens / (summary.seconds - summary.load_seconds))
    shown = float(postfixes[-1][0].split(" tok/s")[0])
    assert shown == pytest.approx(summary.tokens_per_second, rel=0.35)  # the last bar update and the summary


def test_a_rerun_with_nothing_left_loads_no_model(tmp_path, model, capsys, monkeypatch):
    source = write(tmp_path / "in.jsonl", {"id": "a", "prompt": "rev ab=", "gen_length": 4}, "not json")
    out = tmp_path / "out.jsonl"
    run_batch(source, out, model=model, progress=False)
    monkeypatch.setattr(batch_worker, "load", lambda given: pytest.fail("the model was loaded"))
    assert main(["batch", str(source), "--out", str(out), "--no-progress", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rows"], summary["skipped"], summary["load_seconds"]) == (0, 2, 0)


def test_the_batch_budget_is_max_batch_tokens_and_max_tokens_the_answer_length(tmp_path, model, monkeypatch):
    seen = {}
    real = batch_worker.BatchWorker.__init__

    def spy(self, given, **options):
        seen.update(options)
        real(self, model, **options)

    monkeypatch.setattr(batch_worker.BatchWorker, "__init__", spy)
    source = write(tmp_path / "in.jsonl", {"id": "a", "prompt": "rev ab="})
    assert (
        main(
            [
                "batch",
                str(source),
                "--out",
                str(tmp_path / "out.jsonl"),
                "--no-progress",
                "--max-batch-tokens",
                "512",
                "--max-tokens",
                "6",
            ]
        )
        == 0
    )
    assert seen["runtime"].max_batch_tokens == 512 and seen["gen_length"] == 6
    assert len(results(tmp_path / "out.jsonl")[0]["tokens"]) <= 6
