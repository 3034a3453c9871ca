#!/usr/bin/env python3
"""Make (or --check) tests/fixtures/peers/d3llm/golden.json from d3LLM's own multi-block decoder (hao-ai-lab/d3LLM),
or tests/fixtures/peers/d3llm_kv/golden.json from its KV-cache variant.

Run with the transformers-4 interpreter of make.py; it never imports `refusion`:

    /work/tf4/bin/python tools/peer_fixtures/d3llm.py --d3llm d3LLM --out tests/fixtures/peers/d3llm [--check]
    /work/tf4/bin/python tools/peer_fixtures/d3llm.py --d3llm d3LLM --kv-cache --out tests/fixtures/peers/d3llm_kv

With ``--kv-cache`` the function is ``generate_multi_block_kv_cache`` (the blocks' keys/values cached
``cache_delay_iter`` steps after a block is finished, the canvas refreshed every ``refresh_interval`` steps and while
a block waits) and each call also keeps the tokens fed to every forward (a pre-hook on the model, read-only).

d3LLM's `d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py::generate_multi_block` (its full-attention, no-cache
pipeline: several blocks in flight, an entropy threshold across them) decodes the EXISTING tiny LLaDA checkpoint of
tests/fixtures/peers/llada (golden.json names `../llada`), loaded with d3LLM's own
`utils/utils_LLaDA/model/modeling_llada.py::LLaDAModelLM` (the class its script imports), in float32 and bfloat16,
greedy. The module's `sys.path` additions are relative to the current directory, so the checkout's root is put on
`sys.path` for its `utils.utils_LLaDA` import. 1 torch thread, deterministic. Each call keeps the tokens, d3LLM's
NFE and the tokens decided per step, and checks that the argmax at a decided position is never the mask id
(refusion's drafts never choose it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import pf_common as C  # noqa: E402
import torch  # noqa: E402

DTYPES = ("float32", "bfloat16")
REPO = "hao-ai-lab/d3LLM"
PEER_FILES = {
    "generate": "d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py",
    "model": "utils/utils_LLaDA/model/modeling_llada.py",
    "config": "utils/utils_LLaDA/model/configuration_llada.py",
}
#: (tag, generate_multi_block kwargs, note); every case runs on every prompt in every dtype
CASES = (
    ("a", dict(max_new_tokens=32, block_size=8), "4 blocks of 8, the function's defaults (0.5 / 0.5 / 0.5)"),
    (
        "b",
        dict(max_new_tokens=32, block_size=8, threshold=0.1, block_add_threshold=0.1, decoded_token_threshold=0.95),
        "the authors' eval settings for adding and activating blocks, a strict entropy bar",
    ),
    ("c", dict(max_new_tokens=24, block_size=8, threshold=2.0, block_add_threshold=0.25), "a loose bar"),
    ("d", dict(max_new_tokens=32, block_size=16, threshold=0.8, decoded_token_threshold=1.0), "activation at 100%"),
    (
        "e",
        dict(max_new_tokens=16, block_size=4, threshold=0.3, block_add_threshold=1.0, decoded_token_threshold=1.0),
        "sequential blocks (the authors: like generate())",
    ),
    (
        "f",
        dict(max_new_tokens=32, block_size=8, threshold=1.2, block_add_threshold=0.0, decoded_token_threshold=0.0),
        "every block added at once",
    ),
)


#: (tag, generate_multi_block_kv_cache kwargs, note) for --kv-cache
KV_CASES = (
    (
        "k",
        dict(max_new_tokens=32, block_size=8, cache_delay_iter=2, refresh_interval=4),
        "the authors' LLaDA HumanEval cache (delay 2, refresh every 4), the function's block rule",
    ),
    (
        "l",
        dict(
            max_new_tokens=32,
            block_size=8,
            threshold=0.5,
            block_add_threshold=0.1,
            decoded_token_threshold=0.95,
            cache_delay_iter=1,
            refresh_interval=10000,
        ),
        "the authors' LLaDA MATH / MBPP settings: delay 1, no periodic refresh",
    ),
    (
        "m",
        dict(max_new_tokens=32, block_size=8, threshold=1.2, cache_delay_iter=0, refresh_interval=3),
        "cached as soon as finished, refreshed every 3 steps",
    ),
    (
        "n",
        dict(max_new_tokens=24, block_size=4, threshold=0.3, cache_delay_iter=2, refresh_interval=10000),
        "blocks of 4, no periodic refresh",
    ),
    ("o", dict(max_new_tokens=32, block_size=8), "the function's defaults: nothing cached (the plain decode)"),
)


def load_peer(d3llm: str):
    sys.path.insert(0, d3llm)  # `from utils.utils_LLaDA.model.modeling_llada import LLaDAModelLM`
    generate = C.load_file("pf_d3llm_generate", os.path.join(d3llm, PEER_FILES["generate"]))
    records = {k: C.file_record(d3llm, rel, REPO, "--d3llm") for k, rel in PEER_FILES.items()}
    return generate, records


def run(args) -> dict:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    generate, records = load_peer(args.d3llm)
    llada = json.load(open(os.path.join(args.checkpoint, "golden.json")))
    mask_id = llada["mask_token_id"]
    calls, skipped = [], []
    for dtype in DTYPES:
        model = generate.LLaDAModelLM.from_pretrained(args.checkpoint, torch_dtype=getattr(torch, dtype)).eval()
        seen = []  # per step: the canvas before it and the logits' argmax (read-only wrapper)
        rule = generate.get_transfer_index_entropy

        def watched(logits, temperature, remasking, mask_index, x, *rest, rule=rule, seen=seen, **kw):
            seen.append((x[0].clone(), logits[0].argmax(-1)))
            return rule(logits, temperature, remasking, mask_index, x, *rest, **kw)

        generate.get_transfer_index_entropy = watched
        fed = C.record_fed(model, mask_id)  # (tokens fed, masks among them) per forward
        function = generate.generate_multi_block_kv_cache if args.kv_cache else generate.generate_multi_block
        for tag, kwargs, note in KV_CASES if args.kv_cache else CASES:
            for p, prompt in enumerate(llada["prompts"]):
                seen.clear()
                fed.clear()
                x, nfe = function(model, torch.tensor([prompt]), mask_id=mask_id, **kwargs)
                canvases = [c for c, _ in seen] + [x[0]]
                decided = [int(((a == mask_id) & (b != mask_id)).sum()) for a, b in zip(canvases, canvases[1:])]
                mask_wins = sum(int((top[c == mask_id] == mask_id).any()) for c, top in seen)
                call = {
                    "function": f"d3llm.{function.__name__}",
                    "prompt": p,
                    "dtype": dtype,
                    "args": {**kwargs, "mask_id": mask_id, "temperature": 0.0, "remasking": "low_confidence"},
                    "tokens": x[0, len(prompt) :].tolist(),
                    "nfe": int(nfe),
                    "decided_per_step": decided,
                    "note": f"({tag}) {note}",
                }
                if args.kv_cache:
                    call["fed_per_forward"] = [n for n, _ in fed]
                if mask_wins:
                    skipped.append({**call, "why": f"the argmax was the mask id at a masked position ({mask_wins})"})
                else:
                    calls.append(call)
        generate.get_transfer_index_entropy = rule
    return {
        "family": "d3llm_kv" if args.kv_cache else "d3llm",
        "checkpoint": "../llada",
        "checkpoint_sha256": {
            f: C.sha256_file(os.path.join(args.checkpoint, f)) for f in ("config.json", "model.safetensors")
        },
        "made_with": {**C.versions(), "script": "tools/peer_fixtures/d3llm.py"},
        "peer_files": records,
        "mask_token_id": mask_id,
        "prompts": llada["prompts"],
        "calls": calls,
        "skipped": skipped,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d3llm", required=True, help="checkout of hao-ai-lab/d3LLM")
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/peers/d3llm")
    ap.add_argument("--checkpoint", default=None, help="the tiny LLaDA checkpoint (default: <out>/../llada)")
    ap.add_argument("--kv-cache", action="store_true", help="generate_multi_block_kv_cache (see above)")
    ap.add_argument("--check", action="store_true", help="regenerate and compare with --out (exit 1 on a difference)")
    args = ap.parse_args(argv)
    args.d3llm, args.out = os.path.abspath(args.d3llm), os.path.abspath(args.out)
    args.checkpoint = os.path.abspath(args.checkpoint or os.path.join(args.out, os.pardir, "llada"))
    name = "d3llm_kv" if args.kv_cache else "d3llm"
    return C.write_or_check(name, run(args), args.out, args.check)


if __name__ == "__main__":
    sys.exit(main())
