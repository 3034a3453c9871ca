"""DiffusionGemma: refusion's canvas-denoising loop against transformers' own ``generate``, same tokens.

Run:  python benchmarks/diffusion_gemma.py [--model PATH] [--prompts 4] [--new-tokens 64] [--rounds 3]

A random DiffusionGemma built by transformers' class (hidden 256, 4 layers: three sliding-window, one full
attention; 8 experts top 2 beside the dense MLP; vocabulary 32000; canvas 32), or ``--model`` a checkpoint.
Competitors, interleaved round by round in one process after a warm-up, 1 torch thread:

* ``transformers generate``: ``torch.manual_seed(seed); model.generate(prompt, ...)`` per prompt (batch 1);
* ``refusion, one by one``: ``refusion.generate(prompt, model, seed=seed, ...)`` per prompt;
* ``refusion, one batch``: all prompts in one ``decode_batch`` (each with its own seed).

Every competitor must give the same tokens (checked each round). Reported per competitor: CPU and wall time
(median [min-max] over rounds), the ratio to ``transformers generate``'s CPU time in the same round,
denoiser passes, answer tokens per denoiser pass, and the CPU time outside the network per denoiser pass
(the network: the encoder's and the denoiser's forwards, timed by hooks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import header

import refusion


def random_model(seed: int = 0):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    torch.manual_seed(seed)
    text = dict(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        global_head_dim=128,
        num_global_key_value_heads=1,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        sliding_window=128,
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=128,
        max_position_embeddings=2048,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        patch_size=4,
        position_embedding_size=16,
    )
    config = DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=32,
        image_token_id=31999,
        boi_token_id=31998,
        eoi_token_id=31997,
    )
    return DiffusionGemmaForBlockDiffusion(config).eval()


class NetworkClock:
    """CPU time inside the encoder's and the denoiser's forwards (outermost calls only), and denoiser passes."""

    def __init__(self, network):
        self.modules = (network.model.encoder, network.model)
        self.denoiser = network.model
        self.seconds, self.passes, self._depth, self._start = 0.0, 0, 0, 0.0
        self._handles = []

    def __enter__(self):
        for module in self.modules:
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._exit))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()

    def _enter(self, module, args):
        if self._depth == 0:
            self._start = time.process_time()
            self.passes += module is self.denoiser
        self._depth += 1

    def _exit(self, module, args, output):
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.process_time() - self._start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a DiffusionGemma checkpoint (default: a random one, see above)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-length", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16, help="max_denoising_steps")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.model is None:
        from refusion.models.denoiser import CanvasDenoiserLM

        network = random_model()

        adapter = CanvasDenoiserLM(network)
    else:
        adapter = refusion.load_model(a.model)
        network = adapter.model
    vocab = adapter.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab - 4, (a.prompt_length,), generator=g).tolist() for _ in range(a.prompts)]
    seeds = list(range(a.prompts))
    options = dict(max_new_tokens=a.new_tokens, max_denoising_steps=a.steps)

    def transformers_generate():
        rows = []
        for prompt, seed in zip(prompts, seeds):
            torch.manual_seed(seed)
            out = network.generate(torch.tensor([prompt]), **options)
            rows.append(out.sequences[0, len(prompt) :].tolist())
        return rows

    def one_by_one():
        return [
            refusion.generate(p, adapter, seed=s, preset="diffusion-gemma", **options) for p, s in zip(prompts, seeds)
        ]

    def one_batch():
        return refusion.generate(prompts, adapter, seeds=seeds, preset="diffusion-gemma", **options)

    eos = set(adapter.eos_token_ids)

    def answer(row):
        hit = next((i for i, t in enumerate(row) if t in eos), None)
        return row if hit is None else row[: hit + 1]

    competitors = {
        "transformers generate": lambda: [answer(r) for r in transformers_generate()],
        "refusion, one by one": lambda: [r.tokens.tolist() for r in one_by_one()],
        "refusion, one batch": lambda: [r.tokens.tolist() for r in one_batch()],
    }
    names = list(competitors)
    runs = {n: [] for n in names}
    with torch.no_grad():
        for fn in competitors.values():  # warm-up
            fn()
        for r in range(a.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            tokens = {}
            for name in order:
                with NetworkClock(network) as clock:
                    cpu, wall = time.process_time(), time.perf_counter()
                    tokens[name] = competitors[name]()
                    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                runs[name].append((cpu, wall, clock.seconds, clock.passes, sum(len(t) for t in tokens[name])))
            same = all(tokens[n] == tokens[names[0]] for n in names)
            if not same:
                print(f"round {r}: the competitors' tokens differ", file=sys.stderr)
                return 1
    print(header())
    print(
        f"# {a.prompts} prompts of {a.prompt_length} tokens, max_new_tokens {a.new_tokens}, "
        f"max_denoising_steps {a.steps}, canvas {adapter.canvas_length}, {a.rounds} rounds; same tokens: yes"
    )
    print("| competitor | CPU s | wall s | CPU vs generate | denoiser passes | tokens/pass | outside network ms/pass |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = runs[names[0]]
    for name in names:
        rs = runs[name]
        cpu = [x[0] for x in rs]
        wall = [x[1] for x in rs]
        ratio = [b[0] / x[0] for b, x in zip(base, rs)]
        outside = [(x[0] - x[2]) / x[3] * 1e3 for x in rs]
        print(
            f"| {name} | {statistics.median(cpu):.3f} [{min(cpu):.3f}-{max(cpu):.3f}] | "
            f"{statistics.median(wall):.3f} [{min(wall):.3f}-{max(wall):.3f}] | "
            f"{statistics.median(ratio):.2f}x [{min(ratio):.2f}-{max(ratio):.2f}] | {rs[-1][3]} | "
            f"{rs[-1][4] / rs[-1][3]:.2f} | {statistics.median(outside):.3f} [{min(outside):.3f}-{max(outside):.3f}] |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
