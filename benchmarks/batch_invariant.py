"""Batch-invariant decoding: what ``batch_invariant=True`` costs, and how often batching changes tokens without it.

Run:  python benchmarks/batch_invariant.py [--rounds 3] [--batches 1,8,32] [--dtypes bfloat16,float32]
                                            [--parts shipped,20m] [--prompts 48] [--threads 1]

For each model and dtype, the default decoder and the same decoder with
``batch_invariant=True`` decode the same prompts in batches of each size (the
default engine, ``branch``), all competitors interleaved round by round in
one process (1 torch thread unless ``--threads``), after a warm-up round.
Reports CPU and wall time (median [min-max] over the rounds), the cost of
invariance as ``invariant / default`` CPU and wall time at the same batch size
*within each round* (median [min-max]), forwards, and the prompts whose tokens
differ from decoding them alone (batch 1) with the same setting.

Models: ``shipped`` is the model shipped with refusion (0.8M parameters, 4
layers, vocabulary 48) on its held-out prompts with its own preset (paper
strategies, slot 4, thresholds 0.7/0.5, 32 tokens); ``20m`` is a random 20M
Qwen3 (8 layers, hidden 256, vocabulary 32000; benchmarks/common.py) on random
prompts of 4 to 48 tokens, the same strategies, 16 tokens.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_spread, header, interleave, random_qwen3, refusion_counts

from refusion.decoding.decoder import Decoder

PRESET = {"slot_size": 4, "serial_num_blocks": 1, "slot_threshold": 0.7, "token_threshold": 0.5}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def shipped(dtype: torch.dtype, prompts: int):
    """The shipped model, its held-out prompts (as ids) and its generation length."""
    from refusion.api import load_model
    from refusion.training.tasks import held_out

    adapter = load_model(None, dtype=dtype)
    examples = held_out(max(1, -(-prompts // 6)))[:prompts]
    return adapter, [adapter.tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples], 32


def twenty_m(dtype: torch.dtype, prompts: int):
    """A random 20M Qwen3, random prompts of 4 to 48 tokens, 16 tokens to generate."""
    from refusion.models.hf import HFCausalLM

    adapter = HFCausalLM(random_qwen3("20m", dtype=dtype))
    rng = random.Random(0)
    return (
        adapter,
        [[rng.randrange(adapter.vocab_size - 1) for _ in range(rng.randint(4, 48))] for _ in range(prompts)],
        16,
    )


MODELS = {"shipped": shipped, "20m": twenty_m}


def ratio(numerators, denominators) -> str:
    values = [a / b for a, b in zip(numerators, denominators)]
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def part(name: str, dtype_name: str, prompts: int, batches: list[int], rounds: int) -> None:
    adapter, ids, gen = MODELS[name](DTYPES[dtype_name], prompts)

    def method(invariant: bool, batch: int):
        decoder = Decoder.from_names(batch_invariant=invariant, **PRESET)

        def run():
            rows, forwards = [], 0
            for i in range(0, len(ids), batch):
                results = decoder.decode_batch(adapter, ids[i : i + batch], gen)
                counts = refusion_counts(results)
                rows += counts["rows"]
                forwards += counts["forwards"]
            return {"rows": rows, "forwards": forwards, "tokens": sum(map(len, rows))}

        return run

    competitors = {
        f"{'invariant' if inv else 'default'} b{batch}": method(inv, batch)
        for batch in batches
        for inv in (False, True)
    }
    print(
        f"\n## {name}, {dtype_name}: {len(ids)} prompts, gen_length {gen}, {PRESET}, branch engine, "
        f"{rounds} rounds interleaved"
    )
    rows = {row.name: row for row in interleave(competitors, adapter, rounds=rounds, memory=False)}
    print(
        f"{'setting':<14} {'CPU s [spread]':>22} {'wall s [spread]':>22} {'invariant/default CPU':>22} "
        f"{'wall':>19} {'forwards':>8} {'differ from alone':>17}"
    )
    for batch in batches:
        for kind in ("default", "invariant"):
            row = rows[f"{kind} b{batch}"]
            alone = rows[f"{kind} b{batches[0]}"].counts["rows"] if batches[0] == 1 else None
            differ = "-" if alone is None else f"{sum(a != b for a, b in zip(row.counts['rows'], alone))}/{len(ids)}"
            cost_cpu = cost_wall = ""
            if kind == "invariant":
                base = rows[f"default b{batch}"]
                cost_cpu = ratio([r.cpu for r in row.runs], [r.cpu for r in base.runs])
                cost_wall = ratio([r.wall for r in row.runs], [r.wall for r in base.runs])
            print(
                f"{row.name:<14} {fmt_spread(row, 'cpu'):>22} {fmt_spread(row, 'wall'):>22} {cost_cpu:>22} "
                f"{cost_wall:>19} {row.counts['forwards']:>8} {differ:>17}"
            )
    first_inv, first_def = (
        rows[f"invariant b{batches[0]}"].counts["rows"],
        rows[f"default b{batches[0]}"].counts["rows"],
    )
    print(
        f"invariant b{batches[0]} gives the default b{batches[0]}'s tokens for "
        f"{sum(a == b for a, b in zip(first_inv, first_def))}/{len(ids)} prompts"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--parts", default="shipped,20m")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per part (default: 48 shipped, 16 for 20m)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(header())
    batches = [int(b) for b in args.batches.split(",")]
    for name in args.parts.split(","):
        for dtype_name in args.dtypes.split(","):
            part(name, dtype_name, args.prompts or (48 if name == "shipped" else 16), batches, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
