"""How long the command line takes to start, and what ``import refusion`` loads.

Runs, interleaved round by round (the order rotates each round), fresh
processes of:

* ``refusion --help``;
* ``refusion generate "rev helloworld="`` (the shipped model, default preset);
* ``python -c "import refusion"``;
* ``refusion serve --port 70000``, which is refused (exit status 2): how long a
  bad flag takes to be refused;

and reports, per command, the median wall time and CPU time (user + system of
the child, from ``resource.getrusage``) over the rounds with the spread
[min-max]; plus the number of modules ``import refusion`` loads and whether
``refusion.sweep`` / ``refusion.training`` are among them. Each child runs
with 1 torch thread (``OMP_NUM_THREADS=1``).

``--compare DIR`` also runs every command against another checkout of
refusion (e.g. a ``git worktree`` of an earlier commit, put first on
``PYTHONPATH``), interleaved with this one in the same rounds, and reports the
per-round CPU-time ratio (other / this).

    python benchmarks/startup.py --rounds 5 [--compare DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "refusion --help": [sys.executable, "-m", "refusion.cli", "--help"],
    "refusion generate (shipped model)": [sys.executable, "-m", "refusion.cli", "generate", "rev helloworld="],
    "python -c 'import refusion'": [sys.executable, "-c", "import refusion"],
    "refusion serve --port 70000 (refused)": [sys.executable, "-m", "refusion.cli", "serve", "--port", "70000"],
}
#: the exit status each command must end with (0 unless listed)
STATUS = {"refusion serve --port 70000 (refused)": 2}

PROBE = (
    "import sys, refusion; mods = [m for m in sys.modules if m == 'refusion' or m.startswith('refusion.')]; "
    "print(len(mods), any(m.startswith('refusion.sweep') for m in mods), "
    "any(m.startswith('refusion.training') for m in mods), len(sys.modules))"
)


def run_once(argv: list[str], path: str | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of one child process running ``argv`` (with ``path`` first on ``PYTHONPATH``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path, *filter(None, [os.environ.get("PYTHONPATH")])])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, cwd=path or None)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != STATUS.get(next((n for n, a in COMMANDS.items() if a == argv), ""), 0):
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", default=None, metavar="DIR", help="another refusion checkout to run beside this")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    sides = {"this": None} if args.compare is None else {"this": None, "other": os.path.abspath(args.compare)}
    runs = [(name, side) for name in COMMANDS for side in sides]
    for name, side in runs:  # warm-up: file caches, bytecode
        run_once(COMMANDS[name], sides[side])
    times = {(n, s): {"wall": [], "cpu": []} for n, s in runs}
    ratios: dict[str, list[float]] = {n: [] for n in COMMANDS}
    for r in range(args.rounds):
        order = runs[r % len(runs) :] + runs[: r % len(runs)]
        this_round = {}
        for name, side in order:
            wall, cpu = run_once(COMMANDS[name], sides[side])
            times[(name, side)]["wall"].append(wall)
            times[(name, side)]["cpu"].append(cpu)
            this_round[(name, side)] = cpu
        if args.compare:
            for name in COMMANDS:
                ratios[name].append(this_round[(name, "other")] / this_round[(name, "this")])
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.split()
    modules = {
        "refusion_modules": int(probe[0]),
        "loads_search": probe[1] == "True",
        "loads_training": probe[2] == "True",
        "all_modules": int(probe[3]),
    }
    if args.json:
        print(
            json.dumps(
                {
                    "rounds": args.rounds,
                    "compare": args.compare,
                    "import": modules,
                    "ratios": ratios,
                    "times": {f"{n} [{s}]": t for (n, s), t in times.items()},
                }
            )
        )
        return 0
    print(
        f"{args.rounds} interleaved rounds, fresh processes, 1 torch thread; median [min-max] seconds"
        + (f"; 'other' = {args.compare}" if args.compare else "")
    )
    print(f"{'command':48} {'wall s':>20} {'CPU s':>20} {'other/this CPU':>20}")
    for name, side in runs:
        label = f"{name} [{side}]" if args.compare else name
        ratio = spread(ratios[name]) + "x" if args.compare and side == "other" else ""
        print(
            f"{label:48} {spread(times[(name, side)]['wall']):>20} {spread(times[(name, side)]['cpu']):>20} {ratio:>20}"
        )
    print(
        f"import refusion (this): {modules['refusion_modules']} refusion modules ({modules['all_modules']} in all); "
        f"refusion.sweep loaded: {modules['loads_search']}; refusion.training loaded: {modules['loads_training']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
