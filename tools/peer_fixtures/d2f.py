#!/usr/bin/env python3
"""Make (or --check) tests/fixtures/peers/d2f/golden.json from D2F's own pipelined block decoder
(zhijie-group/Discrete-Diffusion-Forcing).

Run with the transformers-4 interpreter of make.py; it never imports `refusion`:

    /work/tf4/bin/python tools/peer_fixtures/d2f.py --d2f Discrete-Diffusion-Forcing \
        --out tests/fixtures/peers/d2f [--check]
    /work/tf4/bin/python tools/peer_fixtures/d2f.py --d2f Discrete-Diffusion-Forcing --dream \
        --out tests/fixtures/peers/d2f_dream [--check]

With ``--dream`` the decoder is `D2F-eval/eval_dream.py`'s (the same method for D2F's Dream: shifted logits, the
cached prefix's last output kept for the next position; also its `_shift_logits` and
`_count_non_eos_tokens_before_truncation`), the model its `model_cache/dream/model_dream.py::DreamModel` on the
EXISTING tests/fixtures/peers/dream checkpoint; the method returns decoded text, so the stand-in tokenizer keeps the
token list it is asked to decode (and has no EOS id, so the decoder's EOS check never fires).

D2F's decoder is a method of its lm-eval model class (`D2F-eval/eval_llada.py`, `_generate_block_single` and
`_update_block_completion_states`, with the module's `create_full_block_attention_mask`, `extract_attention_mask`,
`sample_tokens`, `top_p_logits`, `top_k_logits`); the module imports lm-eval, accelerate, datasets and peft, which
the decoder never uses. So those seven functions are read out of the file with `ast` and run unchanged, the method
on a namespace holding the settings its constructor would keep (and a tokenizer whose `decode` returns "": the
method decodes the canvas each step for display only). The model is D2F's own
`D2F-eval/model_cache/llada/modeling_llada.py::LLaDAModelLM` (its `attention_bias` and `update_kvcache`), loading
the EXISTING tiny LLaDA checkpoint of tests/fixtures/peers/llada, in float32 and bfloat16, greedy (temperature 0,
top_p / top_k None, sampling_strategy "default"). 1 torch thread, deterministic. Each call keeps the tokens, the
forwards, the tokens fed to each forward (a read-only pre-hook on the model), the canvas's length at each forward
(the blocks added so far, read by a wrapper of `extract_attention_mask`) and the positions decided per step (from
the masks each forward is fed and those lengths).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import pf_common as C  # noqa: E402
import torch  # noqa: E402

DTYPES = ("float32", "bfloat16")
REPO = "zhijie-group/Discrete-Diffusion-Forcing"
PEER_FILES = {
    "generate": "D2F-eval/eval_llada.py",
    "model": "D2F-eval/model_cache/llada/modeling_llada.py",
    "config": "D2F-eval/model_cache/llada/configuration_llada.py",
}
FUNCTIONS = ("create_full_block_attention_mask", "extract_attention_mask", "top_p_logits", "top_k_logits")
FUNCTIONS += ("sample_tokens",)
METHODS = ("_generate_block_single", "_update_block_completion_states")
#: (tag, settings, note); every case runs on every prompt in every dtype
CASES = (
    ("a", dict(max_new_tokens=32, block_size=8), "the class's thresholds (add 0.5, activate 0.9, skip 1.0)"),
    (
        "b",
        dict(
            max_new_tokens=32, block_size=8, block_add_threshold=0.1, decoded_token_threshold=0.95, skip_threshold=0.9
        ),
        "the authors' LLaDA HumanEval thresholds, blocks of 8",
    ),
    (
        "c",
        dict(
            max_new_tokens=24, block_size=4, block_add_threshold=0.25, decoded_token_threshold=0.5, skip_threshold=0.2
        ),
        "a loose bar, blocks of 4",
    ),
    (
        "d",
        dict(
            max_new_tokens=32, block_size=16, block_add_threshold=0.7, decoded_token_threshold=0.95, skip_threshold=0.3
        ),
        "the authors' GSM8K add threshold, blocks of 16",
    ),
    (
        "e",
        dict(max_new_tokens=16, block_size=4, block_add_threshold=1.0, decoded_token_threshold=1.0, skip_threshold=0.5),
        "one block at a time",
    ),
    (
        "f",
        dict(max_new_tokens=30, block_size=8, block_add_threshold=0.0, decoded_token_threshold=0.0, skip_threshold=0.1),
        "every block added at once; max_new_tokens off the block grid (3 blocks)",
    ),
)
CLASS_DEFAULTS = dict(block_add_threshold=0.5, decoded_token_threshold=0.9, skip_threshold=1.0)


DREAM_FILES = {
    "generate": "D2F-eval/eval_dream.py",
    "model": "D2F-eval/model_cache/dream/model_dream.py",
    "config": "D2F-eval/model_cache/dream/configuration_dream.py",
}
DREAM_METHODS = ("_shift_logits", "_count_non_eos_tokens_before_truncation")


def load_peer(d2f: str, dream: bool = False):
    """D2F's decoder functions (read out of eval_llada.py, or eval_dream.py) and its model class."""
    files = DREAM_FILES if dream else PEER_FILES
    methods = METHODS + (DREAM_METHODS if dream else ())
    source_path = os.path.join(d2f, files["generate"])
    tree = ast.parse(open(source_path, encoding="utf-8").read())
    wanted = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS:
            wanted[node.name] = node
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in methods:
                    wanted[item.name] = item
    missing = set(FUNCTIONS + methods) - set(wanted)
    if missing:
        raise C.FixtureError(f"not found in {source_path}: {sorted(missing)}")
    namespace = {
        "torch": torch,
        "F": torch.nn.functional,
        "dists": torch.distributions,
        "np": __import__("numpy"),
        "List": list,
        "Dict": dict,
    }
    module = ast.Module(body=[wanted[name] for name in FUNCTIONS + methods], type_ignores=[])
    exec(compile(module, source_path, "exec"), namespace)
    sys.path.insert(0, os.path.join(d2f, "D2F-eval"))  # `from model_cache.llada.modeling_llada import ...`
    records = {k: C.file_record(d2f, rel, REPO, "--d2f") for k, rel in files.items()}
    if dream:
        from model_cache.dream.model_dream import DreamModel

        return namespace, DreamModel, records
    from model_cache.llada.modeling_llada import LLaDAModelLM

    return namespace, LLaDAModelLM, records


class _Silent:
    """The tokenizer the decoder asks for: no EOS, ``decode`` keeps the last token list it got and returns ""."""

    eos_token_id = None
    eos_token = "<no eos>"
    last: list[int] = []

    def decode(self, tokens, *args, **kwargs) -> str:
        self.last = list(tokens)
        return ""


def run(args) -> dict:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    peer, model_class, records = load_peer(args.d2f, args.dream)
    base = json.load(open(os.path.join(args.checkpoint, "golden.json")))  # the checkpoint's folder's goldens
    mask_id = base["mask_token_id"]
    calls, skipped = [], []
    extract = peer["extract_attention_mask"]
    canvas_lengths: list[int] = []

    def watched_extract(full_mask, start_pos, input_length, cache_length):
        canvas_lengths.append(start_pos + input_length)
        return extract(full_mask, start_pos, input_length, cache_length)

    peer["extract_attention_mask"] = watched_extract
    for dtype in DTYPES:
        model = model_class.from_pretrained(args.checkpoint, torch_dtype=getattr(torch, dtype)).eval()
        fed = C.record_fed(model, mask_id)  # (tokens fed, masks among them) per forward
        for tag, settings, note in CASES:
            for p, prompt in enumerate(base["prompts"]):
                fed.clear()
                canvas_lengths.clear()
                kwargs = {**CLASS_DEFAULTS, **settings}
                this = types.SimpleNamespace(
                    model=model,
                    mask_token_id=mask_id,
                    device=torch.device("cpu"),
                    target_dtype=getattr(torch, dtype),
                    max_length=len(prompt) + kwargs["max_new_tokens"],
                    temperature=0.0,
                    top_p=None,
                    top_k=None,
                    sampling_strategy="default",
                    tokenizer=_Silent(),
                    **kwargs,
                )
                for name in METHODS[1:] + (DREAM_METHODS if args.dream else ()):
                    setattr(this, name, types.MethodType(peer[name], this))
                tokens = peer["_generate_block_single"](this, torch.tensor([prompt]))
                if args.dream:  # its method returns the decoded text: the tokens are those it decoded
                    tokens = this.tokenizer.last
                masks = [m for _, m in fed] + [0]
                lengths = canvas_lengths + [canvas_lengths[-1]]
                decided = [masks[k] - masks[k + 1] + lengths[k + 1] - lengths[k] for k in range(len(fed))]
                call = {
                    "function": "d2f.generate_block_dream" if args.dream else "d2f.generate_block",
                    "prompt": p,
                    "dtype": dtype,
                    "args": {**kwargs, "mask_token_id": mask_id, "temperature": 0.0},
                    "tokens": list(tokens),
                    "forwards": len(fed),
                    "fed_per_forward": [n for n, _ in fed],
                    "canvas_per_forward": list(canvas_lengths),
                    "decided_per_step": decided,
                    "note": f"({tag}) {note}",
                }
                if mask_id in tokens:
                    skipped.append({**call, "why": "the mask id was decoded"})
                else:
                    calls.append(call)
    return {
        "family": "d2f_dream" if args.dream else "d2f",
        "checkpoint": "../dream" if args.dream else "../llada",
        "checkpoint_sha256": {
            f: C.sha256_file(os.path.join(args.checkpoint, f)) for f in ("config.json", "model.safetensors")
        },
        "made_with": {**C.versions(), "script": "tools/peer_fixtures/d2f.py"},
        "peer_files": records,
        "mask_token_id": mask_id,
        "prompts": base["prompts"],
        "calls": calls,
        "skipped": skipped,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d2f", required=True, help="checkout of zhijie-group/Discrete-Diffusion-Forcing")
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/peers/d2f")
    ap.add_argument("--checkpoint", default=None, help="the tiny LLaDA checkpoint (default: <out>/../llada)")
    ap.add_argument("--dream", action="store_true", help="eval_dream.py's decoder on the dream/ checkpoint")
    ap.add_argument("--check", action="store_true", help="regenerate and compare with --out (exit 1 on a difference)")
    args = ap.parse_args(argv)
    args.d2f, args.out = os.path.abspath(args.d2f), os.path.abspath(args.out)
    family = "dream" if args.dream else "llada"
    args.checkpoint = os.path.abspath(args.checkpoint or os.path.join(args.out, os.pardir, family))
    return C.write_or_check("d2f_dream" if args.dream else "d2f", run(args), args.out, args.check)


if __name__ == "__main__":
    sys.exit(main())
