#!/usr/bin/env python3
"""Make (or --check) tests/fixtures/peers/wino/golden.json from WINO's own decoder (Feng-Hong/WINO-DLLM).

Run with the transformers-4 interpreter of make.py; it never imports `refusion`:

    /work/tf4/bin/python tools/peer_fixtures/wino.py --wino WINO-DLLM --out tests/fixtures/peers/wino [--check]

WINO's `LLaDA/decoding.py::decoding_wino` is called on the EXISTING tiny LLaDA checkpoint of
tests/fixtures/peers/llada (not copied: golden.json names `../llada`), loaded with WINO's own
`LLaDA/modeling_llada.py::LLaDAModelLM` (the class its generate.py / eval.py use: it takes the 4-D boolean
`attention_mask` and the `position_ids` that decoding_wino passes, which Fast-dLLM's class does not), in float32
and bfloat16. The worker runs in its own process with 1 torch thread, offline, deterministic. See
tests/fixtures/peers/README.md ("wino/").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from make import MAX_SAMPLING_SEEDS, WORKER_ENV  # noqa: E402

FAMILY = "wino"
DTYPES = ("float32", "bfloat16")
REPO = "Feng-Hong/WINO-DLLM"
PEER_FILES = {
    "decoding": "LLaDA/decoding.py",
    "model": "LLaDA/modeling_llada.py",
    "config": "LLaDA/configuration_llada.py",
}
#: checkpoint files whose sha256 golden.json records (a changed checkpoint fails --check)
CHECKPOINT_FILES = ("config.json", "model.safetensors")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--wino", required=True, help="checkout of Feng-Hong/WINO-DLLM (LLaDA/decoding.py, modeling_llada.py)"
    )
    ap.add_argument("--out", required=True, help="fixture folder, e.g. tests/fixtures/peers/wino")
    ap.add_argument(
        "--checkpoint",
        default=None,
        help="the tiny LLaDA checkpoint (default: <out>/../llada, recorded in golden.json as '../llada')",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary folder and compare with --out (exit 1 on any difference)",
    )
    ap.add_argument("--keep-temp", action="store_true", help="with --check: keep the regenerated folder")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.wino, a.out = os.path.abspath(a.wino), os.path.abspath(a.out)
    a.checkpoint = os.path.abspath(a.checkpoint or os.path.join(a.out, os.pardir, "llada"))
    return a


# =========================================================================== the cases
def cases():
    """(prompt, dtype-independent kwargs of decoding_wino, seed, note); every case runs in every dtype."""
    out = []
    greedy = [
        ("a", dict(gen_length=16, block_length=8, threshold=0.6, threshold_back=0.8), "2 blocks of 8"),
        ("b", dict(gen_length=16, block_length=16, threshold=0.9, threshold_back=0.95), "one block of 16"),
        ("c", dict(gen_length=32, block_length=8, threshold=0.9, threshold_back=0.8), "4 blocks of 8"),
        ("d", dict(gen_length=32, block_length=16, threshold=0.6, threshold_back=0.95), "2 blocks of 16"),
        ("e", dict(gen_length=32, block_length=8, threshold=0.6, threshold_back=0.95), "4 blocks of 8"),
        ("f", dict(gen_length=32, block_length=16, threshold=0.9, threshold_back=0.8), "2 blocks of 16"),
    ]
    for tag, kw, note in greedy:
        for p in range(3):
            out.append((p, dict(temperature=0.0, mask_id=3, **kw), None, f"({tag}) {note}, greedy"))
    sampled = [
        ("g", 0, dict(gen_length=16, block_length=8, temperature=0.5, threshold=0.6, threshold_back=0.8)),
        ("h", 2, dict(gen_length=32, block_length=16, temperature=1.0, threshold=0.6, threshold_back=0.95)),
        ("i", 2, dict(gen_length=32, block_length=8, temperature=0.5, threshold=0.6, threshold_back=0.95)),
        ("i", 1, dict(gen_length=32, block_length=16, temperature=0.5, threshold=0.6, threshold_back=0.95)),
    ]
    for tag, p, kw in sampled:
        note = (
            f"({tag}) Gumbel noise: add_gumbel_noise draws torch.rand_like(float64 logits) from torch's global RNG "
            "once per forward (shape [1, P + gen_length + block_length, vocab]), after torch.manual_seed(seed)"
        )
        out.append((p, dict(mask_id=3, **kw), 0, note))
    return out


#: requested cases the function refuses (recorded in golden.json -> skipped, once per dtype)
OFF_GRID = [(0, dict(gen_length=20, block_length=8, temperature=0.0, mask_id=3, threshold=0.6, threshold_back=0.8))]


# =========================================================================== worker
def load_peer(wino):
    import pf_common as C

    llada = os.path.join(wino, "LLaDA")
    # modeling_llada.py does `from configuration_llada import ...` (absolute): register that name first
    cfg = C.load_file("configuration_llada", os.path.join(llada, "configuration_llada.py"))
    mod = C.load_file("pf_wino_modeling_llada", os.path.join(llada, "modeling_llada.py"))
    dec = C.load_file("pf_wino_decoding", os.path.join(llada, "decoding.py"))
    records = {k: C.file_record(wino, rel, REPO, "--wino") for k, rel in PEER_FILES.items()}
    return cfg, mod, dec, records


class Observer:
    """Read-only: a forward hook that counts forwards and keeps each forward's input canvas, and a wrapper of
    decoding.add_gumbel_noise that checks the decision (argmax of its output) at the current block's masked
    positions is never the mask id. Nothing is modified."""

    def __init__(self, model, mask_id):
        self.mask_id = mask_id
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)
        self.reset(0, 16, 16)

    def reset(self, P, G, B):
        self.P, self.G, self.B = P, G, B
        self.inputs, self.violations, self.shadow_not_mask = [], [], 0

    def _hook(self, module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.inputs.append(ids[0].detach().clone())
        if ids.shape[1] != self.P + self.G + self.B:
            self.violations.append(f"forward {len(self.inputs)}: input length {ids.shape[1]}")
        if not bool((ids[0, self.P + self.G :] == self.mask_id).all()):
            self.shadow_not_mask += 1
        return None

    def wrap(self, orig):
        def wrapped(logits, temperature):
            out = orig(logits, temperature)
            ids = self.inputs[-1]
            gen = ids[self.P : self.P + self.G]
            masked = (gen == self.mask_id).nonzero().flatten()
            if masked.numel():
                blk = int(masked[0]) // self.B
                lo, hi = self.P + blk * self.B, self.P + (blk + 1) * self.B
                pos = lo + (ids[lo:hi] == self.mask_id).nonzero().flatten()
                bad = pos[out[0, pos].argmax(-1) == self.mask_id]
                if bad.numel():
                    self.violations.append(f"forward {len(self.inputs)}: argmax is the mask id at {bad.tolist()}")
            return out

        return wrapped


def run_case(dec, obs, model, prompt_ids, kw, seed):
    import pf_common as C
    import torch

    prompt = torch.tensor([prompt_ids])
    obs.reset(len(prompt_ids), kw["gen_length"], kw["block_length"])
    with C.wrap_attr(dec, "add_gumbel_noise", obs.wrap):
        if seed is not None:
            torch.manual_seed(seed)
        x, steps = dec.decoding_wino(model, prompt, **kw)
    return x, steps


def trace(obs, x, P, G, mask_id):
    """Per forward: the generated region of its input; per step: how many positions went mask -> token
    (accepted) and token -> mask (remasked) between this forward's input and the next (or the output)."""
    canv = [t[P : P + G].tolist() for t in obs.inputs] + [x[0, P : P + G].tolist()]
    acc, rem = [], []
    for a, b in zip(canv[:-1], canv[1:]):
        acc.append(sum(u == mask_id and v != mask_id for u, v in zip(a, b)))
        rem.append(sum(u != mask_id and v == mask_id for u, v in zip(a, b)))
    return canv[:-1], acc, rem


def worker(a) -> int:
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    import warnings

    warnings.filterwarnings("ignore")
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    import pf_common as C
    import pf_families as F
    from safetensors.torch import load_file

    _, mod, dec, records = load_peer(a.wino)
    ck = a.checkpoint
    with open(os.path.join(ck, "golden.json"), encoding="utf-8") as fh:
        llada_golden = json.load(fh)
    prompt_ids = F.prompts()
    if prompt_ids != llada_golden["prompts"]:
        raise C.FixtureError("the prompts differ from the llada fixture's")
    log = lambda *m: print(f"[{FAMILY}]", *m, flush=True)  # noqa: E731

    ref_logits = load_file(os.path.join(ck, "logits.safetensors"))
    models, logits_check = {}, {}
    for dtype in DTYPES:
        model = mod.LLaDAModelLM.from_pretrained(ck, torch_dtype=getattr(torch, dtype)).eval()
        for case in llada_golden["logits"]["cases"]:  # WINO's class == the class that made the llada fixture
            key = case["key"] if dtype == "float32" else case["dtypes"][dtype]
            with torch.no_grad():
                got = model(torch.tensor([case["input_ids"]])).logits[0]
            ref = ref_logits[key]
            if got.dtype != ref.dtype or got.shape != ref.shape:
                raise C.FixtureError(f"WINO's LLaDAModelLM ({dtype}): {key} has another dtype or shape")
            same = torch.equal(got, ref)
            if dtype == "float32" and not same:
                raise C.FixtureError(f"WINO's LLaDAModelLM does not reproduce {key} of the llada fixture bitwise")
            logits_check[key] = {
                "bitwise_equal": same,
                "max_abs_diff": (got.double() - ref.double()).abs().max().item(),
                "argmax_rows_differing": int((got.argmax(-1) != ref.argmax(-1)).sum()),
            }
        models[dtype] = (model, Observer(model, F.MASK))

    calls, skipped = [], []
    for dtype in DTYPES:
        model, obs = models[dtype]
        for p, kw, seed0, note in cases():
            seeds = [None] if seed0 is None else list(range(seed0, seed0 + MAX_SAMPLING_SEEDS))
            rejected = []
            for s in seeds:
                x, steps = run_case(dec, obs, model, prompt_ids[p], kw, s)
                if obs.violations:
                    if s is None:
                        raise C.MaskWins(f"prompt {p} {dtype} {kw}: {obs.violations[0]}")
                    rejected.append(s)
                    continue
                break
            else:
                raise C.MaskWins(f"prompt {p} {dtype} {kw}: no clean sampling seed")
            P, G = len(prompt_ids[p]), kw["gen_length"]
            if obs.shadow_not_mask:
                raise C.FixtureError(f"prompt {p} {kw}: the shadow block was not all masks at some forward")
            if x.shape[1] != P + G or x[0, :P].tolist() != prompt_ids[p]:
                raise C.FixtureError(f"prompt {p} {kw}: returned {tuple(x.shape)} or an altered prompt")
            tokens = x[0, P:].tolist()
            if F.MASK in tokens:
                raise C.FixtureError(f"prompt {p} {kw}: masks left in the output")
            canvas, acc, rem = trace(obs, x, P, G, F.MASK)
            rec = {
                "function": "wino.decoding_wino",
                "prompt": p,
                "dtype": dtype,
                "args": kw,
                "seed": s,
                "tokens": tokens,
                "steps": int(steps),
                "model_forwards": len(obs.inputs),
                "accepted_per_step": acc,
                "remasked_per_step": rem,
                "canvas_per_forward": canvas,
            }
            if rejected:
                rec["seeds_rejected"] = rejected
            rec["check"] = (
                "argmax (after add_gumbel_noise) at the current block's masked positions never the mask id; "
                "shadow block all masks at every forward"
            )
            rec["note"] = note
            calls.append(rec)
        for p, kw in OFF_GRID:
            try:
                run_case(dec, obs, model, prompt_ids[p], kw, None)
            except AssertionError as e:
                skipped.append(
                    {
                        "function": "wino.decoding_wino",
                        "prompt": p,
                        "dtype": dtype,
                        "args": kw,
                        "reason": "the peer function raised: `assert gen_length % block_length == 0`",
                        "error": f"AssertionError: {e}"[:500],
                    }
                )
            else:
                raise C.FixtureError(f"decoding_wino accepted gen_length {kw['gen_length']} / {kw['block_length']}")
        log(f"{dtype}: {sum(c['dtype'] == dtype for c in calls)} calls ok")

    made_with = C.versions()
    made_with["script"] = "tools/peer_fixtures/wino.py"
    golden = {
        "family": FAMILY,
        "class": "LLaDAModelLM",
        "checkpoint": "../llada",
        "checkpoint_sha256": {f: C.sha256_file(os.path.join(ck, f)) for f in CHECKPOINT_FILES},
        "checkpoint_logits": logits_check,
        "made_with": made_with,
        "peer_files": records,
        "mask_token_id": F.MASK,
        "eos_token_ids": llada_golden["eos_token_ids"],
        "end_of_turn_id": F.EOT,
        "head_scale": llada_golden["head_scale"],
        "dtypes": list(DTYPES),
        "prompt_texts": F.PROMPT_TEXTS,
        "prompts": prompt_ids,
        "calls": calls,
        "skipped": skipped,
        "notes": [
            "model: WINO's own LLaDA/modeling_llada.py::LLaDAModelLM.from_pretrained(checkpoint, torch_dtype=...)"
            ".eval(); checkpoint_logits compares its plain forward with the llada fixture's logits.safetensors "
            "(made by Fast-dLLM's class): float32 bitwise equal (required); in bfloat16 the two classes can round "
            "differently (Fast-dLLM wraps F.scaled_dot_product_attention in torch.compile, WINO calls it eagerly)",
            "call: decoding_wino(model, torch.tensor([prompt]), **args) after torch.manual_seed(seed) when seed is "
            "not null; tokens = x[0, len(prompt):] of the returned x (length len(prompt) + gen_length); steps = its "
            "second return value (= model_forwards)",
            "canvas_per_forward[k] = input_ids[0, P:P + gen_length] of forward k (the trailing shadow block is "
            "always all masks); accepted/remasked_per_step[k] = positions that went mask->token / token->mask "
            "between forward k's input and forward k+1's (or the output)",
        ],
    }
    os.makedirs(a.worker_out, exist_ok=True)
    C.write_json(os.path.join(a.worker_out, "golden.json"), golden)
    log(f"{len(calls)} calls, {len(skipped)} skipped")
    return 0


# =========================================================================== parent
def spawn(a, dest) -> int:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker-out", dest, "--wino", a.wino, "--out", a.out]
    cmd += ["--checkpoint", a.checkpoint]
    env = dict(os.environ)
    env.update(WORKER_ENV)
    return subprocess.run(cmd, env=env, cwd=HERE).returncode


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker_out:
        return worker(a)
    for opt, path in (("--wino", a.wino), ("--checkpoint", a.checkpoint)):
        if not os.path.isdir(path):
            print(f"error: {opt} {path} is not a folder", file=sys.stderr)
            return 2
    tmp = tempfile.mkdtemp(prefix="peer_fixtures_wino_")
    try:
        t0 = time.time()
        rc = spawn(a, os.path.join(tmp, FAMILY))
        print(f"[{FAMILY}] worker exit {rc} in {time.time() - t0:.1f}s", flush=True)
        if rc != 0:
            print(f"FAILED: could not {'regenerate' if a.check else 'make'} {FAMILY}", file=sys.stderr)
            return 1
        if a.check:
            import pf_compare

            problems, warnings = pf_compare.compare_family(a.out, os.path.join(tmp, FAMILY), FAMILY, 0.0)
            for w in warnings:
                print("warning:", w)
            if problems:
                print(f"CHECK FAILED: {len(problems)} difference(s) between {a.out} and a fresh regeneration:")
                for p in problems:
                    print("  -", p)
                return 1
            print(f"CHECK OK: {FAMILY} matches a fresh regeneration (all golden tokens and fields identical)")
            return 0
        os.makedirs(a.out, exist_ok=True)  # the folder holds golden.json only; nothing else is touched
        dest = os.path.join(a.out, "golden.json")
        shutil.copyfile(os.path.join(tmp, FAMILY, "golden.json"), dest)
        os.chmod(dest, 0o644)
        print(f"[{FAMILY}] wrote {dest} ({os.path.getsize(dest) / 1024:.1f} KiB)")
        return 0
    finally:
        if a.check and a.keep_temp:
            print("regenerated fixture kept in", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
