"""benchmarks/diffusion_gemma.py runs on the fixture checkpoint and finds the same tokens in every competitor."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "peers" / "diffusion_gemma"


def test_the_benchmark_runs_and_every_competitor_gives_transformers_tokens():
    args = ["--model", str(FIXTURE), "--prompts", "2", "--prompt-length", "6", "--new-tokens", "32", "--steps", "3"]
    done = subprocess.run(
        [sys.executable, "benchmarks/diffusion_gemma.py", *args, "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "same tokens: yes" in done.stdout
    assert done.stdout.count("| refusion, one") == 2
