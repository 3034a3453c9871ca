#!/usr/bin/env python3
"""Make (or --check) tests/fixtures/peers/fast_dllm_v2: a tiny Fast-dLLM v2 checkpoint and its authors' tokens.

Run with the transformers-4 interpreter of make.py (the authors' model code imports transformers 4.53 APIs); it
never imports `refusion`:

    /work/tf4/bin/python tools/peer_fixtures/fast_dllm_v2.py --code Fast_dLLM_v2_7B \
        --out tests/fixtures/peers/fast_dllm_v2 [--check]

`--code` is a folder holding the checkpoint's remote code as published with Efficient-Large-Model/Fast_dLLM_v2_7B
(`modeling.py`, `configuration.py`; their sha256 are recorded). A tiny random checkpoint is BUILT HERE by that
`Fast_dLLM_QwenForCausalLM` (biases random too, the LM head scaled so that drafts are confident, the mask row
zeroed, the `<|im_end|>` row scaled so that answers stop) and saved with its own `save_pretrained`, with the shared
char-level tokenizer (mask `|<MASK>|`, end of turn `<|im_end|>`). Its own `generate` (the model card's call)
decodes every prompt of the cases below in float32 and bfloat16, greedy. Each call keeps the tokens, the forwards
(the inner `Fast_dLLM_QwenModel` calls: the authors' `generate` calls `self.forward`) and the tokens each fed, and
is set aside (`skipped`) when the argmax at a fed position was the mask id (refusion never drafts it). Prompt
lengths of exactly `block_size` are left out: the authors' code then decodes without the prompt (no prefill, and
the first block is the masks alone). 1 torch thread, deterministic.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import pf_common as C  # noqa: E402
import pf_tokenizer as T  # noqa: E402
import torch  # noqa: E402

DTYPES = ("float32", "bfloat16")
REPO = "Efficient-Large-Model/Fast_dLLM_v2_7B (Hugging Face remote code)"
PEER_FILES = {"model": "modeling.py", "config": "configuration.py"}
BD_SIZE, WEIGHT_SEED, HEAD_SCALE, EOT_SCALE = 8, 0, 24.0, 1.6
CONFIG = dict(
    vocab_size=T.VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bd_size=BD_SIZE,
    pad_token_id=T.PAD,
    bos_token_id=T.BOS,
    eos_token_id=T.EOT,
)
PROMPTS = (
    "Hi",
    "The sum of 2 and 3",
    "Once upon a ti",
    "fuse the slots, all of them!",
    "Dear",
    "abcdefghi",
    "block diffusion",
)
#: (tag, generate kwargs, note); every case runs on every prompt (but those of length block_size) in every dtype
CASES = (
    ("a", dict(max_new_tokens=16, block_size=8, small_block_size=4, threshold=0.9), "2 sub-blocks of 4"),
    ("b", dict(max_new_tokens=24, block_size=8, small_block_size=2, threshold=0.5), "4 sub-blocks of 2"),
    ("c", dict(max_new_tokens=16, block_size=8, small_block_size=8), "threshold 1: one token a step"),
    ("d", dict(max_new_tokens=32, block_size=8, small_block_size=8, threshold=0.3), "one sub-block, 0.3"),
    ("e", dict(max_new_tokens=16, block_size=4, small_block_size=2, threshold=0.7), "blocks of 4 on bd_size 8"),
    ("f", dict(max_new_tokens=24, block_size=8, small_block_size=4, threshold=0.5, use_block_cache=True), "cache, 4"),
    ("g", dict(max_new_tokens=16, block_size=8, small_block_size=4, threshold=0.9, use_block_cache=True), "cache, 4"),
    ("h", dict(max_new_tokens=16, block_size=8, small_block_size=2, use_block_cache=True), "cache, 2, one a step"),
)


def load_peer(code: str):
    C.synth_package("pf_fdv2", code)  # modeling.py imports `.configuration`
    import importlib

    modeling = importlib.import_module("pf_fdv2.modeling")
    records = {k: C.file_record(code, rel, REPO, "--code") for k, rel in PEER_FILES.items()}
    return modeling, records


def build_checkpoint(modeling, out: str) -> dict:
    torch.manual_seed(WEIGHT_SEED)
    config = modeling.Fast_dLLM_QwenConfig(**CONFIG)
    model = modeling.Fast_dLLM_QwenForCausalLM(config).eval()
    with torch.no_grad():
        for module in model.modules():  # the published biases are not zero: load them as random ones
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0.0, 0.02)
        model.lm_head.weight.mul_(HEAD_SCALE)
        model.lm_head.weight[T.EOT].mul_(EOT_SCALE)
        model.lm_head.weight[T.MASK].zero_()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    C.rewrite_config_json(
        os.path.join(out, "config.json"),
        {
            "auto_map": {
                "AutoConfig": "configuration.Fast_dLLM_QwenConfig",
                "AutoModel": "modeling.Fast_dLLM_QwenModel",
                "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM",
            },
            "conplemenrary_mask": True,
        },
        drop=("transformers_version",),
    )
    gen = os.path.join(out, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    T.save_tokenizer("fast_dllm_v2", out)
    return {
        "weight_seed": WEIGHT_SEED,
        "head_scale": HEAD_SCALE,
        "eot_row_scale": EOT_SCALE,
        "head_rows_zeroed": [T.MASK],
        "biases": "normal(0, 0.02)",
    }


def run(args) -> dict:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    modeling, records = load_peer(args.code)
    built = build_checkpoint(modeling, args.checkpoint)
    prompts = [T.encode_chars(p) for p in PROMPTS]
    calls, skipped = [], []
    for dtype in DTYPES:
        model = modeling.Fast_dLLM_QwenForCausalLM.from_pretrained(
            args.checkpoint, torch_dtype=getattr(torch, dtype)
        ).eval()
        fed, bad = [], []

        def hook(module, inputs, kwargs, output, fed=fed, bad=bad, model=model):
            ids = kwargs.get("input_ids", inputs[0] if inputs else None)
            fed.append(int(ids.shape[1]))
            top = model.lm_head(output.last_hidden_state).argmax(-1)
            bad.append(bool((top == T.MASK).any()))

        handle = model.model.register_forward_hook(hook, with_kwargs=True)
        for tag, kwargs, note in CASES:
            for p, prompt in enumerate(prompts):
                if len(prompt) == kwargs["block_size"]:
                    continue
                fed.clear()
                bad.clear()
                kw = {**kwargs, "mask_id": T.MASK, "stop_token": T.EOT}
                x = model.generate(torch.tensor([prompt]), **kw)
                call = {
                    "function": "fast_dllm_v2.generate",
                    "prompt": p,
                    "dtype": dtype,
                    "args": kw,
                    "tokens": x[0, len(prompt) :].tolist(),
                    "forwards": len(fed),
                    "fed_per_forward": list(fed),
                    "note": f"({tag}) {note}",
                }
                if any(bad):
                    skipped.append({**call, "why": "an argmax was the mask id"})
                else:
                    calls.append(call)
        handle.remove()
    return {
        "family": "fast_dllm_v2",
        "checkpoint": ".",
        "built": built,
        "checkpoint_sha256": {
            f: C.sha256_file(os.path.join(args.checkpoint, f)) for f in ("config.json", "model.safetensors")
        },
        "made_with": {**C.versions(), "script": "tools/peer_fixtures/fast_dllm_v2.py"},
        "peer_files": records,
        "mask_token_id": T.MASK,
        "prompts": prompts,
        "calls": calls,
        "skipped": skipped,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", required=True, help="folder with the checkpoint's modeling.py and configuration.py")
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/peers/fast_dllm_v2")
    ap.add_argument("--check", action="store_true", help="regenerate and compare with --out (exit 1 on a difference)")
    args = ap.parse_args(argv)
    args.code, args.out = os.path.abspath(args.code), os.path.abspath(args.out)
    tmp_out = tempfile.mkdtemp() if args.check else None
    args.checkpoint = tmp_out or args.out
    return C.write_or_check("fast_dllm_v2", run(args), args.out, args.check)


if __name__ == "__main__":
    sys.exit(main())
