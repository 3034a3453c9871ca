"""How often the branch and repeat engines disagree in bfloat16, on the settings of test_batch_equals_single_and_repeat.

Run:  python benchmarks/bf16_engines.py SINGLE_TRIALS [BATCH_TRIALS]   (from the repository root)

Each trial draws a decoder and a tiny bf16 Qwen3 as the test does; single
trials compare one prompt decoded by each engine, batch trials compare a
batch on the branch engine with each prompt decoded alone on repeat.
Counts only (no timing): the disagreements are rounding, not speed.
"""

import random
import sys

import attrs
import torch

sys.path.insert(0, ".")

from refusion.models.hf import HFCausalLM
from refusion.models.tiny import tiny_qwen3
from tests.engines.test_engines import decoder_from


def draw(rng: random.Random):
    """A decoder, a bf16 tiny model and a generation length, drawn as the batch test draws them."""
    settings = {
        "selector": rng.choice(["threshold", "topk", "leftmost", "margin", "entropy"]),
        "infiller": rng.choice(["parallel-ar", "greedy-verify"]),
        "reorderer": rng.choice(["commit-order", "reencode"]),
        "slot_size": rng.randint(1, 4),
        "serial_num_blocks": rng.randint(1, 2),
        "threshold": rng.random(),
        "k": rng.randint(1, 3),
    }
    seed = rng.randint(0, 5000)
    adapter = HFCausalLM(tiny_qwen3(vocab_size=16, seed=seed, logit_scale=8.0, eos_token_id=2, dtype=torch.bfloat16))
    return decoder_from(settings), adapter, settings


def prompt(rng: random.Random) -> list[int]:
    return [rng.randint(0, 14) for _ in range(rng.randint(1, 9))]


def main() -> None:
    torch.set_num_threads(1)
    rng = random.Random(0)
    single_trials = int(sys.argv[1])
    batch_trials = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    differ = 0
    for _ in range(single_trials):
        decoder, adapter, s = draw(rng)
        p = prompt(rng)
        g = s["slot_size"] * s["serial_num_blocks"] * rng.randint(1, 3)
        a = attrs.evolve(decoder, engine="branch").decode(adapter, p, g).tokens.tolist()
        b = attrs.evolve(decoder, engine="repeat").decode(adapter, p, g).tokens.tolist()
        differ += a != b
    print(f"bf16 branch != repeat: {differ}/{single_trials}")
    batched_prompts = batched_differ = 0
    for _ in range(batch_trials):
        decoder, adapter, s = draw(rng)
        prompts = [prompt(rng) for _ in range(rng.randint(2, 4))]
        g = s["slot_size"] * s["serial_num_blocks"] * rng.randint(1, 3)
        batched = [r.tokens.tolist() for r in decoder.decode_batch(adapter, prompts, g)]
        alone = [attrs.evolve(decoder, engine="repeat").decode(adapter, p, g).tokens.tolist() for p in prompts]
        batched_prompts += len(prompts)
        batched_differ += sum(x != y for x, y in zip(batched, alone))
    print(f"bf16 batched branch != repeat alone: {batched_differ}/{batched_prompts} prompts")


if __name__ == "__main__":
    main()
