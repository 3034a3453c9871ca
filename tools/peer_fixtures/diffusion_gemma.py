#!/usr/bin/env python3
"""Make (or --check) tests/fixtures/peers/diffusion_gemma: a tiny DiffusionGemma and transformers' own tokens.

Run with the project's interpreter (transformers 5.x carries the class); it never imports `refusion`:

    python tools/peer_fixtures/diffusion_gemma.py --out tests/fixtures/peers/diffusion_gemma [--check]

The checkpoint is built by transformers' `DiffusionGemmaForBlockDiffusion` (seeded; text hidden 64, 2 layers: one
sliding-window layer (window 8, shorter than the prompts), one full-attention layer with its own head dim, one kv
head and proportional rotary; 4 experts top 2 beside the dense MLP; canvas 16; tied embeddings; final logit
soft-cap 30; the tiny vision tower the class always builds) and saved with `save_pretrained` in float32, with the
char-level tokenizer of the other peer fixtures and a generation_config.json (the checkpoint's own defaults).
golden.json holds, per case and dtype (float32, bfloat16), the new tokens of
`torch.manual_seed(seed); model.generate(input_ids, **kwargs)`: one and several canvases, a length that is not
a multiple of the canvas, several entropy bounds, step limits and temperature schedules, canvases that stop
early (stable and confident) and canvases that reach the step limit, a prompt longer than the sliding window,
and an EOS that ends the answer inside its first canvas. One process, 1 torch thread, deterministic algorithms.
cpu.json records the CPU kernel family (half-precision tokens depend on it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository: tests.support.kernels

SEED = 1234
CANVAS = 16
DTYPES = ("float32", "bfloat16")
PROMPTS = ("Hi", "The sky is blue because", "2+2=")
#: the checkpoint's generation_config.json: what generate (and refusion's family preset) uses by default
GENERATION = dict(
    max_new_tokens=32,
    max_denoising_steps=8,
    sampler_config={"entropy_bound": 0.1, "_cls_name": "EntropyBoundSamplerConfig"},
    t_min=0.4,
    t_max=0.8,
    stability_threshold=1,
    confidence_threshold=0.005,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=4,
)
#: (name, prompt index, seed, generate kwargs); "eos" cases also set eos_token_id (chosen from the outputs)
CASES = (
    ("defaults", 0, 0, {}),
    ("defaults", 1, 1, {}),
    ("one-canvas", 0, 2, {"max_new_tokens": 16}),
    ("not-a-multiple", 2, 3, {"max_new_tokens": 20}),
    ("three-canvases", 1, 4, {"max_new_tokens": 48, "max_denoising_steps": 4}),
    ("bound-0.5", 0, 5, {"entropy_bound": 0.5}),
    ("bound-3.0", 1, 6, {"entropy_bound": 3.0}),
    ("steps-3", 2, 7, {"max_denoising_steps": 3}),
    ("steps-12", 0, 8, {"max_denoising_steps": 12}),
    ("schedule", 1, 9, {"t_min": 0.1, "t_max": 1.5}),
    ("no-settling", 0, 10, {"confidence_threshold": 100.0, "stability_threshold": 1, "max_denoising_steps": 24}),
    ("settles-1", 0, 14, {"confidence_threshold": 100.0, "t_min": 0.01, "t_max": 0.05, "max_denoising_steps": 24}),
    ("settles-2", 1, 11, {"confidence_threshold": 100.0, "stability_threshold": 2, "t_min": 0.01, "t_max": 0.02}),
    ("confident", 2, 15, {"t_min": 0.001, "t_max": 0.002, "max_denoising_steps": 24}),
    ("stops-at-once", 2, 12, {"confidence_threshold": 100.0, "stability_threshold": 0}),
    ("eos", 1, 13, {"max_new_tokens": 48}),
)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/peers/diffusion_gemma")
    ap.add_argument("--check", action="store_true", help="regenerate into a temporary folder and compare with --out")
    return ap.parse_args(argv)


def build(out: str):
    import torch
    from pf_tokenizer import VOCAB, save_tokenizer
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    torch.manual_seed(SEED)
    text = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=8,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=32,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=4,
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
        canvas_length=CANVAS,
        image_token_id=VOCAB - 1,
        boi_token_id=VOCAB - 2,
        eoi_token_id=VOCAB - 3,
    )
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    with torch.no_grad():  # a sharper head than random init, so canvases can settle and tokens repeat
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out)
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(GENERATION, indent=2) + "\n")
    save_tokenizer("diffusion_gemma", out)


def generate_all(out: str) -> dict:
    import torch
    from pf_common import versions
    from pf_tokenizer import BOS, encode_chars
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    calls = []
    for dtype in DTYPES:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(out, dtype=getattr(torch, dtype)).eval()
        eos_for_case = None
        for name, prompt_index, seed, kwargs in CASES:
            ids = [BOS, *encode_chars(PROMPTS[prompt_index])]
            given = dict(kwargs)
            call_kwargs = dict(kwargs)
            if "entropy_bound" in call_kwargs:
                call_kwargs["sampler_config"] = EntropyBoundSamplerConfig(
                    entropy_bound=call_kwargs.pop("entropy_bound")
                )
            if name == "eos":  # an EOS that ends the answer inside its first canvas: a token of the plain answer
                torch.manual_seed(seed)
                plain = model.generate(torch.tensor([ids]), **call_kwargs).sequences[0, len(ids) :].tolist()
                eos_for_case = plain[5]
                call_kwargs["eos_token_id"] = eos_for_case
                given["eos_token_id"] = eos_for_case
            torch.manual_seed(seed)
            result = model.generate(torch.tensor([ids]), **call_kwargs)
            calls.append(
                dict(
                    case=name,
                    dtype=dtype,
                    prompt=PROMPTS[prompt_index],
                    prompt_ids=ids,
                    seed=seed,
                    kwargs=given,
                    tokens=result.sequences[0, len(ids) :].tolist(),
                    tokens_per_forward=round(float(result.tokens_per_forward[0]), 6),
                )
            )
    return dict(
        peer="transformers DiffusionGemmaForBlockDiffusion.generate",
        made_with=versions(),
        canvas_length=CANVAS,
        seed=SEED,
        note="tokens: the new tokens of torch.manual_seed(seed); model.generate(prompt_ids, **kwargs) (sampler_config "
        "from entropy_bound); tokens after an EOS are the generation config's pad_token_id",
        calls=calls,
    )


def make(out: str) -> None:
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(out, exist_ok=True)
    build(out)
    golden = generate_all(out)
    with open(os.path.join(out, "golden.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(golden, indent=1) + "\n")
    from tests.support.kernels import cpu_kernel_family

    with open(os.path.join(out, "cpu.json"), "w", encoding="utf-8") as f:
        made_on = cpu_kernel_family()
        note = "cpu_kernel_family() (tests/support/kernels.py) of the machine that made golden.json; bf16 tokens vary"
        f.write(json.dumps({"made_on": made_on, "note": note}, indent=2) + "\n")


def check(out: str) -> int:
    temp = tempfile.mkdtemp(prefix="dg-fixture-")
    try:
        make(temp)
        problems = []
        from safetensors.torch import load_file

        a, b = load_file(os.path.join(out, "model.safetensors")), load_file(os.path.join(temp, "model.safetensors"))
        if a.keys() != b.keys() or any(not a[k].equal(b[k]) for k in a):
            problems.append("model.safetensors differs")
        old = json.load(open(os.path.join(out, "golden.json")))["calls"]
        new = json.load(open(os.path.join(temp, "golden.json")))["calls"]
        for x, y in zip(old, new):
            if x != y:
                problems.append(f"{x['case']} ({x['dtype']}, seed {x['seed']}): tokens differ")
        if len(old) != len(new):
            problems.append(f"{len(old)} golden calls, regenerated {len(new)}")
        for p in problems:
            print("DIFF", p)
        print("ok" if not problems else f"{len(problems)} difference(s)")
        return 1 if problems else 0
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.check:
        return check(a.out)
    make(a.out)
    print("wrote", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
