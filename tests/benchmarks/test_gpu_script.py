"""benchmarks/gpu.py runs end to end with tiny shapes on the CPU (``--smoke``) and writes every section."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("setup", "kernels", "decode", "compile", "host_reads")


def test_the_gpu_script_smoke_run_writes_every_section(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu.py", "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["smoke"] is True
    sections = result["sections"]
    assert set(SECTIONS) <= set(sections)
    for name in SECTIONS:
        assert "error" not in sections[name], (name, sections[name])
        assert "seconds" in sections[name], name
    for name, model in sections["setup"]["models"].items():
        assert model["parameters"] > 0, name
    for row in sections["kernels"].get("rows", []):
        assert row.get("agree", True) is True and row.get("agree_tokens", 1.0) == 1.0, row
    for name in ("qwen3-8b", "llada-8b"):
        batches = sections["decode"][name]["batches"]
        assert set(batches) == {"batch 1", "batch 4"}
        for rows in batches.values():
            for row in rows.values():
                assert row["tokens"] > 0 and row["forwards"] > 0
                assert row["predicted_seconds"] > 0 and row["measured_over_predicted"] > 0
    assert {"paper", "ar", "fast-dllm", "generate"} <= set(sections["decode"]["qwen3-8b"]["batches"]["batch 1"])
    reads = [v for k, v in sections["host_reads"].items() if " / batch " in k]
    assert reads and all(r["steps"] > 0 and r["per_step"] >= 0 for r in reads)
