#!/usr/bin/env python3
"""Make (or --check) the peer fixtures under tests/fixtures/peers/<family>/ from the peers' own code.

Run with a transformers-4 interpreter (the peers need transformers 4.52.x); it never imports `refusion`:

    /work/tf4/bin/python tools/peer_fixtures/make.py --llada LLaDA --fast-dllm Fast-dLLM --sdar SDAR \
        --refusion ReFusion --out tests/fixtures/peers [--check] [--only llada,dream,sdar,refusion]

Each family is made in its own worker process (1 torch thread, offline, deterministic). See
tests/fixtures/peers/README.md for what is made and why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FAMILY_NAMES = ["llada", "dream", "sdar", "refusion"]
MAX_WEIGHT_SEEDS = 32
MAX_SAMPLING_SEEDS = 64
LOGITS_ATOL = 1e-6
WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_VERBOSITY": "error",
    "PYTHONHASHSEED": "0",
    "CUDA_VISIBLE_DEVICES": "",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llada", required=True, help="checkout of ML-GSAI/LLaDA (generate.py)")
    ap.add_argument(
        "--fast-dllm",
        required=True,
        dest="fast_dllm",
        help="checkout of NVlabs/Fast-dLLM (llada/generate.py, llada/model/, dream/model/)",
    )
    ap.add_argument(
        "--sdar", required=True, help="checkout of JetAstra/SDAR (generate.py, training/model/SDAR-8B-Chat/)"
    )
    ap.add_argument("--refusion", required=True, help="checkout of ML-GSAI/ReFusion (generate.py, qwen3/)")
    ap.add_argument("--out", required=True, help="fixture root, e.g. tests/fixtures/peers")
    ap.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary folder and compare with --out (exit 1 on any difference)",
    )
    ap.add_argument(
        "--only", default=",".join(FAMILY_NAMES), help="comma-separated subset of " + ",".join(FAMILY_NAMES)
    )
    ap.add_argument("--keep-temp", action="store_true", help="with --check: keep the regenerated folder")
    ap.add_argument(
        "--head-scale",
        default=None,
        help="opt-in: multiply the output head by this factor before the mask/EOS rows are zeroed, e.g. "
        "'4' or 'llada=4,dream=32,sdar=32,refusion=32' (default 1 = the class's own init; recorded "
        "in golden.json; --check reuses the committed value unless this is given)",
    )
    ap.add_argument(
        "--eos-scale",
        default=None,
        help="opt-in: multiply the output-head rows of the family's EOS ids by this factor (after "
        "--head-scale), so that some answers hold an EOS, e.g. 'dream=1.5,sdar=1.5' (default 1; "
        "recorded in golden.json as eos_scale; --check reuses the committed value)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--worker-head-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--worker-eos-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for k in ("llada", "fast_dllm", "sdar", "refusion", "out"):
        setattr(a, k, os.path.abspath(getattr(a, k)))
    a.only = [f.strip() for f in a.only.split(",") if f.strip()]
    bad = [f for f in a.only if f not in FAMILY_NAMES]
    if bad:
        ap.error(f"unknown families {bad}; choose from {FAMILY_NAMES}")
    a.scales = per_family(ap, "--head-scale", a.head_scale)
    a.eos_scales = per_family(ap, "--eos-scale", a.eos_scale)
    return a


def per_family(ap, option, text) -> dict:
    """'4' (every family) or 'llada=4,dream=32' -> {family: float}."""
    out = {}
    if not text:
        return out
    try:
        for part in text.split(","):
            if "=" in part:
                k, v = part.split("=", 1)
                if k.strip() not in FAMILY_NAMES:
                    raise ValueError(k)
                out[k.strip()] = float(v)
            else:
                out.update({f: float(part) for f in FAMILY_NAMES})
    except ValueError as e:
        ap.error(f"bad {option} {text!r} ({e})")
    return out


# =========================================================================== worker (one family per process)
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
    from safetensors.torch import save_file

    peers = {"llada": a.llada, "fast_dllm": a.fast_dllm, "sdar": a.sdar, "refusion": a.refusion}
    fam = F.FAMILIES[a.worker](peers)
    import io

    chatter = io.StringIO()
    with contextlib.redirect_stdout(chatter):  # transformers' import-time auto_docstring notices on peer classes
        fam.load()
    for line in chatter.getvalue().splitlines():
        if line.strip() and "\U0001f6a8" not in line:
            print(line)
    out = a.worker_out
    prompt_ids = F.prompts()
    calls = fam.all_calls()
    log = lambda *m: print(f"[{fam.name}]", *m, flush=True)  # noqa: E731

    rejected_weight_seeds = []
    for ws in range(MAX_WEIGHT_SEEDS):
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(out)
        built = fam.build(ws, a.worker_head_scale, a.worker_eos_scale)
        fam.save(built, out)
        model = fam.reload(out)
        ref = built.state_dict()
        got = model.state_dict()
        if set(ref) != set(got) or any(not torch.equal(ref[k], got[k]) for k in ref):
            raise C.FixtureError("weights reloaded with from_pretrained differ from the saved model")
        del built
        guards = {"float32": C.MaskGuard(model, F.MASK, fam.forbidden, fam.shift)}
        for dtype in fam.dtypes[1:]:  # the same files loaded as the authors load them in half precision
            guards[dtype] = C.MaskGuard(fam.reload(out, dtype), F.MASK, fam.forbidden, fam.shift)
        try:
            records, skipped = run_calls(fam, guards, calls, prompt_ids, log)
        except C.MaskWins as e:
            log(f"weight seed {ws} rejected: {e}")
            rejected_weight_seeds.append({"weight_seed": ws, "reason": str(e)[:500]})
            for g in guards.values():
                g.handle.remove()
            continue
        break
    else:
        raise C.FixtureError(f"no weight seed in 0..{MAX_WEIGHT_SEEDS - 1} keeps the mask id from winning")

    # logits cases (guard observes, greedy checks off)
    guard = guards["float32"]
    guard.reset(greedy=False)
    tensors, cases = {}, []
    with torch.no_grad():
        for i, p in enumerate(prompt_ids):
            ids = torch.tensor([p + [F.MASK] * F.LOGIT_MASKS])
            logits, how = fam.logits(model, ids)
            key = f"logits.{i}"
            tensors[key] = logits.detach().to(torch.float32).contiguous().clone()
            cases.append(
                {
                    "key": key,
                    "input_ids": ids[0].tolist(),
                    "shape": list(tensors[key].shape),
                    "note": f"prompt {i} followed by {F.LOGIT_MASKS} masks; {how}",
                }
            )
            for dtype in fam.dtypes[1:]:  # the same forward of the model loaded in half precision, in its dtype
                half, _ = fam.logits(guards[dtype].model, ids)
                tensors[f"{key}.{dtype}"] = half.detach().contiguous().clone()
                cases[-1].setdefault("dtypes", {})[dtype] = f"{key}.{dtype}"
    save_file(tensors, os.path.join(out, "logits.safetensors"), metadata={"format": "pt"})

    golden = {
        "family": fam.name,
        "class": fam.class_name,
        "weight_seed": ws,
        "weight_seeds_rejected": rejected_weight_seeds,
        "made_with": C.versions(),
        "peer_files": fam.records,
        "mask_token_id": F.MASK,
        "eos_token_ids": fam.generation_config["eos_token_id"]
        if isinstance(fam.generation_config["eos_token_id"], list)
        else [fam.generation_config["eos_token_id"]],
        "head_scale": a.worker_head_scale,
        "eos_scale": a.worker_eos_scale,
        "eos_rows_scaled": list(fam.eos_rows) if a.worker_eos_scale != 1.0 else [],
        "dtypes": list(fam.dtypes),
        "head_rows_zeroed": list(fam.forbidden),
        "prompt_texts": F.PROMPT_TEXTS,
        "prompts": prompt_ids,
        "logits": {"file": "logits.safetensors", "dtype": "float32", "cases": cases},
        "calls": records,
        "skipped": skipped,
    }
    if hasattr(fam, "stand_ins"):
        golden["cpu_stand_ins"] = {"folder": "tools/peer_fixtures", "sha256": fam.stand_ins}
    if hasattr(fam, "family_notes"):
        golden["notes"] = fam.family_notes()
    C.write_json(os.path.join(out, "golden.json"), golden)
    log(f"weight seed {ws}; {len(records)} calls, {len(skipped)} skipped; files: {sorted(os.listdir(out))}")
    return 0


def run_calls(fam, guards, calls, prompt_ids, log):
    import pf_common as C
    import pf_families as F
    import torch

    records = list()
    skipped = list(fam.skipped()) if hasattr(fam, "skipped") else []
    for call in calls:
        guard = guards[call.dtype]
        model = guard.model
        prompt = torch.tensor([prompt_ids[call.prompt]])
        P = prompt.shape[1]
        seeds = [None] if call.seed is None else list(range(call.seed, call.seed + MAX_SAMPLING_SEEDS))
        rejected = []
        result = None
        for s in seeds:
            guard.reset(greedy=not call.sampling)
            try:
                with contextlib.ExitStack() as stack:
                    for owner, name, make in fam.guard_wrappers(guard):
                        stack.enter_context(C.wrap_attr(owner, name, make))
                    if s is not None:
                        torch.manual_seed(s)
                    x, extra = fam.run(model, call, prompt)
            except C.FixtureError:
                raise
            except Exception as e:
                if guard.violations:
                    x = None
                else:
                    msg = f"{type(e).__name__}: {e}"
                    log(f"SKIPPED {call.function} prompt {call.prompt} {call.args}: {msg}")
                    skipped.append(
                        {
                            "function": call.function,
                            "prompt": call.prompt,
                            "args": call.args,
                            "seed": s,
                            "reason": "the peer function raised",
                            "error": msg[:1000],
                        }
                    )
                    break
            if guard.violations:
                what = f"{call.function} prompt {call.prompt} {call.args} seed {s}: {guard.violations[0]}"
                if s is None:
                    raise C.MaskWins(what)
                rejected.append(s)
                continue
            result = (s, x, extra)
            break
        else:
            raise C.MaskWins(
                f"{call.function} prompt {call.prompt} {call.args}: no clean sampling seed in {seeds[0]}..{seeds[-1]}"
            )
        if result is None:
            continue
        s, x, extra = result
        tokens = x[0, P:].tolist()
        left = sum(t == F.MASK for t in tokens)
        stops = call.args.get("stopping_criteria_idx")
        stopped = bool(stops) and any(t in stops for t in tokens)
        if left and not stopped:
            raise C.FixtureError(f"{call.function} prompt {call.prompt} {call.args}: {left} masks left in the output")
        rec = {
            "function": call.function,
            "prompt": call.prompt,
            "dtype": call.dtype,
            "args": call.args,
            "seed": s,
            "tokens": tokens,
            "nfe": extra.pop("nfe", None),
            "model_forwards": guard.forwards,
        }
        rec.update(extra)
        if rejected:
            rec["seeds_rejected"] = rejected
        if stops:
            rec["stopped_early"] = stopped
            rec["masks_left"] = left
        rec["check"] = (
            "sampled draws at masked rows never the mask id"
            if call.sampling
            else "argmax at masked positions never "
            + ("the mask or EOS id" if len(fam.forbidden) > 1 else "the mask id")
        )
        rec["note"] = call.note
        records.append(rec)
    log(f"{len(records)} calls ok")
    return records, skipped


# =========================================================================== parent
def scale_for(a, family, given, key) -> float:
    if family in given:
        return given[family]
    if a.check:  # reproduce what is committed
        path = os.path.join(a.out, family, "golden.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                return float(json.load(fh).get(key, 1.0))
    return 1.0


def spawn(a, family, dest) -> int:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        family,
        "--worker-out",
        dest,
        "--worker-head-scale",
        repr(scale_for(a, family, a.scales, "head_scale")),
        "--worker-eos-scale",
        repr(scale_for(a, family, a.eos_scales, "eos_scale")),
        "--llada",
        a.llada,
        "--fast-dllm",
        a.fast_dllm,
        "--sdar",
        a.sdar,
        "--refusion",
        a.refusion,
        "--out",
        a.out,
    ]
    env = dict(os.environ)
    env.update(WORKER_ENV)
    return subprocess.run(cmd, env=env, cwd=HERE).returncode


def make_all(a, root) -> list[str]:
    failed = []
    for fam in a.only:
        t0 = time.time()
        rc = spawn(a, fam, os.path.join(root, fam))
        print(f"[{fam}] worker exit {rc} in {time.time() - t0:.1f}s", flush=True)
        if rc != 0:
            failed.append(fam)
    return failed


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    for k in ("llada", "fast_dllm", "sdar", "refusion"):
        if not os.path.isdir(getattr(a, k)):
            print(f"error: --{k.replace('_', '-')} {getattr(a, k)} is not a folder", file=sys.stderr)
            return 2
    if a.check:
        tmp = tempfile.mkdtemp(prefix="peer_fixtures_check_")
        try:
            failed = make_all(a, tmp)
            if failed:
                print(f"CHECK FAILED: could not regenerate {failed}")
                return 1
            import pf_compare

            problems, warnings = pf_compare.compare_tree(os.path.join(a.out), tmp, a.only, LOGITS_ATOL)
            for w in warnings:
                print("warning:", w)
            if problems:
                print(f"CHECK FAILED: {len(problems)} difference(s) between {a.out} and a fresh regeneration:")
                for p in problems:
                    print("  -", p)
                return 1
            print(
                f"CHECK OK: {', '.join(a.only)} match a fresh regeneration "
                f"(weights bitwise, logits within {LOGITS_ATOL:g}, all golden tokens identical)"
            )
            return 0
        finally:
            if a.keep_temp:
                print("regenerated fixtures kept in", tmp)
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="peer_fixtures_")
    try:
        failed = make_all(a, staging)
        for fam in a.only:
            if fam in failed:
                continue
            dest = os.path.join(a.out, fam)
            if os.path.isdir(dest):
                shutil.rmtree(dest)
            shutil.copytree(os.path.join(staging, fam), dest)
            for f in os.listdir(dest):
                os.chmod(os.path.join(dest, f), 0o644)
            total = sum(os.path.getsize(os.path.join(dest, f)) for f in os.listdir(dest))
            print(f"[{fam}] wrote {dest} ({total / 1024:.1f} KiB)")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if failed:
        print(f"FAILED families: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
