"""What the reference's arithmetic costs the paper presets: softmax in the logits' dtype versus the fused float32 path.

Run:  python benchmarks/authors_arithmetic.py [--rounds 3] [--models shipped,20m] [--dtypes float32,bfloat16]
                                              [--gen 128] [--batch 4] [--threads 1]

The ``paper`` preset computes confidences as ML-GSAI/ReFusion's
``generate_refusion`` does (``softmax`` in the logits' dtype, ``torch.topk``
over the block's slots: ``precision="logits"``, ``ties="slots"``), so it
reproduces the reference's tokens in bfloat16 (docs/models.md). Before, it
took them from the fused LM-head statistics in float32 (``precision="float32"``,
``ties="lowest"``: the rows read are projected with the other sequences' in
one pass, and no ``(rows, vocab)`` probabilities exist). This script decodes
the same prompts both ways, interleaved round by round in one process
(benchmarks/common.py), and reports CPU and wall time (median [min-max]), the
ratio to the fused path within each round, and whether the tokens agree.

Models: ``shipped`` (0.8M parameters, vocabulary 48, its held-out prompts,
32 tokens); ``20m``, a random 20M Qwen3 (vocabulary 32,000: the LM head is
about half of each row's work, the worst case for projecting rows one
sequence at a time), random prompts of 16 tokens, slots of 8 in blocks of 32,
thresholds 0.9/0.9 (``paper``) and 1.0/0.0 (``slot1-acc``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, header, interleave, random_qwen3, refusion_counts

import refusion
from refusion.models.hf import HFCausalLM

FUSED = {"precision": "float32", "ties": "lowest"}
CONFIGS = {
    "paper 0.9/0.9": dict(slot_threshold=0.9, token_threshold=0.9),
    "slot1-acc": dict(slot_threshold=1.0, token_threshold=0.0),
}


def setup(name: str, dtype: torch.dtype, batch: int):
    """``(adapter, prompts, fixed parameters)`` for one model."""
    if name == "shipped":
        from refusion.training.tasks import held_out

        adapter = refusion.load_model(dtype=dtype)
        examples = held_out(max(1, -(-batch // 6)))[:batch]
        return (
            adapter,
            [adapter.tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples],
            dict(gen_length=32),
        )
    model = random_qwen3("20m", dtype=dtype)
    mask = model.config.vocab_size - 1
    with torch.no_grad():
        model.lm_head.weight[mask].zero_()
    adapter = HFCausalLM(model, None, mask_token_id=mask, eos_token_id=[])
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, adapter.vocab_size - 1, (batch, 16), generator=g).tolist()
    return adapter, prompts, dict(slot_size=8, serial_num_blocks=4)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="shipped,20m")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(header())
    for name in a.models.split(","):
        for dtype_name in a.dtypes.split(","):
            adapter, prompts, fixed = setup(name, getattr(torch, dtype_name), a.batch)
            length = fixed.pop("gen_length", a.gen)
            for config, thresholds in CONFIGS.items():
                params = {**fixed, **thresholds}
                tokens = {}

                def run(extra, key, prompts=prompts, adapter=adapter, length=length, params=params, tokens=tokens):
                    results = refusion.generate(prompts, adapter, preset="paper", gen_length=length, **params, **extra)
                    tokens[key] = [r.tokens.tolist() for r in results]
                    return refusion_counts(results)

                rows = interleave(
                    {"fused float32": lambda: run(FUSED, "fused"), "authors' arithmetic": lambda: run({}, "authors")},
                    adapter,
                    rounds=a.rounds,
                    baseline="fused float32",
                    memory=False,
                )
                print(f"\n## {name}, {dtype_name}, {config}, gen {length}, batch {len(prompts)}")
                for row in rows:
                    print(
                        f"{row.name:<22} CPU s {fmt_spread(row, 'cpu'):>20}  wall s {fmt_spread(row, 'wall'):>20}  "
                        f"fused/this {fmt_ratio(row)}"
                    )
                print(f"same tokens: {sum(x == y for x, y in zip(tokens['fused'], tokens['authors']))}/{len(prompts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
