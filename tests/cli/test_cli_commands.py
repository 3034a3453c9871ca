"""The visualize, bench, eval and help commands; the trace picture."""

import json

import pytest
from PIL import Image

import refusion
from refusion.cli import build_parser, main
from refusion.viz.plot import render_gif, render_png


def test_render_png_and_gif_of_a_trace(tmp_path):
    model = refusion.load_model(None)
    result = refusion.generate("sort qwertyuiop=", model, slot_size=2, slot_threshold=0.999, token_threshold=0.999)
    assert result.num_iterations >= 2
    png = render_png(result, tmp_path / "t.png", tokenizer=model.tokenizer)
    gif = render_gif(result, tmp_path / "t.gif", tokenizer=model.tokenizer)
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] > 200
        colours = image.convert("RGB").getcolors(maxcolors=100000)
        assert len(colours) > 20  # cells in several iteration colours plus text, not a blank canvas
    with Image.open(gif) as image:
        assert image.format == "GIF" and image.n_frames == result.num_iterations


def test_visualize_command(tmp_path, capsys):
    out = tmp_path / "v.png"
    assert main(["visualize", "copy abcdefgh=", "--out", str(out), "--gif", str(tmp_path / "v.gif"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["text"] == "abcdefgh" and out.exists() and len(report["files"]) == 2


def test_bench_command_prints_rows(capsys):
    assert main(["bench", "--per-task", "1", "--method", "model", "--method", "llada", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)[
        "rows"
    ]  # a reproducible record (tests/measure/test_reproducible_records.py)
    assert [r["method"] for r in rows] == ["AR: transformers generate", "model", "llada"]
    assert all(r["examples"] == 6 and r["forwards"] > 0 for r in rows)


def test_bench_estimates_gpu_throughput_with_a_cost_model(capsys):
    assert main(["bench", "--per-task", "1", "--method", "model", "--cost-model", "qwen3-8b@h100"]) == 0
    out = capsys.readouterr().out
    assert "est. tok/s qwen3-8b@h100" in out
    model_row = next(line for line in out.splitlines() if line.startswith("model "))
    assert model_row.split()[-1].endswith("x") and float(model_row.split()[-1][:-1]) > 1.0  # fewer forwards, faster
    assert main(["bench", "--cost-model", "qwen3-8b@tpu"]) == 2
    assert "Unknown cost-model GPU 'tpu'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "visualize", "bench", "eval", "reproduce", "train", "plugins"])
def test_every_command_explains_its_options(command, capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "--json" in text or command == "train"
    for line in text.splitlines():
        if line.strip().startswith("--") and "  " in line.strip():
            assert len(line.strip().split("  ", 1)[1].strip()) > 3, f"option without help: {line}"


def test_output_cut_short_by_a_closed_pipe_is_not_an_error(monkeypatch, capsys):
    import io
    import sys

    class ClosedPipe(io.StringIO):  # what stdout is after `| head -1` has read its line
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["plugins", "--json"]) == 0
    assert "Broken pipe" not in capsys.readouterr().err


def test_the_summary_line_counts_iterations_in_good_english(capsys):
    assert main(["generate", "rev ab="]) == 0
    summary = capsys.readouterr().err.strip().splitlines()[-1]
    iterations = int(summary.split(" iteration")[0].rsplit(" ", 1)[1])
    assert summary.endswith("1 iteration]") if iterations == 1 else summary.endswith(" iterations]")


@pytest.mark.parametrize("n, word", [(0, "iterations"), (1, "iteration"), (2, "iterations"), (11, "iterations")])
def test_counts_in_words_agree_with_their_number(n, word):
    from refusion.wording import counted

    assert counted(n, "iteration") == f"{n} {word}"
    assert counted(n, "query", "queries") == f"{n} {'query' if n == 1 else 'queries'}"


def test_every_summary_line_says_1_in_the_singular(tmp_path, capsys):
    """A one-token answer in one iteration: generate's and visualize's lines say 1 token, 1 iteration."""
    assert main(["generate", "rev a=", "--gen-length", "1"]) == 0
    generate = capsys.readouterr().err.strip().splitlines()[-1]
    assert main(["visualize", "rev a=", "--gen-length", "1", "--out", str(tmp_path / "t.png")]) == 0
    visualize = capsys.readouterr().out.strip()
    for line in (generate, visualize):
        assert "1 iteration," in line or line.endswith("1 iteration]"), line
        assert "1 iterations" not in line and "1 tokens" not in line and " 1 forwards" not in line
