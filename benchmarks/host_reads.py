"""Host reads (GPU synchronisation points) per engine step, per engine, decoder and batch size.

Run:  python benchmarks/host_reads.py [--batches 1 8 32] [--json PATH] [--sites 15]

Counts, not times: every figure is hardware independent. Each case decodes a
batch under :class:`refusion.measure.host_reads.HostReads` (on the CPU it
counts reads of tensors the network computed, or derived from them; see its
docstring) and reports engine steps, network forwards, host reads in all,
per engine step and per live sequence per engine step, reads outside the
steps (admission, results), reads of tensors the code placed on the device
itself (``placed``: made with ``device=`` the model's device or a
device-resident tensor's) and reads by kind. The goal
(issue 22) is a per-step count that does not grow with the batch. Below the
table, the call sites with the most reads over all cases (first refusion
frame; ``<-`` the innermost frame when it is elsewhere).

Cases: the shipped model (its held-out prompts, gen 32) and a random 20M
Qwen3 (random prompts of 8-24 tokens, gen 64) with the shipped preset
(threshold + parallel-ar, slot 4) and the lossless decoder (leftmost +
greedy-verify, slot 8) on the ``branch`` and ``repeat`` engines; a
bidirectional random 20M Qwen3 with the Fast-dLLM preset on ``canvas``.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import header, random_qwen3

from refusion.decoding.decoder import Decoder
from refusion.measure.host_reads import HostReads, format_table

SHIPPED = dict(serial_num_blocks=1, slot_size=4, slot_threshold=0.7, token_threshold=0.5)
LOSSLESS = dict(selector="leftmost", infiller="greedy-verify", slot_size=8, serial_num_blocks=1)


def shipped_prompts(adapter, n: int) -> list[list[int]]:
    from refusion.training.tasks import held_out

    examples = held_out(max(1, -(-n // 6)))
    return [adapter.tokenizer.encode(examples[i % len(examples)].prompt) for i in range(n)]


def random_prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab - 1) for _ in range(rng.randint(8, 24))] for _ in range(n)]


def cases(models: list[str]):
    """``(label, adapter, decoder, engine, prompts(n), gen_length)`` of every case."""
    from refusion.api import load_model
    from refusion.config.presets import preset
    from refusion.models.hf import HFCausalLM
    from refusion.models.mdm import HFMaskedDiffusionLM

    decoders = {"shipped": Decoder.from_names(**SHIPPED), "lossless": Decoder.from_names(**LOSSLESS)}
    if "shipped" in models:
        adapter = load_model(None, dtype=torch.float32)
        for name, decoder in decoders.items():
            for engine in ("branch", "repeat"):
                yield (
                    f"shipped model / {name} / {engine}",
                    adapter,
                    decoder,
                    engine,
                    lambda n, a=adapter: shipped_prompts(a, n),
                    32,
                )
    if "20m" in models:
        adapter = HFCausalLM(random_qwen3("20m"))
        for name, decoder in decoders.items():
            for engine in ("branch", "repeat"):
                yield f"qwen3 20m / {name} / {engine}", adapter, decoder, engine, lambda n: random_prompts(32000, n), 64
    if "20m-bidirectional" in models:
        network = random_qwen3("20m")
        network.config.is_causal = False
        adapter = HFMaskedDiffusionLM(network)
        decoder = Decoder.from_spec(preset("fast-dllm"))
        yield "qwen3 20m bidir / fast-dllm / canvas", adapter, decoder, "canvas", lambda n: random_prompts(32000, n), 64


def measure(adapter, decoder, engine: str, prompts: list[list[int]], gen_length: int) -> dict:
    with HostReads(adapter) as reads:
        results = decoder.decode_batch(adapter, prompts, gen_length, engine=engine)
    summary = reads.summary(sites=1000)
    summary["engine_forwards"] = results[0].engine_totals["forwards"]
    summary["tokens"] = sum(len(r.tokens) for r in results)
    summary["mean_sequences_per_step"] = (
        sum(s.sequences for s in reads.steps) / len(reads.steps) if reads.steps else 0.0
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["shipped", "20m", "20m-bidirectional"],
        choices=["shipped", "20m", "20m-bidirectional"],
    )
    parser.add_argument("--sites", type=int, default=15, help="call sites listed below the table")
    parser.add_argument("--json", type=Path, help="write every figure (and every call site) here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(header())
    rows, sites, placed_sites = [], collections.Counter(), collections.Counter()
    for label, adapter, decoder, engine, prompts, gen_length in cases(args.models):
        for batch in args.batches:
            start = time.perf_counter()
            row = measure(adapter, decoder, engine, prompts(batch), gen_length)
            row.update(label=label, batch=batch, gen_length=gen_length, seconds=time.perf_counter() - start)
            for site in row["top_sites"]:
                sites[(site["kind"], site["site"])] += site["count"]
            for site in row["top_placed_sites"]:
                placed_sites[(site["kind"], site["site"])] += site["count"]
            row["top_sites"], row["top_placed_sites"] = (
                row["top_sites"][: args.sites],
                row["top_placed_sites"][: args.sites],
            )
            rows.append(row)
            print(format_table([row]).splitlines()[-1], flush=True)
    print()
    print(format_table(rows))
    print(
        "\nforwards per step: "
        + ", ".join(
            f"{r['label']} b{r['batch']} {r['forwards'] / max(1, r['steps']):.2f}"
            for r in rows
            if r["batch"] == max(args.batches)
        )
    )
    print(f"\ntop {args.sites} call sites of network-data reads (all cases):")
    for (kind, site), count in sites.most_common(args.sites):
        print(f"{count:>8}  {kind:<12} {site}")
    print(f"\ntop {args.sites} call sites of placed-tensor reads (all cases):")
    for (kind, site), count in placed_sites.most_common(args.sites):
        print(f"{count:>8}  {kind:<12} {site}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "header": header(),
                    "rows": rows,
                    "sites": [{"count": c, "kind": k, "site": s} for (k, s), c in sites.most_common()],
                    "placed_sites": [{"count": c, "kind": k, "site": s} for (k, s), c in placed_sites.most_common()],
                },
                indent=1,
            )
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
