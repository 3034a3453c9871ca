"""How long the command line takes to start, and what ``import refusion`` loads.

Runs, interleaved round by round (the order rotates each round), fresh
processes of:

* ``refusion --help``;
* ``refusion generate "rev helloworld="`` (the shipped model, default preset);
* ``python -c "import refusion"``;

and reports, per command, the median wall time and CPU time (user + system of
the child, from ``resource.getrusage``) over the rounds with the spread
[min-max]; plus the number of modules ``import refusion`` loads and whether
``refusion.search`` / ``refusion.training`` are among them. Each child runs
with 1 torch thread (``OMP_NUM_THREADS=1``).

    python benchmarks/startup.py --rounds 5 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "refusion --help": ["{refusion}", "--help"],
    "refusion generate (shipped model)": ["{refusion}", "generate", "rev helloworld="],
    "python -c 'import refusion'": [sys.executable, "-c", "import refusion"],
}

PROBE = ("import sys, refusion; mods = [m for m in sys.modules if m == 'refusion' or m.startswith('refusion.')]; "
         "print(len(mods), any(m.startswith('refusion.search') for m in mods), "
         "any(m.startswith('refusion.training') for m in mods), len(sys.modules))")


def run_once(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one child process running ``argv``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    refusion = shutil.which("refusion") or os.path.join(os.path.dirname(sys.executable), "refusion")
    commands = {name: [part.replace("{refusion}", refusion) for part in argv] for name, argv in COMMANDS.items()}
    names = list(commands)
    for name in names:  # warm-up: file caches, bytecode
        run_once(commands[name])
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            wall, cpu = run_once(commands[name])
            times[name]["wall"].append(wall)
            times[name]["cpu"].append(cpu)
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.split()
    modules = {"refusion_modules": int(probe[0]), "loads_search": probe[1] == "True",
               "loads_training": probe[2] == "True", "all_modules": int(probe[3])}
    if args.json:
        print(json.dumps({"rounds": args.rounds, "times": times, "import": modules}))
        return 0
    print(f"{args.rounds} interleaved rounds, fresh processes, 1 torch thread; median [min-max] seconds")
    print(f"{'command':40} {'wall s':>20} {'CPU s':>20}")
    for name in names:
        print(f"{name:40} {spread(times[name]['wall']):>20} {spread(times[name]['cpu']):>20}")
    print(f"import refusion: {modules['refusion_modules']} refusion modules ({modules['all_modules']} in all); "
          f"refusion.search loaded: {modules['loads_search']}; refusion.training loaded: {modules['loads_training']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
