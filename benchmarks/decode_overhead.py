"""Batch growth and time outside the network per forward: refusion's decode core against transformers ``generate``
and a hand-written greedy loop, on a tiny random Qwen3 where the forward costs little (issue 31's goals).

Run:  python benchmarks/decode_overhead.py [--batches 1,8,32] [--gen-length 64] [--rounds 3] [--preset ar]

For each batch size, interleaved round by round in one process (1 torch thread): refusion ``decode_batch`` with
the preset (lossless ``ar`` by default; every position decoded, ``stop_at_eos=False``) without iteration records
and with them (``record=True``), ``generate`` and the hand loop, each producing ``gen-length`` tokens per prompt
(prompts of 6-14 random tokens). Reported: CPU seconds (median [min-max]), network seconds (CPU inside the
network's forwards), forwards, the time outside the network per forward (``(cpu - network) / forwards``), and the
batch growth ``cpu(largest batch) / cpu(batch 1)`` of each competitor with its ratio to ``generate``'s.
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from benchmarks.common import fmt_spread, greedy_loop, header, hf_generate, interleave, refusion_counts
from refusion.api import build_decoder
from refusion.config.params import parse_param
from refusion.models.hf import HFCausalLM
from refusion.models.tiny import tiny_qwen3


def programs(decoder, adapter, prompts, gen_length) -> list:
    """``decode_batch`` with every row run as its per-sequence program (no whole-batch loop, no records)."""
    from refusion.decoding.loop import drive
    from refusion.engines import open_engine

    engine = open_engine(adapter, decoder, None)
    prepared = [decoder.prepare(adapter, p, gen_length) for p in prompts]
    return drive(engine, [decoder.start(adapter, engine, p) for p in prepared], batched=False)


def race(network, adapter, decoder, prompts, padded, gen_length, mask) -> dict:
    """The competitors of one batch: each decodes ``gen_length`` tokens for every prompt and returns its counts."""
    return {
        "generate": lambda: {"tokens": sum(map(len, hf_generate(network, padded, gen_length, mask)))},
        "hand loop": lambda: {"tokens": sum(map(len, greedy_loop(network, padded, gen_length, mask)))},
        "refusion": lambda: refusion_counts(decoder.decode_batch(adapter, prompts, gen_length)),
        "refusion programs": lambda: refusion_counts(programs(decoder, adapter, prompts, gen_length)),
        "refusion record=True": lambda: refusion_counts(
            decoder.decode_batch(adapter, prompts, gen_length, record=True)
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--preset", default="ar", help="a preset name, or 'default': the library's default parts")
    p.add_argument(
        "--params", default="", help="decoder options, e.g. slot_size=4,slot_threshold=0.7 or sampler=categorical"
    )
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    network = tiny_qwen3(
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_positions=512,
        dtype=torch.float32,
        logit_scale=4.0,
    )
    network.eval()
    adapter = HFCausalLM(network)
    mask = adapter.mask_token_id
    params = dict(parse_param(kv) for kv in a.params.split(",") if kv)
    preset = None if a.preset == "default" else a.preset
    decoder, _ = build_decoder(adapter, preset=preset, stop_at_eos=False, **params)
    rng = random.Random(0)
    print(header())
    print(f"# tiny Qwen3 (hidden 64, 2 layers, vocab 512), preset {a.preset}, gen {a.gen_length}, {a.rounds} rounds")
    cpu: dict[str, dict[int, float]] = {}
    for batch in [int(b) for b in a.batches.split(",")]:
        prompts = [[rng.randrange(4, 500) for _ in range(rng.randint(6, 14))] for _ in range(batch)]
        width = max(len(q) for q in prompts)
        padded = torch.tensor([[q[0]] * (width - len(q)) + q for q in prompts])  # same-length rows for the AR loops
        competitors = race(network, adapter, decoder, prompts, padded, a.gen_length, mask)
        rows = interleave(competitors, adapter, rounds=a.rounds, baseline="generate", memory=False)
        print(f"\n## batch {batch}")
        print("| competitor | CPU s | network s | forwards | outside / forward (ms) | generate CPU / this |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for row in rows:
            outside = [(r.cpu - r.network_cpu) / max(r.network_forwards, 1) * 1e3 for r in row.runs]
            spread = f"{statistics.median(outside):.3f} [{min(outside):.3f}-{max(outside):.3f}]"
            print(
                f"| {row.name} | {fmt_spread(row, 'cpu')} | {fmt_spread(row, 'network_cpu')} | "
                f"{row.runs[-1].network_forwards} | {spread} | {statistics.median(row.ratios):.2f}x |"
            )
            cpu.setdefault(row.name, {})[batch] = row.median("cpu")
    sizes = sorted(next(iter(cpu.values())))
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        base = cpu["generate"][hi] / cpu["generate"][lo]
        print(f"\n## batch growth: CPU at batch {hi} / CPU at batch {lo}")
        for name, by in cpu.items():
            growth = by[hi] / by[lo]
            print(f"- {name}: {growth:.2f}x ({growth / base:.2f}x generate's growth)")


if __name__ == "__main__":
    main()
