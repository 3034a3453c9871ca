#!/usr/bin/env python3
"""Make (or --check) tests/fixtures/peers/aup/golden.json from d3LLM's own AUP function (hao-ai-lab/d3LLM).

Any Python 3 with PyYAML; it never imports `refusion`:

    python tools/peer_fixtures/aup.py --d3llm d3LLM --out tests/fixtures/peers/aup [--check]

`AUP_leaderboard/aup_utils.py::get_aup` is called, as `AUP_leaderboard/main.py` calls it, on every task and method
of the authors' leaderboard data (`data_llada.yaml`, `data_dream.yaml`, `data_dream_coder.yaml`: y_max the best
accuracy of every method on the task), and on hand-made curves that reach the corners of the rule (points of equal
tokens per forward, points dropped by the 5-point filter, a curve the authors' assertion refuses). golden.json
records each curve, its y_max and the authors' AUP (or that they refused it), with the checkout's HEAD and the
sha256 of every file read. See tests/fixtures/peers/README.md ("aup/").
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys

DATA = ("data_llada.yaml", "data_dream.yaml", "data_dream_coder.yaml")
#: hand-made curves: (name, points, y_max)
CORNERS = (
    ("one point", [[2.5, 80.0]], 90.0),
    ("unsorted", [[4.0, 70.0], [1.0, 72.0], [2.0, 71.5]], 75.0),
    ("equal tokens per forward keep their order", [[1.0, 60.0], [3.0, 58.0], [3.0, 59.0], [5.0, 57.5]], 61.0),
    ("a middle point below the 5-point floor is dropped", [[1.0, 50.0], [2.0, 44.0], [3.0, 46.0]], 52.0),
    ("above the best accuracy the weight is capped at 1", [[1.0, 80.0], [2.0, 85.0]], 82.0),
    ("the most parallel point lost more than 5 points", [[1.0, 70.0], [2.0, 68.0], [6.0, 60.0]], 72.0),
    ("accuracy at y_max everywhere", [[1.0, 40.0], [3.0, 40.0], [7.5, 40.0]], 40.0),
)


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def head(repo: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def authors_aup(get_aup, rho, y, y_max):
    """The authors' AUP, or None where their assertion refuses the curve (their warning print silenced)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return get_aup(list(rho), list(y), y_max)
    except AssertionError:
        return None


def make(d3llm: str) -> dict:
    import yaml

    board = os.path.join(d3llm, "AUP_leaderboard")
    sys.path.insert(0, board)
    from aup_utils import get_aup

    curves = []
    for name in DATA:
        with open(os.path.join(board, name)) as f:
            data = yaml.safe_load(f)
        for task, methods in data.items():
            y_max = max(y for pairs in methods.values() for _, y in pairs)
            for method, pairs in methods.items():
                rho, y = zip(*pairs)
                curves.append(
                    {
                        "source": f"{name}:{task}:{method}",
                        "points": [[float(r), float(a)] for r, a in pairs],
                        "y_max": float(y_max),
                        "aup": authors_aup(get_aup, rho, y, y_max),
                    }
                )
    for name, points, y_max in CORNERS:
        rho, y = zip(*points)
        curves.append({"source": name, "points": points, "y_max": y_max, "aup": authors_aup(get_aup, rho, y, y_max)})
    files = ["AUP_leaderboard/aup_utils.py", *(f"AUP_leaderboard/{n}" for n in DATA)]
    return {
        "peer": "hao-ai-lab/d3LLM",
        "commit": head(d3llm),
        "peer_files": {f: sha256(os.path.join(d3llm, f)) for f in files},
        "call": "get_aup(rho, y, y_max) with alpha=3.0, y_min_offset=5.0; null where its assertion refuses the curve",
        "curves": curves,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d3llm", required=True, help="checkout of hao-ai-lab/d3LLM (AUP_leaderboard/)")
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/peers/aup")
    ap.add_argument("--check", action="store_true", help="compare with --out/golden.json (exit 1 on a difference)")
    args = ap.parse_args(argv)
    golden = make(args.d3llm)
    path = os.path.join(args.out, "golden.json")
    text = json.dumps(golden, indent=1) + "\n"
    if args.check:
        with open(path) as f:
            same = f.read() == text
        print("aup: same" if same else "aup: DIFFERENT")
        return 0 if same else 1
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(f"aup: {len(golden['curves'])} curves -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
