"""Batched decoding and the in-place cache vs the reference's repeat/concat cache.

Run:  python benchmarks/batching.py [--prompts 32] [--model DIR]

Part 1, on the shipped model and its held-out prompts (paper strategies): for
batch sizes 1, 4 and 16, generated tokens per second, peak extra memory and
bytes of keys/values copied per model forward, for the ``repeat`` engine (one
sequence at a time, DynamicCache, context repeated per branch) and the
``branch`` engine (batched, branches as attention masks, preallocated cache).
Each configuration runs in its own process so that peak RSS is its own.

Part 2, on a random Qwen3 of the stated size with long contexts: the cost of
the cache operations of one iteration (commit 8 tokens; set up 4 branches of
4 tokens) as the cached context grows, for both designs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

PAPER = dict(slot_size=4, serial_num_blocks=1, slot_threshold=0.7, token_threshold=0.5)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_config(engine: str, batch: int, prompts: int, model_dir: str | None) -> dict:
    import attrs

    from refusion.api import load_model
    from refusion.decoder import Decoder
    from refusion.training.tasks import held_out

    torch.manual_seed(0)
    adapter = load_model(model_dir, dtype=torch.float32)
    decoder = attrs.evolve(Decoder.from_names(**PAPER), engine=engine)
    examples = held_out(max(1, prompts // 6))[:prompts]
    ids = [adapter.tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    decoder.decode_batch(adapter, ids[:batch], 32)  # warm-up
    base = _rss_mb()

    forwards = tokens = context = new = 0
    start = time.perf_counter()
    for i in range(0, len(ids), batch):
        results = decoder.decode_batch(adapter, ids[i : i + batch], 32)
        tokens += sum(len(r.tokens) for r in results)
        if engine == "branch":
            forwards += results[0].extra["batch_forwards"]
            context += results[0].extra["batch_kv_bytes"]["context"]
            new += results[0].extra["batch_kv_bytes"]["new"]
        else:
            forwards += sum(r.forwards for r in results)
            context += sum(r.extra["kv_bytes"]["context"] for r in results)
            new += sum(r.extra["kv_bytes"]["new"] for r in results)
    seconds = time.perf_counter() - start
    return {"engine": engine, "batch": batch, "tokens": tokens, "seconds": seconds, "forwards": forwards,
            "tokens_per_s": tokens / seconds, "peak_extra_mb": _rss_mb() - base,
            "context_bytes_per_forward": context / max(forwards, 1), "new_bytes_per_forward": new / max(forwards, 1)}


def part1(prompts: int, model_dir: str | None) -> list[dict]:
    rows = []
    for engine in ("repeat", "branch"):
        for batch in (1, 4, 16):
            cmd = [sys.executable, __file__, "--one", engine, str(batch), "--prompts", str(prompts)]
            if model_dir:
                cmd += ["--model", model_dir]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  done: {engine} batch {batch}", file=sys.stderr, flush=True)
    return rows


def part2() -> list[dict]:
    """Cache operations vs context length on a random Qwen3 (layers=8, kv_heads=4, head_dim=64, fp32)."""
    from transformers import DynamicCache

    from refusion.cache.kv import KVSegment
    from refusion.cache.stores import DynamicStore, PreallocatedKV

    layers, heads, dim = 8, 4, 64
    rows = []
    for context in (256, 1024, 4096):
        ctx = torch.randn(layers, 2, heads, context, dim)
        commit = KVSegment(torch.randn(layers, 2, heads, 8, dim))
        branch = torch.randn(layers, 2, heads, 4, dim)
        # old: DynamicCache append (torch.cat) and a 4-way repeat of the context for the branch pass
        old = DynamicStore(DynamicCache([(ctx[l, 0][None], ctx[l, 1][None]) for l in range(layers)]))
        t0 = time.perf_counter()
        for _ in range(10):
            old.append(commit)
            old.truncate(context)
        t_commit_old = (time.perf_counter() - t0) / 10
        t0 = time.perf_counter()
        for _ in range(10):
            for layer in old.cache.layers:
                torch.cat((layer.keys.expand(4, -1, -1, -1), branch[0, 0].expand(4, -1, -1, -1)), dim=2)
                torch.cat((layer.values.expand(4, -1, -1, -1), branch[0, 1].expand(4, -1, -1, -1)), dim=2)
        t_branch_old = (time.perf_counter() - t0) / 10
        # new: in-place write of the commit; branches' keys/values written once to scratch
        buf = PreallocatedKV(layers, 1, heads, context + 64, dim, dtype=torch.float32, device="cpu")
        buf.row(0).append(KVSegment(ctx))
        before = buf.copies.new + buf.copies.context
        t0 = time.perf_counter()
        for _ in range(10):
            buf.row(0).append(commit)
            buf.row(0).truncate(context)
        t_commit_new = (time.perf_counter() - t0) / 10
        commit_bytes_new = (buf.copies.new + buf.copies.context - before) / 10
        t0 = time.perf_counter()
        for _ in range(10):
            for b in range(4):
                buf.write(0, context + 8 + 4 * b, branch)
        t_branch_new = (time.perf_counter() - t0) / 10
        token = layers * 2 * heads * dim * 4
        rows.append({
            "context": context,
            "commit_us_old": t_commit_old * 1e6, "commit_us_new": t_commit_new * 1e6,
            "commit_bytes_old": (context + 8) * token, "commit_bytes_new": commit_bytes_new,
            "branch_setup_us_old": t_branch_old * 1e6, "branch_setup_us_new": t_branch_new * 1e6,
            "branch_bytes_old": 4 * 2 * (context + 4) * token, "branch_bytes_new": 4 * 4 * token,
        })
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--model", default=None)
    parser.add_argument("--one", nargs=2, metavar=("ENGINE", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_config(args.one[0], int(args.one[1]), args.prompts, args.model)))
        return 0

    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads; part 1: {args.prompts} held-out prompts, "
          f"gen_length 32, paper strategies {PAPER}")
    rows = part1(args.prompts, args.model)
    base = rows[0]["tokens_per_s"]
    print(f"{'engine':<8} {'batch':>5} {'tokens/s':>9} {'vs repeat@1':>11} {'forwards':>9} {'peak MB':>8} "
          f"{'cached KV re-copied/fwd (B)':>28} {'new KV written/fwd (B)':>23}")
    for r in rows:
        print(f"{r['engine']:<8} {r['batch']:>5} {r['tokens_per_s']:>9.1f} {r['tokens_per_s'] / base:>10.2f}x "
              f"{r['forwards']:>9} {r['peak_extra_mb']:>8.1f} {r['context_bytes_per_forward']:>28,.0f} "
              f"{r['new_bytes_per_forward']:>23,.0f}")
    print("\n# part 2: cache operations per iteration vs cached context (random Qwen3 KV: 8 layers, 4 kv heads, "
          "head_dim 64, fp32)")
    print(f"{'context':>8} {'commit old us':>14} {'commit new us':>14} {'commit old B':>14} {'commit new B':>13} "
          f"{'branches old us':>16} {'branches new us':>16} {'branches old B':>15} {'branches new B':>15}")
    for r in part2():
        print(f"{r['context']:>8} {r['commit_us_old']:>14.1f} {r['commit_us_new']:>14.1f} {r['commit_bytes_old']:>14,} "
              f"{r['commit_bytes_new']:>13,.0f} {r['branch_setup_us_old']:>16.1f} {r['branch_setup_us_new']:>16.1f} "
              f"{r['branch_bytes_old']:>15,} {r['branch_bytes_new']:>15,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
