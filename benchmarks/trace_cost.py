"""What the per-iteration trace costs: step records during decoding, and writing/reading trace files.

Run:  python benchmarks/trace_cost.py [--per-task 5] [--rounds 3] [--threads 1]

On the shipped model (its preset, batch 1, held-out prompts), three
competitors run interleaved round by round (common.interleave): decoding
alone, decoding plus writing each result's trace file, and decoding, writing
and reading it back (every line checked against the schema and the header). Ratios are to decoding
alone, within each round. Separately, the CPU time spent building the
per-iteration StepRecords inside the decoder (DecodeSession._snapshot and
_step_record, wrapped with a clock) is reported per iteration and as a share
of the decode's CPU time; the decode always builds them, so this is the cost
of the measurements every decode now carries.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, header, interleave

from refusion.api import build_decoder, load_model
from refusion.decoding.session import DecodeSession
from refusion.measure.trace import read_trace, write_trace
from refusion.training.tasks import held_out


class StepClock:
    """CPU seconds spent in the decoder's step-record bookkeeping while active."""

    def __init__(self):
        self.seconds, self.records = 0.0, 0
        self._saved = (DecodeSession._snapshot, DecodeSession._step_record)

    def __enter__(self) -> StepClock:
        snapshot, record = self._saved

        def timed_snapshot(session):
            t = time.process_time()
            out = snapshot(session)
            self.seconds += time.process_time() - t
            return out

        def timed_record(session, *args):
            t = time.process_time()
            out = record(session, *args)
            self.seconds += time.process_time() - t
            self.records += 1
            return out

        DecodeSession._snapshot, DecodeSession._step_record = timed_snapshot, timed_record
        return self

    def __exit__(self, *exc) -> None:
        DecodeSession._snapshot, DecodeSession._step_record = self._saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-task", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    adapter = load_model(None)
    decoder, gen_length = build_decoder(adapter)
    tok = adapter.tokenizer
    prompts = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in held_out(args.per_task)]
    folder = Path(tempfile.mkdtemp(prefix="trace_cost_"))

    def decode():
        results = [decoder.decode(adapter, p, gen_length, tokenizer=tok) for p in prompts]
        return {"iterations": sum(r.num_iterations for r in results), "results": results}

    def decode_write():
        counts = decode()
        for i, r in enumerate(counts["results"]):
            write_trace(r, folder / f"{i}.jsonl", tokenizer=tok, decoder=decoder)
        return counts

    def decode_write_read():
        counts = decode_write()
        for i in range(len(prompts)):
            read_trace(folder / f"{i}.jsonl")
        return counts

    print(header())
    print(f"# {len(prompts)} held-out prompts, the shipped model's preset, batch 1, {args.rounds} rounds interleaved")
    rows = interleave(
        {"decode": decode, "decode + write trace": decode_write, "decode + write + read trace": decode_write_read},
        adapter,
        rounds=args.rounds,
        memory=False,
    )
    print(f"{'competitor':<30} {'CPU s [spread]':>22} {'wall s':>7} {'decode / this':>20}")
    for row in rows:
        print(f"{row.name:<30} {fmt_spread(row, 'cpu', digits=3):>22} {row.median('wall'):>7.3f} {fmt_ratio(row):>20}")
    shares = []
    for _ in range(args.rounds):
        with StepClock() as clock:
            t = time.process_time()
            decode()
            total = time.process_time() - t
        shares.append((clock.seconds / total, 1e6 * clock.seconds / max(clock.records, 1)))
    print(
        f"step records inside the decoder: {statistics.median(s[1] for s in shares):.1f} us per iteration, "
        f"{statistics.median(s[0] for s in shares):.2%} of decode CPU (median of {args.rounds} rounds, "
        f"{min(s[0] for s in shares):.2%}-{max(s[0] for s in shares):.2%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
