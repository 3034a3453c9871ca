#!/usr/bin/env python3
"""Make (or --check) tests/fixtures/peers/credit/golden.json from dInfer's own CreditDecoding (inclusionAI/dInfer).

Run with the transformers-4 interpreter of make.py; it never imports `refusion`:

    /work/tf4/bin/python tools/peer_fixtures/credit.py --dinfer dInfer --fast-dllm Fast-dLLM \
        --out tests/fixtures/peers/credit [--check]

dInfer's `python/dinfer/decoding/generate_uniform.py::BlockWiseDiffusionLLM` (no KV cache, its default unroll)
drives `python/dinfer/decoding/parallel_strategy.py::CreditThresholdParallelDecoder` on the EXISTING tiny LLaDA
checkpoint of tests/fixtures/peers/llada (golden.json names `../llada`), loaded with Fast-dLLM's
`llada/model/modeling_llada.py::LLaDAModelLM` (the class that built it), in float32 and bfloat16, greedy
(temperature 0: dInfer's benchmarks' setting). dInfer's package `__init__` files are not run (they import its
serving stack): the three modules are imported from their files. The tokens are read from the runner's token
array (its `generate` returns them with every EOS id removed). `torch.compile` on the threshold rule is
turned off (TORCHDYNAMO_DISABLE=1: the eager arithmetic it compiles). 1 torch thread, deterministic.

Per call golden.json keeps the generated tokens, dInfer's forwards, the forwards whose block still had masks
(the others are its unrolled iterations on a block that just finished: no token changes) and the tokens accepted
per useful forward; and checks that the fused argmax at a masked position is never the mask id (refusion's drafts
never choose it; dInfer's rule would skip such a position).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import pf_common as C  # noqa: E402
import torch  # noqa: E402

DTYPES = ("float32", "bfloat16")
PEER_FILES = {
    "decoder": ("inclusionAI/dInfer", "--dinfer", "python/dinfer/decoding/parallel_strategy.py"),
    "runner": ("inclusionAI/dInfer", "--dinfer", "python/dinfer/decoding/generate_uniform.py"),
    "utils": ("inclusionAI/dInfer", "--dinfer", "python/dinfer/decoding/utils.py"),
    "model": ("NVlabs/Fast-dLLM", "--fast-dllm", "llada/model/modeling_llada.py"),
    "config": ("NVlabs/Fast-dLLM", "--fast-dllm", "llada/model/configuration_llada.py"),
}
#: (tag, generate kwargs, decoder kwargs, note); every case runs on every prompt in every dtype
CASES = (
    ("a", dict(gen_length=16, block_length=8), dict(threshold=0.9), "2 blocks of 8, the default credit"),
    ("b", dict(gen_length=16, block_length=16), dict(threshold=0.5), "one block of 16"),
    ("c", dict(gen_length=24, block_length=8), dict(threshold=0.6, credit_alpha=1.5, boost_gamma=0.5), "strong"),
    ("d", dict(gen_length=32, block_length=16), dict(threshold=0.7, decay_beta=0.5), "fast decay"),
    ("e", dict(gen_length=16, block_length=8), dict(threshold=0.4, use_float64=True), "float64 confidences"),
    ("f", dict(gen_length=32, block_length=16), dict(threshold=0.8, credit_alpha=3.0, decay_beta=0.95), "long memory"),
    ("g", dict(gen_length=16, block_length=16), dict(threshold=0.6), "one block of 16"),
    ("h", dict(gen_length=16, block_length=8), dict(threshold=0.7), "2 blocks of 8"),
)
#: the decoder's arguments every call passes
FIXED = dict(temperature=0.0, remasking="low_confidence")


def load_peers(dinfer: str, fast_dllm: str):
    C.synth_package("dinfer", os.path.join(dinfer, "python", "dinfer"))
    C.synth_package("dinfer.decoding", os.path.join(dinfer, "python", "dinfer", "decoding"))
    import importlib

    strategy = importlib.import_module("dinfer.decoding.parallel_strategy")
    runner = importlib.import_module("dinfer.decoding.generate_uniform")
    utils = importlib.import_module("dinfer.decoding.utils")
    C.synth_package("pf_credit_llada", os.path.join(fast_dllm, "llada", "model"))
    modeling = importlib.import_module("pf_credit_llada.modeling_llada")
    checkouts = {"--dinfer": dinfer, "--fast-dllm": fast_dllm}
    records = {k: C.file_record(checkouts[opt], rel, repo, opt) for k, (repo, opt, rel) in PEER_FILES.items()}
    return strategy, runner, utils, modeling, records


class Watch:
    """Read-only: counts dInfer's decode calls, the useful ones (the block still had masks), what each accepted,
    and whether the fused argmax at a masked position was ever the mask id."""

    def __init__(self, decoder, mask_id):
        self.decoder, self.mask_id = decoder, mask_id
        self.calls, self.accepted, self.mask_wins = 0, [], 0
        fuse, decode = decoder._apply_credit_fusion, decoder.decode

        def fused(logits, mask_index, key):
            out = fuse(logits, mask_index, key)
            self.mask_wins += int((out.argmax(-1)[mask_index] == mask_id).sum())
            return out

        def counted(logits, start, end, x, iter_threshold=None):
            before = int((x[:, start:end] == mask_id).sum())
            decode(logits, start, end, x, iter_threshold)
            self.calls += 1
            if before:
                self.accepted.append(before - int((x[:, start:end] == mask_id).sum()))

        decoder._apply_credit_fusion, decoder.decode = fused, counted


def run(args) -> dict:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    strategy, runner, utils, modeling, records = load_peers(args.dinfer, args.fast_dllm)
    arrays = []  # every TokenArray the runner makes (generate returns its tokens with every EOS id removed)

    class KeptTokenArray(runner.TokenArray):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            arrays.append(self)

    runner.TokenArray = KeptTokenArray
    llada = json.load(open(os.path.join(args.checkpoint, "golden.json")))
    mask_id, eos = llada["mask_token_id"], llada["eos_token_ids"][0]
    calls, skipped = [], []
    for dtype in DTYPES:
        model = modeling.LLaDAModelLM.from_pretrained(args.checkpoint, torch_dtype=getattr(torch, dtype)).eval()
        for tag, generate, decoder_args, note in CASES:
            for p, prompt in enumerate(llada["prompts"]):
                decoder = strategy.CreditThresholdParallelDecoder(mask_id=mask_id, eos_id=eos, **FIXED, **decoder_args)
                watch = Watch(decoder, mask_id)
                dllm = runner.BlockWiseDiffusionLLM(model, decoder, utils.BlockIteratorFactory(), early_stop=False)
                dllm.generate(torch.tensor([prompt]), **generate)
                tokens = arrays[-1].data[0, len(prompt) :]
                call = {
                    "function": "dinfer.credit",
                    "prompt": p,
                    "dtype": dtype,
                    "args": {**FIXED, **decoder_args, "mask_id": mask_id, "eos_id": eos, "early_stop": False},
                    "gen_length": generate["gen_length"],
                    "block_length": generate["block_length"],
                    "tokens": tokens.tolist(),
                    "forwards": dllm.num_forwards,
                    "useful_forwards": len(watch.accepted),
                    "accepted_per_forward": watch.accepted,
                    "note": f"({tag}) {note}",
                }
                if watch.mask_wins:
                    skipped.append({**call, "why": f"the fused argmax was the mask id {watch.mask_wins} times"})
                else:
                    calls.append(call)
    return {
        "family": "credit",
        "checkpoint": "../llada",
        "checkpoint_sha256": {
            f: C.sha256_file(os.path.join(args.checkpoint, f)) for f in ("config.json", "model.safetensors")
        },
        "made_with": {**C.versions(), "script": "tools/peer_fixtures/credit.py", "torchdynamo": "disabled"},
        "peer_files": records,
        "mask_token_id": mask_id,
        "eos_token_id": eos,
        "prompts": llada["prompts"],
        "calls": calls,
        "skipped": skipped,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dinfer", required=True, help="checkout of inclusionAI/dInfer")
    ap.add_argument("--fast-dllm", required=True, help="checkout of NVlabs/Fast-dLLM (llada/model/)")
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/peers/credit")
    ap.add_argument("--checkpoint", default=None, help="the tiny LLaDA checkpoint (default: <out>/../llada)")
    ap.add_argument("--check", action="store_true", help="regenerate and compare with --out (exit 1 on a difference)")
    args = ap.parse_args(argv)
    args.dinfer, args.fast_dllm, args.out = map(os.path.abspath, (args.dinfer, args.fast_dllm, args.out))
    args.checkpoint = os.path.abspath(args.checkpoint or os.path.join(args.out, os.pardir, "llada"))
    return C.write_or_check("credit", run(args), args.out, args.check)


if __name__ == "__main__":
    sys.exit(main())
