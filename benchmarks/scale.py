"""Decoding cost at realistic scale: random Qwen3 models of ~20M and ~100M parameters, long generations, batches.

Run:  python benchmarks/scale.py [--models 20m,100m] [--gens 64,256,1024] [--batches 1,8] [--rounds 3]
                                 [--methods lossless,slot1-acc,all-accept,paper] [--engines branch,repeat]
                                 [--reference DIR --reference-python PY] [--json out.json]

Each model is built in code (no download; vocabulary 32,000, untied head,
float32, no EOS, so every method generates exactly ``gen`` tokens per row).
Prompts are 16 random tokens per row. Competitors run interleaved round by
round (see ``benchmarks/common.py``); ratios are AR ``generate`` CPU time over
the method's CPU time in the same round. Methods (slots of 8 tokens, blocks of
32 tokens, i.e. ``serial_num_blocks = gen / 32``):

* ``lossless``: ``leftmost`` + ``greedy-verify`` (exactly greedy AR output);
* ``slot1-acc``: one slot selected per step (``slot_threshold=1``: top-1
  fallback) and every draft accepted (``token_threshold=0``), about the
  trained model's regime;
* ``all-accept``: thresholds 0/0 (every slot chosen, every draft accepted);
* ``paper``: the reference's default thresholds 0.9/0.9.

``--reference DIR`` also runs the public reference decoder
(``generate_refusion`` of a local ML-GSAI/ReFusion checkout) with
``--reference-python`` (a virtual environment with the reference's own
transformers), on the same saved weights and prompts, batch 1, and reports
its CPU time against the library's ``paper`` method and whether the tokens
agree. Nothing of it is imported here or committed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ar_counts,
    fmt_ratio,
    fmt_spread,
    greedy_loop,
    header,
    hf_generate,
    interleave,
    parameters,
    random_qwen3,
    refusion_counts,
)

from refusion.decoding.decoder import Decoder
from refusion.models.hf import HFCausalLM

SLOT, BLOCK, PROMPT = 8, 32, 16

METHODS = {
    "lossless": dict(selector="leftmost", infiller="greedy-verify"),
    "slot1-acc": dict(slot_threshold=1.0, token_threshold=0.0),
    "all-accept": dict(slot_threshold=0.0, token_threshold=0.0),
    "paper": dict(slot_threshold=0.9, token_threshold=0.9),
}


def decoder_for(method: str, gen: int, engine: str) -> Decoder:
    return Decoder.from_names(slot_size=SLOT, serial_num_blocks=max(1, gen // BLOCK), engine=engine, **METHODS[method])


def prompts_for(batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (batch, PROMPT), generator=g)


def competitors(model, adapter, gen: int, batch: int, methods, engines):
    prompts = prompts_for(batch, adapter.vocab_size)
    lists = prompts.tolist()
    mask = adapter.mask_token_id
    fed_ar = batch * PROMPT + batch * (gen - 1)
    out = {
        "AR generate": lambda: ar_counts(hf_generate(model, prompts, gen, mask), gen, fed_ar),
        "AR hand loop": lambda: ar_counts(greedy_loop(model, prompts, gen, mask), gen, fed_ar),
    }
    for method in methods:
        for engine in engines:
            if method == "lossless" and engine == "repeat" and batch > 1:
                continue
            decoder = decoder_for(method, gen, engine)
            out[f"{method} {engine}"] = lambda d=decoder: refusion_counts(d.decode_batch(adapter, lists, gen))
    return out


def table(rows, batch: int, gen: int, token_bytes: int) -> list[dict]:
    need = batch * (PROMPT + gen) * token_bytes  # keys/values of every row's prompt and answer
    print(
        f"{'method':<22} {'CPU s [spread]':>22} {'wall s':>8} {'vs generate':>20} {'ms/token':>9} "
        f"{'fwd':>6} {'fed/fwd':>8} {'tok/fwd':>8} {'outside ms/seq/fwd':>19} "
        f"{'KV ctx MB':>10} {'KV buf/need':>11} {'peak MB':>7}"
    )
    records = []
    for row in rows:
        c = row.counts
        tokens, forwards = c["tokens"], max(1, row.runs[-1].network_forwards or c["forwards"])
        cpu = row.median("cpu")
        outside = statistics.median((r.cpu - r.network_cpu) / max(1, r.network_forwards) / batch for r in row.runs)
        kv = "-" if c["kv_context"] is None else f"{c['kv_context'] / 1e6:.1f}"
        buffer = row.runs[-1].kv_buffer
        buf = f"{buffer / need:.2f}" if buffer else "-"
        print(
            f"{row.name:<22} {fmt_spread(row, 'cpu'):>22} {row.median('wall'):>8.2f} {fmt_ratio(row):>20} "
            f"{1e3 * cpu / tokens:>9.2f} {forwards:>6} {c['fed'] / forwards:>8.1f} {tokens / forwards:>8.2f} "
            f"{1e3 * outside:>19.2f} {kv:>10} {buf:>11} {row.median('rss_rise') / 2**20:>7.1f}"
        )
        records.append(
            {
                "method": row.name,
                "gen": gen,
                "batch": batch,
                "cpu": cpu,
                "cpu_spread": row.spread("cpu"),
                "wall": row.median("wall"),
                "ratio": statistics.median(row.ratios),
                "ratio_spread": (min(row.ratios), max(row.ratios)),
                "ms_per_token": 1e3 * cpu / tokens,
                "forwards": forwards,
                "fed_per_forward": c["fed"] / forwards,
                "tokens_per_forward": tokens / forwards,
                "outside_ms_per_seq_forward": 1e3 * outside,
                "kv_context_bytes": c["kv_context"],
                "kv_new_bytes": c["kv_new"],
                "kv_buffer_bytes": buffer,
                "kv_needed_bytes": need,
                "peak_memory_rise_mb": row.median("rss_rise") / 2**20,
            }
        )
    return records


def check_lossless(rows) -> None:
    ar = next(r for r in rows if r.name == "AR generate").counts["rows"]
    for row in rows:
        if row.name.startswith("lossless"):
            assert row.counts["rows"] == ar, f"{row.name} differs from greedy AR"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="20m,100m")
    parser.add_argument("--gens", default="64,256,1024")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--engines", default="branch,repeat")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip", default="", help="comma-separated model:gen:batch triples to leave out")
    parser.add_argument("--reference", default=None, help="local checkout of ML-GSAI/ReFusion (optional)")
    parser.add_argument("--reference-python", default=None, help="python of a venv that can run the reference")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(header())
    skip = set(args.skip.split(",")) - {""}
    records = []
    for size in args.models.split(","):
        model = random_qwen3(size)
        adapter = HFCausalLM(model)
        print(f"\n## model {size}: {parameters(model) / 1e6:.1f}M parameters, vocab {adapter.vocab_size}")
        for gen in map(int, args.gens.split(",")):
            for batch in map(int, args.batches.split(",")):
                if f"{size}:{gen}:{batch}" in skip:
                    continue
                print(f"\n### gen {gen}, batch {batch} ({args.rounds} rounds, interleaved)", flush=True)
                rows = interleave(
                    competitors(model, adapter, gen, batch, args.methods.split(","), args.engines.split(",")),
                    adapter,
                    rounds=args.rounds,
                )
                check_lossless(rows)
                layers, heads, dim, dtype = adapter.kv_shape()
                token_bytes = layers * 2 * heads * dim * torch.finfo(dtype).bits // 8
                for record in table(rows, batch, gen, token_bytes):
                    records.append({"model": size, **record})
        if args.reference:
            from reference_runner import compare_with_reference

            records.extend(compare_with_reference(model, adapter, size, args))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
