"""LLaDA 2.x: the ``llada2`` / ``llada2.1`` presets against the authors' own ``generate`` on the same weights.

Run (the authors' code needs a transformers-4.57 interpreter; see tests/fixtures/peers/README.md):

    python benchmarks/llada2.py --dllm path/to/ZHZisZZ-dllm --authors-python path/to/tf457/bin/python \\
        [--model tests/fixtures/peers/llada2 --block-length 8] [--rounds 3]

The authors' side runs in a worker process started with ``--authors-python`` (the vendored
``LLaDA2MoeModelLM.generate`` of LLaDA 2.0 and 2.1 from the ``--dllm`` checkout, the checkpoint in bfloat16,
1 torch thread), which reports the CPU time of each call in its own process; refusion's side runs here (1
torch thread). Calls alternate round by round, in rotating order, after a warm-up. Reported per setting: CPU
time (median [min-max]) of each side and their ratio per round, forwards, answer tokens per forward, refusion's
edits per answer (slots the ``editing`` reviser replaced; the authors' loop does not report its edits, equal
tokens and forwards say it took the same path), and whether the tokens are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "peers" / "llada2"

#: (label, preset, the authors' function, generate arguments)
SETTINGS = (
    ("2.0 greedy", "llada2", "llada2", dict(steps=4, threshold=0.95, temperature=0.0)),
    ("2.0 sampled", "llada2", "llada2", dict(steps=4, threshold=0.7, temperature=1.0, top_k=20)),
    (
        "2.1 threshold 0.7, editing 0.5",
        "llada2.1",
        "llada21",
        dict(threshold=0.7, editing_threshold=0.5, max_post_steps=16),
    ),
    (
        "2.1 threshold 0.5, editing 0.0",
        "llada2.1",
        "llada21",
        dict(threshold=0.5, editing_threshold=0.0, max_post_steps=16),
    ),
)

WORKER = textwrap.dedent(
    """
    import importlib.machinery, importlib.util, json, os, sys, time
    import torch
    torch.set_num_threads(1)
    dllm, checkpoint = sys.argv[1], sys.argv[2]
    models = {}
    for package, folder, name in (("llada2", "llada2", "llada2_moe"), ("llada21", "llada21", "llada21_moe")):
        spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        module = importlib.util.module_from_spec(spec)
        module.__path__ = [os.path.join(dllm, "dllm", "pipelines", folder, "models")]
        sys.modules[package] = module
        cls = __import__(f"{package}.modeling_{name}", fromlist=["x"]).LLaDA2MoeModelLM
        models[package] = cls.from_pretrained(checkpoint, torch_dtype=torch.bfloat16).eval()
    counts = {"forwards": 0}
    for model in models.values():
        original = model.forward
        def counted(*a, _original=original, **k):
            counts["forwards"] += 1
            return _original(*a, **k)
        model.forward = counted
    print("ready", flush=True)
    for line in sys.stdin:
        call = json.loads(line)
        counts["forwards"] = 0
        torch.manual_seed(call["seed"])
        start = time.process_time()
        with torch.no_grad():
            out = models[call["function"]].generate(torch.tensor([call["prompt"]]), **call["kwargs"])
        cpu = time.process_time() - start
        print(json.dumps({"tokens": out[0].tolist(), "forwards": counts["forwards"], "cpu": cpu}), flush=True)
    """
)


class Authors:
    """The worker process that runs the authors' ``generate``."""

    def __init__(self, python: str, dllm: str, checkpoint: str):
        self.process = subprocess.Popen(
            [python, "-c", WORKER, dllm, checkpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore", TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1"),
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the authors' worker did not start: {line!r}")

    def run(self, function: str, prompt: list[int], seed: int, kwargs: dict) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(dict(function=function, prompt=prompt, seed=seed, kwargs=kwargs)) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.terminate()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dllm", required=True, help="a checkout of ZHZisZZ/dllm (the authors' LLaDA 2.x code)")
    ap.add_argument("--authors-python", required=True, help="a transformers-4.57 interpreter for the authors' code")
    ap.add_argument("--model", default=str(FIXTURE))
    ap.add_argument("--block-length", type=int, default=8)
    ap.add_argument("--gen-length", type=int, default=30, help="answer tokens (the prompts are 2 tokens long)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    import refusion

    model = refusion.load_model(a.model, dtype="bfloat16", block_length=a.block_length)
    mask, eos = model.mask_token_id, min(model.eos_token_ids)
    prompts = [[4, 40 + 7 * i] for i in range(a.prompts)]
    authors = Authors(a.authors_python, a.dllm, a.model)
    rows = []
    try:
        for label, preset, function, args in SETTINGS:
            common = dict(block_length=a.block_length, gen_length=a.gen_length, mask_id=mask, eos_id=eos, **args)
            theirs = dict(common)

            def ours(preset=preset, common=common):
                return [
                    refusion.generate(p, model, preset=preset, seed=s, record=True, **common)
                    for s, p in enumerate(prompts)
                ]

            def authors_side(function=function, theirs=theirs):
                return [authors.run(function, p, s, theirs) for s, p in enumerate(prompts)]

            ours(), authors_side()  # warm-up
            runs = {"refusion": [], "authors": []}
            for r in range(a.rounds):
                for side in ("refusion", "authors") if r % 2 == 0 else ("authors", "refusion"):
                    if side == "refusion":
                        start = time.process_time()
                        results = ours()
                        cpu = time.process_time() - start
                        runs[side].append((cpu, [x.tokens.tolist() for x in results], results))
                    else:
                        calls = authors_side()
                        runs[side].append((sum(c["cpu"] for c in calls), [c["tokens"] for c in calls], calls))
            mine, theirs_runs = runs["refusion"][-1], runs["authors"][-1]
            same = all(m[1] == t[1] for m, t in zip(runs["refusion"], runs["authors"]))
            tokens = sum(len(t) for t in mine[1])
            forwards = sum(x.forwards for x in mine[2])
            their_forwards = sum(c["forwards"] for c in theirs_runs[2])
            edits = sum(len(rec.revised) for x in mine[2] for rec in x.iterations) / len(prompts)
            ratio = [t[0] / m[0] for m, t in zip(runs["refusion"], runs["authors"])]
            rows.append((label, runs, ratio, forwards, their_forwards, tokens, edits, same))
    finally:
        authors.close()
    print(
        f"# {a.model}, bfloat16, block {a.block_length}, {a.prompts} prompts x {a.gen_length} tokens, {a.rounds} rounds"
    )
    print(
        "| setting | authors CPU s | refusion CPU s | speed-up | forwards (authors / refusion) | tokens/forward "
        "| edits/answer | same tokens |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for label, runs, ratio, forwards, their_forwards, tokens, edits, same in rows:

        def spread(side, runs=runs):
            v = [x[0] for x in runs[side]]
            return f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"

        print(
            f"| {label} | {spread('authors')} | {spread('refusion')} | {statistics.median(ratio):.2f}x "
            f"[{min(ratio):.2f}-{max(ratio):.2f}] | {their_forwards} / {forwards} | {tokens / forwards:.2f} | "
            f"{edits:.1f} | {'yes' if same else 'NO'} |"
        )
    return 0 if all(row[-1] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
