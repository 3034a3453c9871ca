"""The lossless loop's draft-confidence cut, on and off, against transformers ``generate`` on random Qwen3 models.

Run:  python benchmarks/draft_cut.py [--models 20m,100m] [--gen 64] [--batches 1,8,32] [--rounds 4]

Random weights (built in code, vocabulary 32,000, no EOS) make guesses that are never right: every guess the
whole-batch lossless loop feeds costs network time for nothing. ``Lossless.min_draft_probability`` feeds a
guess only while it is that likely under the prediction that made it; this benchmark runs the ``ar`` composition
(slot 8) with the floor at 0 (every guess the acceptance-adaptive sizing allows is fed) and at its default, and
``generate``, interleaved round by round in one process, 1 torch thread. Reported per batch: CPU seconds (median
[min-max]), the ratio to ``generate`` in the same round, forwards, tokens fed and rows read (projected to the
vocabulary). Both settings give the same tokens (checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, header, hf_generate, interleave, random_qwen3

from refusion.decoding.decoder import Decoder
from refusion.decoding.forms.lossless import Lossless as LosslessColumns
from refusion.decoding.scores import Scores
from refusion.models.hf import HFCausalLM

PROMPT, SLOT, BLOCK = 16, 8, 32


def counted(decoder: Decoder, adapter, prompts: list[list[int]], gen: int, floor: float) -> dict:
    """Decode with the floor set; the tokens, the tokens fed and the rows the loop read (projected to the
    vocabulary)."""
    rows = [0]
    getitem = Scores.__getitem__

    def count(scores, index):
        if isinstance(index, torch.Tensor):
            rows[0] += len(index)
        return getitem(scores, index)

    LosslessColumns.min_draft_probability, Scores.__getitem__ = floor, count  # type: ignore[method-assign]
    try:
        results = decoder.decode_batch(adapter, prompts, gen)
    finally:
        Scores.__getitem__ = getitem  # type: ignore[method-assign]
    return {"tokens": [r.tokens.tolist() for r in results], "fed": sum(r.fed_tokens for r in results), "read": rows[0]}


def race(model, adapter, decoder: Decoder, prompts: torch.Tensor, gen: int, default: float) -> dict:
    """The competitors of one batch."""
    lists = prompts.tolist()
    return {
        "generate": lambda: {"tokens": hf_generate(model, prompts, gen, adapter.mask_token_id)},
        "floor 0": lambda: counted(decoder, adapter, lists, gen, 0.0),
        f"floor {default}": lambda: counted(decoder, adapter, lists, gen, default),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="20m,100m")
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    default = LosslessColumns.min_draft_probability
    decoder = Decoder.from_names(
        selector="leftmost", infiller="greedy-verify", slot_size=SLOT, serial_num_blocks=max(1, args.gen // BLOCK)
    )
    print(header())
    for size in args.models.split(","):
        model = random_qwen3(size)
        adapter = HFCausalLM(model)
        for batch in [int(b) for b in args.batches.split(",")]:
            g = torch.Generator().manual_seed(0)
            prompts = torch.randint(0, adapter.vocab_size - 1, (batch, PROMPT), generator=g)
            competitors = race(model, adapter, decoder, prompts, args.gen, default)
            try:
                rows = interleave(competitors, adapter, rounds=args.rounds, memory=False)
            finally:
                LosslessColumns.min_draft_probability = default
            off, on = rows[1].counts, rows[2].counts
            same = off["tokens"] == on["tokens"] == [t[: args.gen] for t in rows[0].counts["tokens"]]
            print(f"\n## {size}, gen {args.gen}, batch {batch} ({args.rounds} rounds; same tokens: {same})")
            print("| competitor | CPU s | vs `generate` | forwards | tokens fed | rows read |")
            print("| --- | ---: | ---: | ---: | ---: | ---: |")
            for row in rows:
                c = row.counts
                print(
                    f"| {row.name} | {fmt_spread(row, 'cpu')} | {fmt_ratio(row)} | {row.runs[-1].network_forwards} | "
                    f"{c.get('fed', batch * (PROMPT + args.gen - 1))} | {c.get('read', batch * args.gen)} |"
                )
            gain = statistics.median(b.cpu / a.cpu for a, b in zip(rows[2].runs, rows[1].runs))
            print(f"- floor {default} against floor 0, same rounds: {gain:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
