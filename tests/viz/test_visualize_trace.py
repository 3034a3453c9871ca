"""`refusion visualize` draws a decode from a prompt or from a trace file, as PNG, GIF or one HTML page."""

import re

from PIL import Image

from refusion.cli import main
from refusion.measure.trace import read_trace


def test_visualize_writes_a_trace_and_draws_it_back_as_png_and_html(tmp_path, capsys):
    trace, fresh = tmp_path / "v.jsonl", tmp_path / "fresh.html"
    args = ["sort qwertyuiop=", "--slot-size", "2", "--slot-threshold", "0.999", "--token-threshold", "0.999"]
    assert main(["visualize", *args, "--trace", str(trace), "--html", str(fresh)]) == 0
    (result,) = read_trace(trace)
    assert result.num_iterations >= 2
    png, page = tmp_path / "back.png", tmp_path / "back.html"
    assert main(["visualize", "--from-trace", str(trace), "--out", str(png), "--html", str(page)]) == 0
    assert "eiopqrtuwy" in capsys.readouterr().out
    with Image.open(png) as image:
        assert image.format == "PNG" and len(image.convert("RGB").getcolors(maxcolors=100000)) > 20
    text = page.read_text()
    assert not re.search(r"(src|href)=|https?://", text)  # self-contained: nothing to fetch
    committed = int((result.commit_step >= 0).sum())
    assert text.count('class="cell" data-step=') == committed == len(result.tokens)
    assert text.count("<tr>") == result.num_iterations + 1  # header row + one per iteration
    assert ">EOS</span>" in text and f'max="{result.num_iterations - 1}"' in text
    assert fresh.read_text().count('class="cell" data-step=') == committed


def test_visualize_needs_exactly_one_source(tmp_path, capsys):
    assert main(["visualize"]) == 2
    assert "either a PROMPT or `--from-trace FILE`" in capsys.readouterr().err
    assert main(["visualize", "--from-trace", str(tmp_path / "none.jsonl")]) == 2
    assert "could not be read" in capsys.readouterr().err
