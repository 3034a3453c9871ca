"""AR vs ReFusion decoding on the shipped model and its held-out synthetic tasks, interleaved.

Run:  python benchmarks/ar_vs_refusion.py [--per-task 30] [--rounds 3] [--threads 1] [--json out.json]

Same weights, same held-out prompts (never seen in training), batch 1,
``gen_length`` 32. The competitors - transformers ``generate``, a hand-written
greedy loop with a ``DynamicCache``, and refusion's decoders - run interleaved
round by round (order rotating), after a warm-up round; each reports CPU time
and wall time (median [min-max] over rounds), the ratio to ``generate`` and to
the hand loop measured within each round, accuracy, forwards, tokens fed and
generated per forward, and the time spent outside the network per forward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, greedy_loop, header, hf_generate, interleave

from refusion.api import load_model
from refusion.decoding.decoder import Decoder
from refusion.decoding.loop import drive
from refusion.engines import open_engine
from refusion.training.tasks import held_out, is_correct

GEN_LENGTH = 32

CONFIGS = {
    "ReFusion slot 4, 0.7/0.5 (the model's preset)": dict(slot_size=4, slot_threshold=0.7, token_threshold=0.5),
    "ReFusion slot 8, 0.7/0.5": dict(slot_size=8, slot_threshold=0.7, token_threshold=0.5),
    "ReFusion slot 8, 0.9/0.9": dict(slot_size=8, slot_threshold=0.9, token_threshold=0.9),
    "ReFusion slot 4, 0.9/0.9": dict(slot_size=4, slot_threshold=0.9, token_threshold=0.9),
    "lossless (leftmost, greedy-verify), slot 8": dict(selector="leftmost", infiller="greedy-verify", slot_size=8),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the shipped model)")
    parser.add_argument("--per-task", type=int, default=30, help="held-out examples per task")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    adapter = load_model(args.model, dtype=torch.float32)
    tok = adapter.tokenizer
    examples = held_out(args.per_task)
    prompts = [tok(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    eos, mask = sorted(adapter.eos_token_ids), adapter.mask_token_id

    def scored(outputs, forwards=None, fed=None):
        correct = sum(is_correct(e, tok.decode(o, skip_special_tokens=True)) for e, o in zip(examples, outputs))
        return {"tokens": sum(len(o) for o in outputs), "correct": correct, "forwards": forwards, "fed": fed}

    def ar(fn):
        def run():
            outs = [fn(adapter.model, torch.tensor([p]), GEN_LENGTH, mask, eos)[0] for p in prompts]
            fed = sum(len(p) + len(o) - 1 for p, o in zip(prompts, outs))
            return scored(outs, fed=fed)

        return run

    def ours(decoder, batched=True):
        engine = open_engine(adapter, decoder)

        def one(prompt):
            if batched:  # the public path: the batched form where the composition has one
                return decoder.decode(adapter, prompt, GEN_LENGTH, engine=engine)
            session = decoder.start(adapter, engine, decoder.prepare(adapter, prompt, GEN_LENGTH))
            return drive(engine, [session], batched=False)[0]  # the per-sequence program

        def run():
            results = [one(p) for p in prompts]
            return scored([r.tokens.tolist() for r in results], fed=sum(r.fed_tokens for r in results))

        return run

    competitors = {"AR: transformers generate": ar(hf_generate), "AR: hand-written greedy loop": ar(greedy_loop)}
    for name, params in CONFIGS.items():
        competitors[name] = ours(Decoder.from_names(serial_num_blocks=1, **params))
    preset = next(iter(CONFIGS))
    competitors["  the same, per-sequence program"] = ours(
        Decoder.from_names(serial_num_blocks=1, **CONFIGS[preset]), batched=False
    )
    print(header())
    print(f"# {len(examples)} held-out examples, gen_length {GEN_LENGTH}, batch 1, {args.rounds} rounds interleaved")
    rows = interleave(competitors, adapter, rounds=args.rounds, memory=False)
    loop = next(r for r in rows if r.name.startswith("AR: hand"))
    print(
        f"{'method':<46} {'acc':>6} {'CPU s [spread]':>20} {'wall s':>7} {'vs generate':>19} {'vs hand loop':>8} "
        f"{'fwd':>5} {'tok/fwd':>7} {'fed/fwd':>7} {'outside ms/fwd':>14}"
    )
    records = []
    for row in rows:
        c = row.counts
        forwards = row.runs[-1].network_forwards
        outside = statistics.median((r.cpu - r.network_cpu) / max(1, r.network_forwards) for r in row.runs)
        vs_loop = statistics.median(lr.cpu / r.cpu for lr, r in zip(loop.runs, row.runs))
        print(
            f"{row.name:<46} {c['correct'] / len(examples):>6.1%} {fmt_spread(row, 'cpu'):>20} "
            f"{row.median('wall'):>7.2f} {fmt_ratio(row):>19} {vs_loop:>7.2f}x {forwards:>5} "
            f"{c['tokens'] / forwards:>7.2f} {c['fed'] / forwards:>7.1f} {1e3 * outside:>14.2f}"
        )
        records.append(
            {
                "method": row.name,
                "accuracy": c["correct"] / len(examples),
                "cpu": row.median("cpu"),
                "cpu_spread": row.spread("cpu"),
                "wall": row.median("wall"),
                "vs_generate": statistics.median(row.ratios),
                "vs_generate_spread": (min(row.ratios), max(row.ratios)),
                "vs_hand_loop": vs_loop,
                "forwards": forwards,
                "tokens_per_forward": c["tokens"] / forwards,
                "fed_per_forward": c["fed"] / forwards,
                "outside_ms_per_forward": 1e3 * outside,
            }
        )
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
