"""Soak: many thousands of decodes in one process; prints resident memory as it goes.

Run:  python benchmarks/soak.py [--decodes 20000]

Alternates the paper configuration and an MDM configuration on a tiny random
model, in batches of 2, and reports RSS and live Python objects every tenth of
the run. Flat numbers after the warm-up mean no leak.
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time

from refusion.decoding.decoder import Decoder
from refusion.models.hf import HFCausalLM
from refusion.models.tiny import tiny_qwen3


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decodes", type=int, default=20000)
    args = parser.parse_args(argv)
    model = HFCausalLM(tiny_qwen3(vocab_size=16, seed=3, logit_scale=6.0, eos_token_id=2))
    decoders = [
        Decoder.from_names(slot_size=2, serial_num_blocks=1, slot_threshold=0.5, token_threshold=0.5),
        Decoder.from_names(partitioner="semi-ar", selector="topk", infiller="draft", block_length=4, k=2),
    ]
    prompts = [[1 + i % 13, 2 + i % 11, 3 + i % 7] for i in range(97)]
    start = time.perf_counter()
    print(f"{'decodes':>8} {'RSS MB':>8} {'objects':>9} {'seconds':>8}")
    for i in range(args.decodes // 2):
        decoders[i % 2].decode_batch(model, [prompts[i % 97], prompts[(i + 5) % 97]], 6)
        if (2 * (i + 1)) % max(2, args.decodes // 10) == 0:
            gc.collect()
            print(
                f"{2 * (i + 1):>8} {rss_mb():>8.1f} {len(gc.get_objects()):>9} {time.perf_counter() - start:>8.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
