"""How often the branch and repeat engines disagree in bfloat16 on the settings of test_batch_equals_single_and_repeat.

Run:  python benchmarks/bf16_engines.py SINGLE_TRIALS BATCH_TRIALS  (from the repository root)
"""
import random, attrs, torch, sys
torch.set_num_threads(1)
from refusion.decoder import Decoder
from refusion.models.hf import HFCausalLM
from refusion.models.tiny import tiny_qwen3
sys.path.insert(0, '.')
from tests.test_engines import decoder_from
rng = random.Random(0)
n = diff = first_diff_logit = 0
for trial in range(int(sys.argv[1])):
    s = {"selector": rng.choice(["threshold", "topk", "leftmost", "margin", "entropy"]),
         "infiller": rng.choice(["parallel-ar", "greedy-verify"]), "reorderer": rng.choice(["commit-order", "reencode"]),
         "slot_size": rng.randint(1, 4), "serial_num_blocks": rng.randint(1, 2), "threshold": rng.random(), "k": rng.randint(1, 3)}
    seed = rng.randint(0, 5000)
    adapter = HFCausalLM(tiny_qwen3(vocab_size=16, seed=seed, logit_scale=8.0, eos_token_id=2, dtype=torch.bfloat16))
    d = decoder_from(s)
    prompt = [rng.randint(0, 14) for _ in range(rng.randint(1, 9))]
    g = s["slot_size"] * s["serial_num_blocks"] * rng.randint(1, 3)
    a = attrs.evolve(d, engine="branch").decode(adapter, prompt, g).tokens.tolist()
    b = attrs.evolve(d, engine="repeat").decode(adapter, prompt, g).tokens.tolist()
    n += 1; diff += a != b
print(f"bf16 branch != repeat: {diff}/{n}")
nb = db = 0
for trial in range(int(sys.argv[2]) if len(sys.argv) > 2 else 0):
    s = {"selector": rng.choice(["threshold", "topk", "leftmost", "margin", "entropy"]),
         "infiller": rng.choice(["parallel-ar", "greedy-verify"]), "reorderer": rng.choice(["commit-order", "reencode"]),
         "slot_size": rng.randint(1, 4), "serial_num_blocks": rng.randint(1, 2), "threshold": rng.random(), "k": rng.randint(1, 3)}
    seed = rng.randint(0, 5000)
    adapter = HFCausalLM(tiny_qwen3(vocab_size=16, seed=seed, logit_scale=8.0, eos_token_id=2, dtype=torch.bfloat16))
    d = decoder_from(s)
    prompts = [[rng.randint(0, 14) for _ in range(rng.randint(1, 9))] for _ in range(rng.randint(2, 4))]
    g = s["slot_size"] * s["serial_num_blocks"] * rng.randint(1, 3)
    batched = [r.tokens.tolist() for r in d.decode_batch(adapter, prompts, g)]
    rep = [attrs.evolve(d, engine="repeat").decode(adapter, p, g).tokens.tolist() for p in prompts]
    for x, y in zip(batched, rep):
        nb += 1; db += x != y
print(f"bf16 batched branch != repeat alone: {db}/{nb} prompts")
