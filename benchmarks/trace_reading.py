"""How long reading a decode trace takes: this checkout's reader against an earlier one's.

Run:  python benchmarks/trace_reading.py --before DIR [--steps 20000] [--rounds 3] [--json]

Writes one valid trace of a synthetic decode (``--steps`` iterations, one
slot of 4 tokens committed each, blocks of 8 slots, token pieces from a
character tokenizer, like ``refusion generate --trace``) with this checkout's
``write_trace``, then reads it with ``read_trace`` in fresh child processes,
one torch thread each: this checkout's reader and, with ``--before DIR``, the
reader of another checkout of refusion (e.g. ``git worktree add
/tmp/trace_before HEAD``, put first on the child's ``sys.path``). The two run
interleaved round by round (the order alternates); each child first reads a
20-step trace (imports, schema set-up), then times one read of the big trace
(``time.process_time`` and wall), so start-up is not counted. Reports the
median [min-max] over the rounds, the per-round CPU ratio before / this, the
file's size and its step count. Both readers must accept the file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from refusion.measure.trace import read_trace
read_trace(sys.argv[3])
cpu, wall = time.process_time(), time.perf_counter()
results = read_trace(sys.argv[2])
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
import refusion.measure.trace as module
steps = sum(r.num_iterations for r in results)
print(json.dumps({"cpu": cpu, "wall": wall, "steps": steps, "module": module.__file__}))
"""


class Letters:
    """A stand-in tokenizer: each id decodes to one letter (gives the trace ``pieces``, as the CLI writes)."""

    def decode(self, ids):
        return chr(97 + ids[0] % 26)


def synthetic_result(steps: int, *, slot_length: int = 4, block_slots: int = 8, prompt_length: int = 32, seed: int = 0):
    """A DecodeResult of ``steps`` iterations that a real decode could have produced (sums and orders hold)."""
    from refusion.decoding.types import DecodeResult, Partition, Slot, StepRecord

    rng = random.Random(seed)
    g = steps * slot_length
    slots = tuple(Slot(i, i * slot_length, slot_length, i // block_slots) for i in range(steps))
    blocks = tuple(tuple(range(b, min(b + block_slots, steps))) for b in range(0, steps, block_slots))
    tokens = [rng.randrange(3, 30000) for _ in range(g)]
    commit = [0] * g
    records, n = [], 0
    for b, members in enumerate(blocks):
        open_slots = list(members)
        while open_slots:
            chosen = rng.choice(open_slots)
            fed = [len(open_slots) * slot_length + (prompt_length if n == 0 else 0)]
            for p in range(chosen * slot_length, (chosen + 1) * slot_length):
                commit[p] = n
            records.append(
                StepRecord(
                    iteration=n,
                    block=b,
                    planned=tuple(open_slots),
                    selected=(chosen,),
                    committed=((chosen, slot_length),),
                    forwards=1,
                    drafted=tuple(open_slots),
                    confidence=tuple(rng.random() for _ in open_slots),
                    fed_tokens=tuple(fed),
                    kv_appended=slot_length,
                    kv_pending=0,
                    kv_encoded=prompt_length if n == 0 else 0,
                    kv_invalidated=0,
                    kv_copied_bytes=(prompt_length + chosen * slot_length) * 1024,
                    kv_written_bytes=slot_length * 1024,
                    seconds=rng.uniform(0.001, 0.01),
                )
            )
            open_slots.remove(chosen)
            n += 1
    return DecodeResult(
        tokens=torch.tensor(tokens),
        prompt_length=prompt_length,
        partition=Partition(g, slots, blocks),
        commit_step=torch.tensor(commit),
        forwards=len(records),
        steps=tuple(records),
        stopped_at_eos=False,
        text="".join(chr(97 + t % 26) for t in tokens),
        extra={
            "all_tokens": tokens,
            "engine": "branch",
            "fed_tokens": sum(r.fed_tokens[0] for r in records),
            "kv_bytes": {
                "context": sum(r.kv_copied_bytes for r in records),
                "new": sum(r.kv_written_bytes for r in records),
            },
        },
    )


def read_once(checkout: Path, big: Path, small: Path) -> dict:
    """CPU and wall seconds of one ``read_trace(big)`` in a fresh child importing refusion from ``checkout``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(checkout), str(big), str(small)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=str(checkout),
    )
    if done.returncode != 0:
        raise SystemExit(f"reading with {checkout} failed ({done.returncode}): {done.stderr[-800:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not out["module"].startswith(str(checkout)):
        raise SystemExit(f"the child imported {out['module']}, not the reader of {checkout}")
    return out


def spread(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):.2f}{unit} [{min(values):.2f}-{max(values):.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None, metavar="DIR", help="another refusion checkout whose reader to time")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", default=None, metavar="FILE", help="also keep the trace at FILE")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from refusion.measure.trace import read_trace, write_trace

    sides = {"this": ROOT} if args.before is None else {"before": Path(args.before).resolve(), "this": ROOT}
    with tempfile.TemporaryDirectory() as folder:
        big = Path(args.keep) if args.keep else Path(folder) / "trace.jsonl"
        small = Path(folder) / "small.jsonl"
        result = synthetic_result(args.steps)
        write_trace(result, big, tokenizer=Letters())
        write_trace(synthetic_result(20, seed=1), small, tokenizer=Letters())
        (back,) = read_trace(big)
        assert back.iterations == result.iterations and back.tokens.tolist() == result.tokens.tolist()
        size, lines = big.stat().st_size, sum(1 for _ in big.open("rb"))
        times = {side: {"cpu": [], "wall": []} for side in sides}
        ratios = []
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            cpu = {}
            for side in order:
                out = read_once(sides[side], big, small)
                if out["steps"] != args.steps:
                    raise SystemExit(f"{side} read {out['steps']} steps; expected {args.steps}")
                times[side]["cpu"].append(out["cpu"])
                times[side]["wall"].append(out["wall"])
                cpu[side] = out["cpu"]
            if "before" in sides:
                ratios.append(cpu["before"] / cpu["this"])
    figures = {
        "steps": args.steps,
        "lines": lines,
        "bytes": size,
        "rounds": args.rounds,
        "before": args.before,
        "times": times,
        "ratios": ratios,
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    print(
        f"trace: {args.steps:,} steps, {lines:,} lines, {size / 1e6:.1f} MB; {args.rounds} interleaved rounds, "
        f"fresh child processes, 1 torch thread; median [min-max] seconds of one read_trace"
    )
    for side, checkout in sides.items():
        print(f"{side:8} {checkout!s:40} CPU {spread(times[side]['cpu']):>22}   wall {spread(times[side]['wall']):>22}")
    if ratios:
        print(f"CPU before / this, per round: {spread(ratios, 'x')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
