"""Compiled forward (``load_model(compile=True)``: inductor, dynamic shapes) against eager, on the CPU.

Run:  python benchmarks/compiled.py [--per-task 2] [--rounds 3] [--threads 1] [--models shipped,20m] [--warm-cache]

For each model (the shipped one in float32, and a random ~20M-parameter
Qwen3), one adapter decodes the held-out prompts (batch 1, the shipped
model's preset; the random model gets random ids of the same lengths) with
its backbone eager and compiled, the two interleaved round by round
(common.interleave): CPU and wall time medians with their spread, and the
eager / compiled ratio taken within each round (> 1: compiled is faster).
The first compiled decode, which compiles, is timed apart (wall time: the
C++ compiler runs in child processes), with the graphs it compiled; the
recompiles of the timed rounds and whether compiled decoding gave eager's
tokens in every round are reported too. Inductor's on-disk cache starts
empty unless ``--warm-cache``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-task", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="shipped,20m")
    parser.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk cache (default: a new one)")
    args = parser.parse_args()
    if not args.warm_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cache_")

    import torch  # after TORCHINDUCTOR_CACHE_DIR is set
    from common import header, random_qwen3

    from refusion.api import build_decoder, load_model
    from refusion.training.tasks import held_out

    torch.set_num_threads(args.threads)
    shipped = load_model(None, dtype=torch.float32)
    decoder, gen_length = build_decoder(shipped)
    tok = shipped.tokenizer
    prompts = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in held_out(args.per_task)]
    print(header())
    print(
        f"# {len(prompts)} held-out prompts, batch 1, the shipped model's preset (gen_length {gen_length}), "
        f"{args.rounds} rounds interleaved; inductor cache {'kept' if args.warm_cache else 'new'}"
    )
    for name in args.models.split(","):
        if name == "shipped":
            adapter, inputs = shipped, prompts
        else:
            adapter = load_model(random_qwen3(name))
            rng = random.Random(0)
            inputs = [[rng.randrange(adapter.mask_token_id) for _ in p] for p in prompts]
        compare(name, adapter, decoder, inputs, gen_length, args.rounds)
    return 0


def compare(name: str, adapter, decoder, inputs: list[list[int]], gen_length: int, rounds: int) -> None:
    """Compile ``adapter`` (inductor, dynamic shapes: what ``compile=True`` does), then time it against eager."""
    import torch
    from common import fmt_ratio, fmt_spread, interleave

    from refusion.models.compiled import compile_adapter, compile_stats, compiled_module

    compile_adapter(adapter)
    module = compiled_module(adapter)

    def decode():
        results = [decoder.decode(adapter, p, gen_length) for p in inputs]
        return {
            "tokens": sum(len(r.tokens) for r in results),
            "forwards": sum(r.forwards for r in results),
            "rows": [r.tokens.tolist() for r in results],
        }

    def eager():
        compiled = module.__dict__.pop("forward")  # the class's own forward again
        try:
            return decode()
        finally:
            module.forward = compiled

    with torch.no_grad():
        eager()  # warm-up
        cpu0, wall0 = time.process_time(), time.perf_counter()
        first = decode()
        warm_cpu, warm_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    warm = compile_stats(adapter)
    rows = interleave({"eager": eager, "compiled": decode}, adapter, rounds=rounds, warmup=False, memory=False)
    after = compile_stats(adapter)
    same = first["rows"] == rows[0].runs[0].counts["rows"] and all(
        e.counts["rows"] == c.counts["rows"] for e, c in zip(rows[0].runs, rows[1].runs)
    )
    params = sum(p.numel() for p in adapter.model.parameters())
    print(
        f"\n## {name} ({params / 1e6:.2f}M parameters, {rows[0].counts['forwards']} forwards, "
        f"{rows[0].counts['tokens']} tokens per round)"
    )
    print(
        f"first compiled decode (compiles): {warm_wall:.1f} s wall, {warm_cpu:.1f} s CPU in this process; "
        f"{warm.graphs} graphs in {warm.compiling_calls} compiling calls, {warm.graph_breaks} graph breaks"
    )
    print(f"{'':<10} {'CPU s [spread]':>24} {'wall s [spread]':>24} {'eager/compiled CPU':>22} {'wall':>7}")
    for row in rows:
        wall_ratio = statistics.median(e.wall / r.wall for e, r in zip(rows[0].runs, row.runs))
        print(
            f"{row.name:<10} {fmt_spread(row, 'cpu', digits=3):>24} {fmt_spread(row, 'wall', digits=3):>24} "
            f"{fmt_ratio(row):>22} {wall_ratio:>6.2f}x"
        )
    print(
        f"recompiles during the timed rounds: {after.compiling_calls - warm.compiling_calls}; "
        f"tokens identical to eager: {'yes' if same else 'NO'}"
    )


if __name__ == "__main__":
    sys.exit(main())
