"""Run the public reference decoder (ML-GSAI/ReFusion ``generate_refusion``) beside refusion, on the same weights.

Used by ``benchmarks/scale.py --reference DIR --reference-python PY``. ``DIR``
is a local checkout of github.com/ML-GSAI/ReFusion; ``PY`` the python of a
virtual environment that can import it (the reference pins transformers
4.52: e.g. ``python -m venv ref && ref/bin/pip install torch==2.13.0
transformers==4.52.4 pandas tqdm numpy``). Nothing of the reference is
imported into this process or committed: a small driver, written to a
temporary folder, imports ``generate.py`` from ``DIR`` in the other
environment, decodes the prompts with 1 torch thread and reports CPU time,
forwards and tokens as JSON.

The random model is saved once (float32, a config both transformers 4.52 and
5.x read). Its LM-head row of the mask token is zeroed, so that the
reference's argmax (which may pick the mask; refusion never drafts it) never
does; the same weights serve both sides. An EOS id is set on both sides so
the reference's EOS logic runs as written. Rounds alternate: one reference
round (a fresh process), then the library's round, and the ratio is taken
within each round.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import torch

from refusion.decoding.decoder import Decoder
from refusion.models.hf import HFCausalLM

DRIVER = textwrap.dedent("""
    import json, sys, time, types
    import torch
    repo, weights, job = sys.argv[1], sys.argv[2], json.loads(open(sys.argv[3]).read())
    sys.path.insert(0, repo)
    torch.set_num_threads(1)
    from generate import generate_refusion
    from qwen3.modeling_qwen3_refusion import Qwen3ForCausalLM
    model = Qwen3ForCausalLM.from_pretrained(weights, torch_dtype=torch.float32).eval()
    tokenizer = types.SimpleNamespace(eos_token_id=job["eos"])
    calls = [0]
    model.model.register_forward_pre_hook(lambda *a, **k: calls.__setitem__(0, calls[0] + 1))
    out = []
    for config in job["configs"]:
        tokens, cpu, forwards = [], 0.0, 0
        for prompt in job["prompts"]:
            ids = torch.tensor([prompt])
            calls[0] = 0
            start = time.process_time()
            x, _ = generate_refusion(model, tokenizer, ids, gen_length=config["gen"], temperature=0.0,
                                     mask_id=job["mask"], slot_size=config["slot"],
                                     serial_num_blocks=config["blocks"], slot_threshold=config["slot_t"],
                                     token_threshold=config["token_t"])
            cpu += time.process_time() - start
            forwards += calls[0]
            tokens.append(x[0, len(prompt):].tolist())
        out.append({"cpu": cpu, "forwards": forwards, "tokens": tokens})
    print(json.dumps(out))
""")

CONFIGS = {"paper 0.9/0.9": (0.9, 0.9), "slot1-acc": (1.0, 0.0)}


def _save(model, folder: Path, mask: int, eos: int) -> None:
    """The weights with the mask's head row zeroed, and a config readable by transformers 4.52 and 5.x."""
    with torch.no_grad():
        model.lm_head.weight[mask].zero_()
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 1000000.0))
    config.update(torch_dtype="float32", eos_token_id=eos, architectures=["Qwen3ForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def _cut(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def compare_with_reference(model, adapter, size: str, args) -> list[dict]:
    """Interleaved rounds of the reference and of refusion (branch engine), batch 1; prints and returns rows."""
    if not args.reference_python:
        raise SystemExit("--reference needs --reference-python (a venv that can import the reference)")
    mask = adapter.mask_token_id
    eos = mask - 1
    ours = HFCausalLM(model, eos_token_id=eos)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, mask - 2, (4, 16), generator=g).tolist()
    gens = [int(x) for x in args.gens.split(",") if int(x) <= 256]
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "weights"
        _save(model, folder, mask, eos)
        (Path(tmp) / "driver.py").write_text(DRIVER)
        for gen in gens:
            configs = [
                dict(gen=gen, slot=8, blocks=max(1, gen // 32), slot_t=st, token_t=tt) for st, tt in CONFIGS.values()
            ]
            (Path(tmp) / "job.json").write_text(json.dumps(dict(prompts=prompts, configs=configs, mask=mask, eos=eos)))
            decoders = [
                Decoder.from_names(
                    slot_size=8, serial_num_blocks=c["blocks"], slot_threshold=c["slot_t"], token_threshold=c["token_t"]
                )
                for c in configs
            ]
            for d in decoders:  # warm-up
                d.decode(ours, prompts[0], gen)
            rounds = []
            for _ in range(args.rounds):
                done = subprocess.run(
                    [
                        args.reference_python,
                        str(Path(tmp) / "driver.py"),
                        args.reference,
                        str(folder),
                        str(Path(tmp) / "job.json"),
                    ],
                    capture_output=True,
                    text=True,
                )
                if done.returncode:
                    raise SystemExit(f"the reference failed:\n{done.stderr[-3000:]}")
                ref = json.loads(done.stdout.strip().splitlines()[-1])
                mine = []
                for d in decoders:
                    start, tokens, forwards = time.process_time(), [], 0
                    for p in prompts:
                        r = d.decode(ours, p, gen)
                        tokens.append(r.tokens.tolist())
                        forwards += r.forwards
                    mine.append({"cpu": time.process_time() - start, "forwards": forwards, "tokens": tokens})
                rounds.append((ref, mine))
            print(
                f"\n### reference generate_refusion vs refusion ({size}, gen {gen}, batch 1, {len(prompts)} prompts, "
                f"{args.rounds} rounds)"
            )
            print(
                f"{'config':<16} {'ref CPU s':>10} {'ours CPU s':>11} {'ours vs ref':>18} {'ref fwd':>8} "
                f"{'ours fwd':>9} {'same tokens':>12}"
            )
            for i, name in enumerate(CONFIGS):
                ratios = [r[0][i]["cpu"] / r[1][i]["cpu"] for r in rounds]
                ref_cpu = statistics.median(r[0][i]["cpu"] for r in rounds)
                our_cpu = statistics.median(r[1][i]["cpu"] for r in rounds)
                ref_tokens = [_cut(t, eos) for t in rounds[0][0][i]["tokens"]]
                same = sum(a == b for a, b in zip(ref_tokens, rounds[0][1][i]["tokens"]))
                print(
                    f"{name:<16} {ref_cpu:>10.2f} {our_cpu:>11.2f} {statistics.median(ratios):>8.2f}x "
                    f"[{min(ratios):.2f}-{max(ratios):.2f}] {rounds[0][0][i]['forwards']:>8} "
                    f"{rounds[0][1][i]['forwards']:>9} {same:>6}/{len(prompts)}"
                )
                records.append(
                    {
                        "model": size,
                        "gen": gen,
                        "reference_config": name,
                        "reference_cpu": ref_cpu,
                        "ours_cpu": our_cpu,
                        "ratio": statistics.median(ratios),
                        "ratio_spread": (min(ratios), max(ratios)),
                        "reference_forwards": rounds[0][0][i]["forwards"],
                        "ours_forwards": rounds[0][1][i]["forwards"],
                        "same_tokens": same,
                        "prompts": len(prompts),
                    }
                )
    return records
