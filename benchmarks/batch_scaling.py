"""``refusion batch`` embedded vs on Ray Data with 1 and 2 workers, interleaved round by round in one process.

Run:  python benchmarks/batch_scaling.py [--prompts 120] [--rounds 3] [--gen-length 32] [--max-rows 16]

The shipped model and its held-out prompts (the six tasks in turn, one seed
per row), written as a JSON Lines file; each competitor writes a fresh output
file from it:

* ``embedded``: what :func:`refusion.batch.run_batch` does without Ray, one
  :class:`~refusion.batch.worker.BatchWorker` in this process (1 torch
  thread) loading the model;
* ``ray 1 worker`` / ``ray 2 workers``: the same rows through
  :func:`refusion.batch.ray_data.run_on_ray` on a local Ray started once
  beforehand (``ray.init`` is not timed), each run starting its actor pool
  (1 CPU and 1 torch thread per actor) and loading the model in every actor.

Every run counts its whole wall time: model loading, for Ray also starting the
actors (this process has torch and transformers imported already, so the
embedded run's model loads in a fraction of a second; a fresh ``refusion
batch`` pays those imports too). Reported per competitor, the median over
rounds with [min-max] beside it: wall seconds; rows/s and tokens/s over that
wall time; seconds to the first row; rows/s after the first rows are back
(start-up and model loading left out; a Ray batch comes back whole, ``-``
when all rows came back at once); this process's CPU seconds (for Ray the
driver's share only) and the workers' CPU seconds; the speed ratio to
embedded within each round (embedded wall / this wall); the peak resident
memory of the largest worker (``getrusage`` in the actor; for embedded, this
process's). Below the table, the Ray overhead per row: (ray 1 worker wall -
embedded wall) / rows, per round. Every run must write the same rows
(checked), so the figures compare equal work.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")  # this process and, through Ray's processes, the workers

import torch
from common import header

from refusion.batch.lines import input_lines, pending_lines
from refusion.batch.output import ResultWriter
from refusion.training.tasks import held_out


def write_input(path: Path, prompts: int) -> None:
    examples = held_out(max(1, -(-prompts // 6)))[:prompts]
    path.write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": e.prompt, "seed": i}) + "\n" for i, e in enumerate(examples))
    )


def read_output(path: Path) -> dict[str, dict]:
    return {row["id"]: row for row in map(json.loads, path.read_text().splitlines())}


def timed(source: Path, out: Path, rows_of) -> dict:
    """Write the rows ``rows_of(lines)`` yields for the input's lines; wall, CPU and first-row times, counts."""
    start, cpu = time.perf_counter(), time.process_time()
    arrivals, tokens = [], 0
    with ResultWriter(out) as writer:
        results = rows_of(pending_lines(input_lines(source), writer.done, early=[], counts={"skipped": 0}), writer)
        for row in results:
            if writer.write(row):
                arrivals.append(time.perf_counter() - start)
                tokens += len(row["tokens"] or ())
        close = getattr(results, "close", None)
        if close is not None:
            close()
    return dict(
        wall=time.perf_counter() - start,
        cpu=time.process_time() - cpu,
        arrivals=arrivals,
        rows=len(arrivals),
        tokens=tokens,
    )


def after_first_rows(run: dict) -> float:
    """Rows per second after the first rows are back (those within 50 ms of the first: a Ray batch comes back
    whole), so start-up and model loading are left out; ``nan`` (shown as ``-``) if all came back at once."""
    arrivals = run["arrivals"]
    first = sum(1 for t in arrivals if t <= arrivals[0] + 0.05)
    if first == len(arrivals):
        return float("nan")
    return (len(arrivals) - first) / (arrivals[-1] - arrivals[first - 1])


def embedded(source: Path, out: Path, options: dict) -> dict:
    """What ``refusion batch`` does without ``--ray``: one BatchWorker in this process (it loads the model)."""
    from refusion.batch.worker import BatchWorker

    worker = None

    def rows_of(lines, writer):
        nonlocal worker
        worker = BatchWorker(None, **options)
        return worker.run(lines)

    result = timed(source, out, rows_of)
    worker.close()
    return dict(result, worker_cpu=None, peaks=[resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024])


def on_ray(source: Path, out: Path, options: dict, workers: int) -> dict:
    """What ``refusion batch --ray --workers N`` does, on the Ray this process started."""
    from refusion.batch.ray_data import run_on_ray

    run = None

    def rows_of(lines, writer):
        nonlocal run
        run = run_on_ray(source, writer, lines, workers=workers, worker_options=options, progress=False)
        return run

    result = timed(source, out, rows_of)
    used = run.workers()
    return dict(result, worker_cpu=sum(w.cpu for w in used), peaks=[w.peak_rss for w in used])


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """``median [min-max]``; ``-`` when there is no figure (``nan``)."""
    values = [v for v in values if v == v]
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gen-length", type=int, default=32)
    parser.add_argument("--max-rows", type=int, default=16)
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", default=True)
    args = parser.parse_args()

    import ray

    torch.set_num_threads(1)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    options = dict(max_rows=args.max_rows, gen_length=args.gen_length)
    competitors = {
        "embedded": lambda src, out: embedded(src, out, options),
        "ray 1 worker": lambda src, out: on_ray(src, out, options, 1),
        "ray 2 workers": lambda src, out: on_ray(src, out, options, 2),
    }
    names = list(competitors)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    overhead: list[float] = []
    reference = None
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "in.jsonl"
        write_input(source, args.prompts)
        for r in range(-1 if args.warmup else 0, args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)] if r >= 0 else names
            this_round = {}
            for name in order:
                out = Path(folder) / f"out-{r}-{name.replace(' ', '-')}.jsonl"
                result = competitors[name](source, out)
                rows = read_output(out)
                reference = reference or rows
                assert rows == reference, f"{name} wrote other rows than the first run"
                this_round[name] = result
            if r < 0:
                continue  # the warm-up round: caches, imports, Ray's worker pool
            for name in names:
                runs[name].append(this_round[name])
                ratios[name].append(this_round["embedded"]["wall"] / this_round[name]["wall"])
            overhead.append(
                (this_round["ray 1 worker"]["wall"] - this_round["embedded"]["wall"]) / this_round["embedded"]["rows"]
            )
    ray.shutdown()

    rows = runs["embedded"][0]["rows"]
    tokens = runs["embedded"][0]["tokens"]
    print(header())
    print(
        f"# {rows} held-out prompts, gen_length {args.gen_length}, max_rows {args.max_rows}, {tokens} tokens, "
        f"{args.rounds} rounds interleaved (after a warm-up round: {args.warmup}); ray {ray.__version__}"
    )
    print(
        "| run | wall s | rows/s | tokens/s | first row s | rows/s after the first rows | driver CPU s "
        "| workers CPU s | speed vs embedded | peak RSS MB (largest worker) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        got = runs[name]
        walls = [g["wall"] for g in got]
        cells = [
            spread(walls),
            spread([rows / w for w in walls], "{:.1f}"),
            spread([tokens / w for w in walls], "{:.0f}"),
            spread([g["arrivals"][0] for g in got]),
            spread([after_first_rows(g) for g in got], "{:.1f}"),
            spread([g["cpu"] for g in got]),
            spread([g["worker_cpu"] for g in got]) if got[0]["worker_cpu"] is not None else "-",
            spread(ratios[name]) + "x",
            spread([max(g["peaks"]) / 2**20 for g in got], "{:.0f}"),
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(
        "Ray overhead per row, (ray 1 worker wall - embedded wall) / rows, per round: "
        f"{spread([1e3 * o for o in overhead], '{:.1f}')} ms"
    )


if __name__ == "__main__":
    main()
