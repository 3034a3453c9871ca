"""One device lease's GPU work in one command: the environment, the GPU test tier, the GPU benchmark; all under
$OUT.

Device command (the `run` tool of a lent H200; the repository root is the working directory):

    PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/gpu_session.py \
        --out $OUT --wheels .whl --total 300

carry: [".whl"] (the wheels of the transformers CI uses and what it needs that the machine lacks, made with
``--print-wheel-download``; without them the machine's own transformers runs); timeout_s: 420. It writes
(at most 8 files, as the tool returns): session.log (everything printed), tier.xml (JUnit), tier.jsonl
(figures the tier records), gpu-<device>.json (benchmarks/gpu.py), profile.txt (profiler tables of one
decode), summary.json (what ran, how long, pass/fail counts).

A second lease (the benchmark alone, its longer boxes: 3 rounds, batch 16 too, the compile section):

    PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/gpu_session.py \
        --out $OUT --wheels .whl --total 290 --skip-tier

Steps, each time-boxed so that the whole run ends within ``--total`` seconds (default 300):

0. ``--wheels DIR``: install DIR's wheels into /tmp/site (no index, no dependencies) and use them for every
   later step if transformers, its hub client and refusion then import and a fixture's tokenizer loads;
   else the machine's own packages (said in the log and summary.json);
1. environment: nvidia-smi, versions, the device's properties (about 10 s);
2. the GPU tier (``tests/gpu`` and the CUDA test of tests/models/test_compiled_forward.py) with Triton
   compiled (``TRITON_INTERPRET=0``), the compile tests last, at most ``--tier-seconds`` (190);
3. ``benchmarks/gpu.py --budget session`` (``bench`` with ``--skip-tier``) with the rest of the time: 8B-shaped
   Qwen3 and LLaDA, batches 1 and 16, gen 256, presets against ``generate``, Triton against torch, a profiled
   decode, host synchronisations, CUDA graphs against eager on a 4-layer model of the same width; what does
   not fit its box is skipped and named in the JSON's notes.

A step that does not fit is skipped and says so in summary.json. ``--smoke`` runs the same steps on the CPU
(the tier with ``REFUSION_GPU_TIER_DEVICE=cpu``, ``gpu.py --smoke``) to check this script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: the tier's files, in the order they run: the compile tests (the longest, the likeliest to be cut) last
TIER = [
    "tests/gpu/test_kernels_on_cuda.py",
    "tests/gpu/test_host_syncs_on_cuda.py",
    "tests/gpu/test_families_on_cuda.py",
    "tests/gpu/test_batch_invariance_on_cuda.py",
    "tests/models/test_compiled_forward.py::test_cuda_graphs_give_eager_tokens_with_a_graph_per_bucket",
    "tests/gpu/test_compiled_on_cuda.py",
]
#: what CI installs that the H200 image lacks or has in another version (pip download, --print-wheel-download)
WHEELS = (
    "transformers==5.25.0",
    "huggingface_hub==2.4.0",
    "httpx2==2.16.2",
    "httpcore2==2.16.2",
    "h11==0.16.0",
    "truststore==0.10.5",
    "idna==3.20",
    "anyio==4.16.0",
    "typing_extensions==4.16.0",
    "kernels==0.19.1",
    "tomlkit==0.15.3",
    "click==8.5.1",
    "hf-xet==1.8.0",
    "regex==2026.11.19",
    "tokenizers==0.23.3",
)
#: what must work with the wheels before they are used
WHEEL_PROBE = (
    "import transformers, huggingface_hub, kernels, tokenizers, refusion, refusion_kernels; "
    "from transformers import AutoTokenizer, Qwen3ForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM; "
    "AutoTokenizer.from_pretrained('tests/fixtures/peers/refusion'); print('transformers', "
    "transformers.__version__, 'from', transformers.__file__)"
)
#: seconds the benchmark needs at least (imports, two 8B models, a few runs); below that it is skipped
BENCH_MINIMUM = 60


class Session:
    """The run's clock, log and summary."""

    def __init__(self, out: Path, total: float):
        self.out, self.total, self.start = out, total, time.perf_counter()
        self.log = open(out / "session.log", "a", buffering=1)
        self.summary: dict[str, Any] = {"steps": {}, "total_budget_seconds": total}

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.start)

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")

    def run(self, name: str, command: list[str], seconds: float, env: dict[str, str] | None = None) -> int | None:
        """Run ``command`` (output to the log and stdout) for at most ``seconds``; its exit status, or None when
        it was stopped at its limit."""
        self.say(f"\n=== {name}: {' '.join(command)} (at most {seconds:.0f} s; {self.left():.0f} s left in the run)")
        started = time.perf_counter()
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        reader = threading.Thread(target=lambda: [self.say(line.rstrip("\n")) for line in process.stdout], daemon=True)
        reader.start()
        stopped = False
        try:
            process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.say(f"=== {name}: stopped at its limit of {seconds:.0f} s")
            stopped = True
            os.killpg(process.pid, signal.SIGINT)  # pytest writes its report on an interrupt
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        reader.join(timeout=5)
        seconds_taken = round(time.perf_counter() - started, 1)
        code = None if stopped else process.returncode
        self.summary["steps"][name] = {"seconds": seconds_taken, "exit": code, "limit_seconds": round(seconds)}
        self.say(f"=== {name}: {seconds_taken} s, exit {code}")
        return code

    def skip(self, name: str, why: str) -> None:
        self.summary["steps"][name] = {"skipped": why}
        self.say(f"\n=== {name}: skipped ({why})")

    def finish(self) -> None:
        self.summary["seconds"] = round(time.perf_counter() - self.start, 1)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str))
        self.say(
            f"\n=== session: {self.summary['seconds']} s of {self.total:.0f}; files in {self.out}: "
            f"{', '.join(sorted(p.name for p in self.out.iterdir()))}"
        )
        self.log.close()


def use_wheels(session: Session, folder: Path) -> None:
    """Install ``folder``'s wheels into /tmp/site and put it first on PYTHONPATH for every later step, if they
    import (:data:`WHEEL_PROBE`); else leave the machine's packages in charge."""
    started = time.perf_counter()
    wheels = sorted(str(p) for p in folder.glob("*.whl"))
    verdict: dict[str, Any] = {"wheels": [Path(w).name for w in wheels]}
    if not wheels:
        verdict["used"] = False
        verdict["why"] = f"no wheels in {folder}"
    else:
        site = "/tmp/site"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                site,
                *wheels,
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (site, os.environ.get("PYTHONPATH"))))}
        probe = (
            subprocess.run(
                [sys.executable, "-c", WHEEL_PROBE],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode == 0
            else done
        )
        verdict["used"] = done.returncode == 0 and probe.returncode == 0
        verdict["why"] = (
            probe.stdout.strip()
            if verdict["used"]
            else f"{'install' if done.returncode else 'import'} failed: {(probe.stderr or probe.stdout)[-1500:]}"
        )
        if verdict["used"]:
            os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    verdict["seconds"] = round(time.perf_counter() - started, 1)
    session.summary["steps"]["wheels"] = verdict
    session.say(
        f"=== wheels: {'used' if verdict['used'] else 'not used'} ({verdict['why']}); "
        f"{verdict['seconds']} s; PYTHONPATH={os.environ.get('PYTHONPATH', '')}"
    )


def environment(session: Session, smoke: bool) -> str:
    """Print what the machine is; return the device's file-name slug (``h200``; ``smoke`` with --smoke)."""
    started = time.perf_counter()
    name = "smoke"
    if shutil.which("nvidia-smi"):
        for command in (
            ["nvidia-smi"],
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,clocks.sm,"
                "clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu",
                "--format=csv",
            ],
        ):
            done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
            session.say(done.stdout + done.stderr)
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip() and not smoke:
            name = re.sub(r"[^a-z0-9]+", "-", done.stdout.strip().splitlines()[0].lower()).strip("-")
            name = name.removeprefix("nvidia-") or "gpu"
    else:
        session.say("no nvidia-smi on this machine")
    probe = (
        "import sys, platform, torch, transformers, huggingface_hub; "
        "print('python', platform.python_version(), sys.executable); "
        "print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); "
        "print('transformers', transformers.__version__, transformers.__file__); "
        "print('huggingface_hub', huggingface_hub.__version__)\n"
        "try:\n import triton; print('triton', triton.__version__)\nexcept Exception as e: print('triton', e)\n"
        "if torch.cuda.is_available():\n p = torch.cuda.get_device_properties(0); "
        "print('device', p.name, 'capability', (p.major, p.minor), 'SMs', p.multi_processor_count, "
        "'memory GiB', round(p.total_memory / 2**30, 1))\n"
        "import refusion, refusion_kernels; print('refusion', refusion.__file__, refusion_kernels.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    session.say(done.stdout + done.stderr)
    session.summary["steps"]["environment"] = {
        "seconds": round(time.perf_counter() - started, 1),
        "device": name,
        "versions": done.stdout.strip().splitlines(),
    }
    return name


def tier_counts(path: Path) -> dict[str, int] | None:
    """Passed/failed/errors/skipped of a JUnit XML report."""
    if not path.exists():
        return None
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for s in suites
        for case in s.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {**counts, "failed_tests": failed}


def tier(session: Session, smoke: bool, seconds: float) -> None:
    import importlib.util

    command = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "cuda",
        "-p",
        "no:cacheprovider",
        "-v",
        "-rfEs",
        "--junitxml",
        str(session.out / "tier.xml"),
        "-o",
        "junit_logging=system-err",
        *TIER,
    ]
    if importlib.util.find_spec("pytest_timeout"):
        command[3:3] = ["--timeout", "150", "-o", "timeout_method=signal"]
    env = {"REFUSION_GPU_REPORT": str(session.out / "tier.jsonl"), "TRITON_INTERPRET": "1" if smoke else "0"}
    if smoke:
        env["REFUSION_GPU_TIER_DEVICE"] = "cpu"
    session.run("tier", command, seconds, env)
    session.summary["steps"]["tier"]["results"] = tier_counts(session.out / "tier.xml")


def bench(session: Session, smoke: bool, device: str, seconds: float, budget: str) -> None:
    path = session.out / f"gpu-{device}.json"
    if smoke:
        command = [
            sys.executable,
            "benchmarks/gpu.py",
            "--smoke",
            "--json",
            str(path),
            "--profile",
            str(session.out / "profile.txt"),
        ]
    else:  # gpu.py's own deadline counts from after its imports; the rest is the margin for them and its exit
        command = [
            sys.executable,
            "benchmarks/gpu.py",
            "--budget",
            budget,
            "--deadline",
            str(round(seconds - 25)),
            "--json",
            str(path),
            "--profile",
            str(session.out / "profile.txt"),
            "--compile-mode",
            "reduce-overhead",
            "--compile-layers",
            "4",
        ]
    session.run("bench", command, seconds)
    if path.exists():
        session.summary["steps"]["bench"]["headline"] = headline(json.loads(path.read_text()))


def headline(result: dict) -> dict:
    """The figures of a gpu.py JSON that the summary prints: tokens/s per model, batch and method; kernel speed-ups;
    compile speed-up."""
    out: dict[str, Any] = {}
    decode = result.get("sections", {}).get("decode", {})
    for model, section in decode.items():
        if isinstance(section, dict) and "batches" in section:
            for batch, rows in section["batches"].items():
                for name, row in rows.items():
                    out[f"{model} {batch} {name} tok/s"] = row.get("tokens_per_second")
    for row in result.get("sections", {}).get("kernels", {}).get("rows", []):
        out[f"kernel {row['op']} {row['shape']} triton speed-up"] = row.get("speedup")
    compile_section = result.get("sections", {}).get("compile", {})
    for batch in ("batch 1", "batch 16", "batch 4"):
        rows = compile_section.get(batch) or {}
        if "compiled" in rows:
            out[f"compiled vs eager {batch}"] = rows["compiled"].get("speedup_vs_baseline")
    for name, section in result.get("sections", {}).items():
        if isinstance(section, dict) and ("error" in section or "skipped" in section):
            out[f"section {name}"] = section.get("error") or section.get("skipped")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or "/tmp/refusion-gpu-session"),
        help="where every file goes (default: $OUT, else /tmp/refusion-gpu-session)",
    )
    parser.add_argument("--total", type=float, default=300, help="seconds the whole session may take")
    parser.add_argument("--tier-seconds", type=float, default=190, help="at most this long for the GPU tier")
    parser.add_argument("--skip-tier", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument(
        "--bench-budget",
        choices=("session", "bench", "full"),
        help="gpu.py's time boxes (default: 'session' after the tier, 'bench' with --skip-tier)",
    )
    parser.add_argument("--smoke", action="store_true", help="the same steps on the CPU (checks this script)")
    parser.add_argument("--wheels", type=Path, help="a folder of wheels to install and use if they import")
    parser.add_argument(
        "--print-wheel-download",
        action="store_true",
        help="print the command that downloads the wheels for the H200 image (Python 3.12) and exit",
    )
    args = parser.parse_args(argv)
    if args.print_wheel_download:
        platforms = " ".join(
            f"--platform {p}"
            for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
        )
        print(
            f"python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
            f"{platforms} -d .whl {' '.join(WHEELS)}"
        )
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    session = Session(args.out, args.total)
    if args.wheels:
        use_wheels(session, args.wheels)
    device = environment(session, args.smoke)
    if args.skip_tier:
        session.skip("tier", "--skip-tier")
    else:
        tier_box = min(args.tier_seconds, session.left() - (0 if args.skip_bench else BENCH_MINIMUM))
        if tier_box < 30:
            session.skip("tier", f"{tier_box:.0f} s left for it")
        else:
            tier(session, args.smoke, tier_box)
    if args.skip_bench:
        session.skip("bench", "--skip-bench")
    elif session.left() < BENCH_MINIMUM and not args.smoke:
        session.skip("bench", f"{session.left():.0f} s left, under {BENCH_MINIMUM}")
    else:
        budget = args.bench_budget or ("bench" if args.skip_tier else "session")
        bench(session, args.smoke, device, max(session.left() - 5, BENCH_MINIMUM if args.smoke else 0), budget)
    session.say(
        "\n=== summary\n"
        + json.dumps({k: v for k, v in session.summary["steps"].items() if k != "environment"}, indent=1, default=str)
    )
    session.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
