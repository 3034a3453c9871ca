"""Batched decoding: the branch engine vs the reference's repeat engine, interleaved, and the cache operations.

Run:  python benchmarks/batching.py [--prompts 48] [--rounds 3] [--model DIR] [--contexts 256,1024,4096]

Part 1, the shipped model and its held-out prompts (its own preset: paper
strategies, slot 4, thresholds 0.7/0.5, gen_length 32): for batch sizes 1, 4
and 16, the ``repeat`` engine (one sequence at a time, a ``DynamicCache`` per
sequence, the context repeated per branch) and the ``branch`` engine (batched,
packed forwards, branches as attention masks, a preallocated in-place cache),
all interleaved round by round in one process with 1 torch thread. Reports
CPU and wall time (median [spread]), tokens per CPU second, the ratio to the
repeat engine at batch 1 within each round, forwards, tokens fed and padding
per forward, bytes of keys/values re-copied and written per forward, and the
peak resident-memory rise.

Part 2, the cost of one iteration's cache operations as the cached context
grows (a random KV cache of 8 layers, 4 KV heads, head_dim 64, float32):
committing 8 tokens (``DynamicCache`` concatenation vs an in-place write) and
setting up 4 branches of 4 tokens (repeating the context vs writing the
branches once), old and new interleaved, medians of 20 repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, header, interleave, refusion_counts

from refusion.api import load_model
from refusion.decoding.decoder import Decoder
from refusion.training.tasks import held_out

PRESET = dict(slot_size=4, serial_num_blocks=1, slot_threshold=0.7, token_threshold=0.5)
GEN = 32


def part1(model_dir, prompts: int, rounds: int) -> None:
    adapter = load_model(model_dir, dtype=torch.float32)
    examples = held_out(max(1, -(-prompts // 6)))[:prompts]
    ids = [adapter.tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]

    def method(engine: str, batch: int):
        decoder = Decoder.from_names(engine=engine, **PRESET)

        def run():
            results = []
            totals = {"forwards": 0, "fed": 0, "padded": 0, "kv_context": 0, "kv_new": 0, "tokens": 0}
            for i in range(0, len(ids), batch):
                chunk = decoder.decode_batch(adapter, ids[i : i + batch], GEN)
                counts = refusion_counts(chunk)
                for key in totals:
                    totals[key] += counts[key]
                results += chunk
            return totals

        return run

    competitors = {
        f"{engine} batch {batch}": method(engine, batch) for engine in ("repeat", "branch") for batch in (1, 4, 16)
    }
    print(f"\n## part 1: {len(ids)} held-out prompts, gen_length {GEN}, {PRESET}, {rounds} rounds interleaved")
    rows = interleave(competitors, adapter, rounds=rounds, baseline="repeat batch 1")
    print(
        f"{'engine':<17} {'CPU s [spread]':>20} {'wall s':>7} {'tokens/CPU s':>12} {'vs repeat@1':>19} {'fwd':>5} "
        f"{'fed/fwd':>8} {'pad/fwd':>8} {'KV re-copied/fwd':>16} {'KV written/fwd':>15} {'peak MB':>7}"
    )
    for row in rows:
        c = row.counts
        f = max(1, c["forwards"])
        print(
            f"{row.name:<17} {fmt_spread(row, 'cpu'):>20} {row.median('wall'):>7.2f} "
            f"{c['tokens'] / row.median('cpu'):>12.0f} {fmt_ratio(row):>19} {f:>5} {c['fed'] / f:>8.1f} "
            f"{c['padded'] / f:>8.1f} {c['kv_context'] / f:>14,.0f} B {c['kv_new'] / f:>13,.0f} B "
            f"{row.median('rss_rise') / 2**20:>7.1f}"
        )


def part2(contexts: list[int], reps: int = 20) -> None:
    from transformers import DynamicCache

    from refusion.cache.paged import PagedKV, PagedStore
    from refusion.cache.pages import PagePool
    from refusion.cache.stores import DynamicStore
    from refusion.decoding.protocol import KVSegment

    layers, heads, dim = 8, 4, 64
    token = layers * 2 * heads * dim * 4
    print(
        f"\n## part 2: one iteration's cache operations vs cached context (KV of {layers} layers, {heads} kv heads, "
        f"head_dim {dim}, fp32; medians of {reps})"
    )
    print(
        f"{'context':>8} {'commit 8: old / new us':>24} {'bytes old / new':>22} {'4 branches: old / new us':>26} "
        f"{'bytes old / new':>22}"
    )
    for context in contexts:
        ctx = torch.randn(layers, 2, heads, context, dim)
        commit = KVSegment(torch.randn(layers, 2, heads, 8, dim))
        branch = torch.randn(layers, 2, heads, 4, dim)
        old = DynamicStore(DynamicCache([(ctx[i, 0][None], ctx[i, 1][None]) for i in range(layers)]))
        pages = PagedKV(PagePool(layers, heads, dim, limit=context + 64))
        new = PagedStore(pages)
        new.append(KVSegment(ctx))
        times = {k: [] for k in ("commit_old", "commit_new", "branch_old", "branch_new")}
        for _ in range(reps):  # interleaved repetitions
            t = time.perf_counter()
            old.append(commit)
            old.truncate(context)
            times["commit_old"].append(time.perf_counter() - t)
            t = time.perf_counter()
            new.append(commit)
            new.truncate(context)
            times["commit_new"].append(time.perf_counter() - t)
            t = time.perf_counter()
            for layer in old.cache.layers:
                torch.cat((layer.keys.expand(4, -1, -1, -1), branch[0, 0].expand(4, -1, -1, -1)), dim=2)
                torch.cat((layer.values.expand(4, -1, -1, -1), branch[0, 1].expand(4, -1, -1, -1)), dim=2)
            times["branch_old"].append(time.perf_counter() - t)
            t = time.perf_counter()
            for b in range(4):
                pages.write(new.table, context + 8 + 4 * b, branch)
            times["branch_new"].append(time.perf_counter() - t)
        med = {k: 1e6 * statistics.median(v) for k, v in times.items()}
        print(
            f"{context:>8} {med['commit_old']:>11.0f} / {med['commit_new']:<10.0f} "
            f"{(context + 8) * token:>11,} / {8 * token:<9,} {med['branch_old']:>12.0f} / {med['branch_new']:<11.0f} "
            f"{4 * 2 * (context + 4) * token:>11,} / {16 * token:<9,}"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--contexts", default="256,1024,4096")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(header())
    part1(args.model, args.prompts, args.rounds)
    part2([int(c) for c in args.contexts.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
