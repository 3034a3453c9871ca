"""benchmarks/gpu_session.py, the one command of a GPU lease, runs end to end on the CPU (``--smoke``).

The session runs here without the GPU tier (``--skip-tier``); running the tier on the CPU
(``REFUSION_GPU_TIER_DEVICE=cpu``) takes a minute or two and is asked for with
``REFUSION_TEST_GPU_TIER_ON_CPU=1``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def session(tmp_path, *extra, timeout=300):
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_session.py", "--smoke", "--out", str(tmp_path), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((tmp_path / "summary.json").read_text()), done.stdout


def test_the_session_writes_its_files_and_the_benchmark_json(tmp_path):
    summary, stdout = session(tmp_path, "--skip-tier")
    assert {p.name for p in tmp_path.iterdir()} == {"session.log", "summary.json", "gpu-smoke.json", "profile.txt"}
    assert summary["steps"]["tier"] == {"skipped": "--skip-tier"}
    bench = summary["steps"]["bench"]
    assert bench["exit"] == 0 and bench["headline"]["qwen3-8b batch 1 paper tok/s"] > 0
    result = json.loads((tmp_path / "gpu-smoke.json").read_text())
    assert {"setup", "kernels", "decode", "profile", "host_reads", "compile"} <= set(result["sections"])
    assert "=== summary" in stdout and len(list(tmp_path.iterdir())) <= 8  # the device tool returns 8 files at most


def test_a_step_stopped_at_its_limit_is_interrupted_first_so_it_can_write_its_report(tmp_path):
    """pytest writes its JUnit report on an interrupt: a step over its limit gets SIGINT, then SIGKILL."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_session import Session

    script = (
        "import signal, sys, time\n"
        "def stop(*a):\n open(sys.argv[1], 'w').write('report'); sys.exit(2)\n"
        "signal.signal(signal.SIGINT, stop)\nprint('started', flush=True)\ntime.sleep(60)\n"
    )
    run = Session(tmp_path, 60)
    assert run.run("slow", [sys.executable, "-c", script, str(tmp_path / "report")], 2) is None
    assert (tmp_path / "report").read_text() == "report"
    assert run.summary["steps"]["slow"]["exit"] is None and run.summary["steps"]["slow"]["seconds"] < 15
    assert run.run("quick", [sys.executable, "-c", "print('done')"], 30) == 0
    run.finish()
    log = (tmp_path / "session.log").read_text()
    assert "started" in log and "stopped at its limit" in log and "done" in log


@pytest.mark.skipif(
    not os.environ.get("REFUSION_TEST_GPU_TIER_ON_CPU"),
    reason="set REFUSION_TEST_GPU_TIER_ON_CPU=1 (about 1-2 minutes)",
)
def test_the_gpu_tier_runs_on_the_cpu_with_small_shapes():
    """tests/gpu's own code on the CPU: what a GPU run executes, except the device."""
    env = {**os.environ, "REFUSION_GPU_TIER_DEVICE": "cpu", "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "tests/gpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
