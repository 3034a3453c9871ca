"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor, no unresolved
cross-reference, no page left out of the nav, no docstring the API reference cannot render."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mkdocs_build_strict_passes(tmp_path):
    pytest.importorskip("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").exists()


def test_the_trace_picture_is_shown_with_the_command_that_made_it():
    """Wherever docs/trace.png is shown, the command next to it is the same one (and it writes that file)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commands = {}
    for page in pages:
        text = page.read_text()
        if re.search(r"!\[[^\]]*\]\((?:docs/)?trace\.png\)", text):
            commands[page.name] = re.findall(r"^refusion visualize .*--out docs/trace\.png.*$", text, re.M)
    assert commands
    assert all(len(found) == 1 for found in commands.values()), commands
    assert len({found[0] for found in commands.values()}) == 1, commands


def test_both_tables_of_the_peers_arguments_have_a_row_for_every_peer_preset():
    """docs/models.md's and docs/strategies.md's tables of peer arguments name every preset that reproduces a peer
    (models.md's once lacked WINO, LLaDA 2.x and DiffusionGemma)."""
    from refusion.config import PRESETS

    peers = {name for name, spec in PRESETS.items() if spec.peer is not None}
    for page in ("models.md", "strategies.md"):
        text = (ROOT / "docs" / page).read_text()
        table = text[text.index("| peer function | preset | arguments -> refusion |") :].split("\n\n")[0]
        named = {n for row in table.splitlines()[2:] for n in re.findall(r"`([^`]+)`", row.split(" | ")[1])}
        evals = {"gsm8k", "mbpp", "humaneval", "math", "gpqa", "arc-c", "mmlu-pro"}  # the row says `paper`, ...
        assert peers - evals <= named, (page, peers - evals - named)
