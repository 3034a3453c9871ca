#!/usr/bin/env python3
"""Make (or --check) tests/fixtures/peers/dkv/golden.json from dKV-Cache's own LLaDA decoder (horseee/dKV-Cache).

Run with the transformers-4 interpreter of make.py; it never imports `refusion`:

    /work/tf4/bin/python tools/peer_fixtures/dkv.py --dkv dKV-Cache --out tests/fixtures/peers/dkv [--check]

dKV-Cache's `generation_utils/llada_dkv_cache_decode.py::generate` (dKV-Cache-Decode: a decoded token's keys/values
cached one step after it is decoded, refreshed every `cache_reloading_step` steps) decodes a tiny LLaDA checkpoint
`checkpoint/` BUILT HERE by dKV-Cache's own `models/modeling_llada_dkv_cache_decode.py::LLaDAModelLM` (the class its
generate drives: it keeps and reuses the keys/values; its code needs as many key/value heads as query heads,
LLaDA-8B's layout, so the llada/ fixture's config with n_kv_heads = n_heads, its head scale and tokenizer), in
float32 and bfloat16, greedy, with and without `enable_cache`. The checkout's root is put on
`sys.path` for its `models.` imports. 1 torch thread, deterministic. Each call keeps the tokens, the forwards and
the tokens each forward fed, and checks that the argmax at a masked position of the current block is never the mask
id (refusion's drafts never choose it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import pf_common as C  # noqa: E402
import torch  # noqa: E402

DTYPES = ("float32", "bfloat16")
REPO = "horseee/dKV-Cache"
PEER_FILES = {
    "generate": "generation_utils/llada_dkv_cache_decode.py",
    "model": "models/modeling_llada_dkv_cache_decode.py",
    "config": "models/configuration_llada.py",
}
#: (tag, generate kwargs, note); every case runs on every prompt in every dtype
CASES = (
    ("a", dict(gen_length=16, block_length=8, steps=16, cache_reloading_step=8), "2 blocks, refresh every 8"),
    ("b", dict(gen_length=16, block_length=16, steps=16, cache_reloading_step=2), "one block, refresh every 2"),
    ("c", dict(gen_length=24, block_length=8, steps=12, cache_reloading_step=3), "2 tokens a step, every 3"),
    ("d", dict(gen_length=32, block_length=16, steps=32, cache_reloading_step=4), "2 blocks of 16, every 4"),
    ("e", dict(gen_length=16, block_length=8, steps=16, cache_reloading_step=1), "refresh at every step"),
    ("f", dict(gen_length=16, block_length=8, steps=16, enable_cache=False), "no cache: LLaDA's decode"),
)


def load_peer(dkv: str):
    sys.path.insert(0, dkv)  # `from models.modeling_llada_dkv_cache_decode import LLaDAModelLM`
    generate = C.load_file("pf_dkv_generate", os.path.join(dkv, PEER_FILES["generate"]))
    records = {k: C.file_record(dkv, rel, REPO, "--dkv") for k, rel in PEER_FILES.items()}
    return generate, records


#: dKV-Cache's model code needs as many key/value heads as query heads (LLaDA-8B's layout; the llada/ fixture has
#: grouped heads): its own checkpoint, the llada/ fixture's config with n_kv_heads = n_heads, built by its class
WEIGHT_SEED, HEAD_SCALE = 0, 4.0


def build_checkpoint(generate, llada_dir: str, out: str) -> dict:
    """Build the MHA checkpoint with dKV-Cache's own class from the llada/ fixture's config (n_kv_heads = n_heads),
    the same head scale and the mask row zeroed, and the llada/ fixture's tokenizer files."""
    import shutil

    config = json.load(open(os.path.join(llada_dir, "config.json")))
    config["n_kv_heads"] = config["n_heads"]
    keep = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "transformers_version")}
    cfg_cls = generate.LLaDAModelLM.config_class
    torch.manual_seed(WEIGHT_SEED)
    model = generate.LLaDAModelLM(cfg_cls(**keep), init_params=True).eval()
    with torch.no_grad():
        model.model.transformer.ff_out.weight.mul_(HEAD_SCALE)
        model.model.transformer.ff_out.weight[config["mask_token_id"]].zero_()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for stray in ("generation_config.json",):
        if os.path.exists(os.path.join(out, stray)):
            os.remove(os.path.join(out, stray))
    C.rewrite_config_json(
        os.path.join(out, "config.json"), {"auto_map": config["auto_map"]}, drop=("transformers_version",)
    )
    for name in ("generation_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(llada_dir, name), os.path.join(out, name))
    return {"weight_seed": WEIGHT_SEED, "head_scale": HEAD_SCALE, "head_rows_zeroed": [config["mask_token_id"]]}


def run(args) -> dict:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    generate, records = load_peer(args.dkv)
    llada = json.load(open(os.path.join(args.llada, "golden.json")))
    built = build_checkpoint(generate, args.llada, args.checkpoint)
    mask_id = llada["mask_token_id"]
    calls, skipped = [], []
    for dtype in DTYPES:
        model = generate.LLaDAModelLM.from_pretrained(args.checkpoint, torch_dtype=getattr(torch, dtype)).eval()
        fed, wins = [], []

        def hook(module, inputs, kwargs, output, fed=fed, wins=wins):
            ids = kwargs.get("input_ids", inputs[0] if inputs else None)
            fed.append(int(ids.shape[1]))
            wins.append(output.logits[0].argmax(-1))

        handle = model.register_forward_hook(hook, with_kwargs=True)
        for tag, kwargs, note in CASES:
            for p, prompt in enumerate(llada["prompts"]):
                fed.clear()
                wins.clear()
                kw = {"enable_cache": True, **kwargs}
                x = generate.generate(model, None, torch.tensor([prompt]), temperature=0.0, mask_id=mask_id, **kw)
                call = {
                    "function": "dkv.generate",
                    "prompt": p,
                    "dtype": dtype,
                    "args": {**kw, "mask_id": mask_id, "temperature": 0.0, "remasking": "low_confidence"},
                    "tokens": x[0, len(prompt) :].tolist(),
                    "forwards": len(fed),
                    "fed_per_forward": list(fed),
                    "note": f"({tag}) {note}",
                }
                if any(bool((top == mask_id).any()) for top in wins):
                    skipped.append({**call, "why": "an argmax was the mask id"})
                else:
                    calls.append(call)
        handle.remove()
    return {
        "family": "dkv",
        "checkpoint": "checkpoint",
        "built": built,
        "checkpoint_sha256": {
            f: C.sha256_file(os.path.join(args.checkpoint, f)) for f in ("config.json", "model.safetensors")
        },
        "made_with": {**C.versions(), "script": "tools/peer_fixtures/dkv.py"},
        "peer_files": records,
        "mask_token_id": mask_id,
        "prompts": llada["prompts"],
        "calls": calls,
        "skipped": skipped,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dkv", required=True, help="checkout of horseee/dKV-Cache")
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/peers/dkv")
    ap.add_argument("--llada", default=None, help="the tiny LLaDA fixture (default: <out>/../llada)")
    ap.add_argument("--check", action="store_true", help="regenerate and compare with --out (exit 1 on a difference)")
    args = ap.parse_args(argv)
    args.dkv, args.out = os.path.abspath(args.dkv), os.path.abspath(args.out)
    args.llada = os.path.abspath(args.llada or os.path.join(args.out, os.pardir, "llada"))
    tmp_out = tempfile.mkdtemp() if args.check else None
    args.checkpoint = os.path.join(tmp_out or args.out, "checkpoint")
    return C.write_or_check("dkv", run(args), args.out, args.check)


if __name__ == "__main__":
    sys.exit(main())
