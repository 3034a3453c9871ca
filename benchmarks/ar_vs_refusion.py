"""AR vs ReFusion decoding on the shipped model and its held-out synthetic tasks.

Run:  python benchmarks/ar_vs_refusion.py [--per-task 30] [--model DIR]

Prints, measured in one run on the same weights and examples (batch 1, after a
warm-up): exact-match accuracy, model forwards, tokens per forward, wall time
and the wall-time ratio to transformers' greedy AR ``generate`` (KV cache).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import attrs
import torch

from refusion.api import load_model
from refusion.bench import ar_method, decoder_method, measure, table
from refusion.decoder import Decoder
from refusion.training.tasks import held_out

GEN_LENGTH = 32

CONFIGS = {
    "refusion paper s=8 slot_t=0.9 tok_t=0.9": dict(slot_size=8, serial_num_blocks=1, slot_threshold=0.9, token_threshold=0.9),
    "refusion paper s=8 slot_t=0.7 tok_t=0.5": dict(slot_size=8, serial_num_blocks=1, slot_threshold=0.7, token_threshold=0.5),
    "refusion paper s=4 slot_t=0.9 tok_t=0.9": dict(slot_size=4, serial_num_blocks=1, slot_threshold=0.9, token_threshold=0.9),
    "refusion paper s=4 slot_t=0.7 tok_t=0.5": dict(slot_size=4, serial_num_blocks=1, slot_threshold=0.7, token_threshold=0.5),
    "refusion paper s=4 slot_t=0.5 tok_t=0.3": dict(slot_size=4, serial_num_blocks=1, slot_threshold=0.5, token_threshold=0.3),
    "refusion lossless (leftmost, greedy-verify) s=8": dict(
        selector="leftmost", infiller="greedy-verify", slot_size=8, serial_num_blocks=1
    ),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the shipped model)")
    parser.add_argument("--per-task", type=int, default=30, help="held-out examples per task")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    adapter = load_model(args.model, dtype=torch.float32)
    examples = held_out(args.per_task)
    print(f"# {len(examples)} held-out examples, gen_length {GEN_LENGTH}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}", flush=True)
    rows = [measure("AR: transformers generate (greedy, KV cache)", ar_method(adapter, GEN_LENGTH), adapter, examples)]
    for name, params in CONFIGS.items():
        params = dict(params)
        decoder = Decoder.from_names(**params)
        rows.append(measure(name, decoder_method(decoder, adapter, GEN_LENGTH), adapter, examples))
        print(f"  done: {name}", file=sys.stderr, flush=True)
    print(table(rows, rows[0].method))
    print("\nper-task accuracy:")
    tasks = list(rows[0].per_task)
    print(f"{'method':<44} " + " ".join(f"{t:>8}" for t in tasks))
    for r in rows:
        print(f"{r.method:<44} " + " ".join(f"{r.per_task[t]:>8.1%}" for t in tasks))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**attrs.asdict(r), "accuracy": r.accuracy, "tokens_per_forward": r.tokens_per_forward} for r in rows],
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
