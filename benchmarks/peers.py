"""refusion against the peers' OWN decoding code, on the same weights, the same prompts, 1 torch thread, CPU.

Run (the peers need transformers 4.52, so their code runs in a second interpreter):

    python benchmarks/peers.py --peer-python /work/tf4/bin/python \\
        --llada LLaDA --fast-dllm Fast-dLLM --sdar SDAR --refusion ReFusion \\
        [--rounds 3] [--prompts 4] [--size small|medium] [--only llada,dream,sdar,refusion] \\
        [--out benchmarks/results/peers.csv]

``--llada`` etc. are local checkouts of ML-GSAI/LLaDA, NVlabs/Fast-dLLM,
JetAstra/SDAR and ML-GSAI/ReFusion. Nothing of them is imported into this
process or copied into this repository: they are imported by path, in the peer
interpreter, by ``tools/peer_fixtures`` (synthetic packages, LLaDA imported once,
SDAR's CPU stand-ins for ``flash_attn`` and the import-only ``triton``; see
tests/fixtures/peers/README.md). This file is also the peer-side worker
(``--worker build|serve``, run by the peer interpreter; it never imports refusion).

Weights. One random model per family, built ONCE by the peer's own class
(LLaDA ``LLaDAModelLM``, Dream ``DreamModel``, SDAR ``SDARForCausalLM``, ReFusion's
``Qwen3ForCausalLM``) in float32 and saved with its own ``save_pretrained`` in the
published layout (``tools/peer_fixtures``' ``Family.build``/``save``: published
config fields, the fixtures' char-level tokenizer for the special ids). The
output head is multiplied by ``--head-scale`` so that the distributions are
peaked and confidence thresholds fire, and the head rows of the mask (3), EOS
(1) and end-of-turn (2) ids are zeroed: the mask is never predicted, and no
side stops early at an EOS (refusion stops after the block holding an EOS,
most peers decode the whole length), so both sides do the whole job. refusion
loads the same folder with ``refusion.load_model(path)``.

Sizes: ``small`` hidden 256, 4 layers, 4 heads (2 KV), intermediate 768, vocab
4096; ``medium`` hidden 512, 8 layers, 8 heads (4 KV), intermediate 1536, vocab
8192 (head_dim = hidden / heads everywhere). Prompts: random ids in [5, vocab)
(never a special id, never the mask), lengths 16-32, seeded.

Cases: gen 64 tokens each (SDAR: rounded so that prompt + gen is a multiple of
its block of 4, as its generate needs), the peer function called with its own
arguments, refusion with ``preset=<that function's preset>`` and the same
arguments (``refusion.peers.peer_functions()``), seeds as the peer's
``torch.manual_seed`` (SDAR always samples; everything else is greedy).

Timing. Each round starts ONE fresh peer process, which loads the saved weights
(not timed) and then serves the cases one by one; for each case, the peer's
calls (a warm-up call, then each prompt timed with ``time.process_time`` /
``time.perf_counter``, the network's forwards counted with a forward pre-hook)
and refusion's calls of the same case and prompts (in this process; one warm-up
call per case before the first round) run back to back, the peer first in even
rounds and refusion first in odd ones. The process waiting for its turn is
idle, so the two never compete for the CPU, and a burst of load from other jobs
hits both sides of a case about alike. A row's time is the median over rounds
of the mean time per call, with [min-max] over rounds; the speed-up is peer time
/ refusion time taken within each round (> 1: refusion is
faster), median [min-max] over rounds. Loading and warm-up are not timed. Rows,
medians, spreads and the header line come from ``benchmarks/common.py``.

Counts beside the times: forwards per call (peer: a hook on its network;
refusion: ``result.forwards``), generated tokens per forward, whether the tokens
are identical (k of n prompts; every case is greedy or seeded, and
tests/models/test_peer_checkpoints.py asserts identity for these functions), and where
the CPU goes: inside the network per forward (peer: its top module, backbone and
LM head; refusion: ``refusion.counters.observe``) and outside it per forward (the
decoder's own work). Caveat: SDAR's network runs with the fixtures' plain-torch
CPU stand-ins for ``flash_attn`` (``tools/peer_fixtures/stubs``), not the real library.
The table is printed and written as CSV (``--out``, default
benchmarks/results/peers.csv).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEER_FIXTURES = ROOT / "tools" / "peer_fixtures"

SIZES = {
    # hidden, layers, heads, kv heads, intermediate, vocab
    "small": (256, 4, 4, 2, 768, 4096),
    "medium": (512, 8, 8, 4, 1536, 8192),
}
FAMILIES = ("llada", "dream", "sdar", "refusion")
# multiplies the output head (see the module docstring); chosen so that the 0.9 thresholds accept several tokens
# per step on some steps but not everything at once (tokens/forward are printed with every row)
HEAD_SCALE = {"llada": 8.0, "dream": 48.0, "sdar": 64.0, "refusion": 64.0}
MASK, EOS, EOT = 3, 1, 2
GEN = 64
WEIGHT_SEED = 0
PROMPT_SEED = 1234
PEER_ENV = {
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

LLADA = {
    "mask_id": MASK,
    "temperature": 0.0,
    "remasking": "low_confidence",
    "steps": 64,
    "gen_length": GEN,
    "block_length": 32,
}
FAST = {**LLADA, "threshold": 0.9}
DREAM = {"max_new_tokens": GEN, "temperature": 0.0, "return_dict_in_generate": True}
DREAM_BLOCK = {**DREAM, "steps": 64, "alg": "confidence_threshold", "threshold": 0.9, "block_length": 32}

# name, family, peer function, its arguments, seed (None: greedy, unseeded)
CASES = [
    ("llada.generate s64 b32", "llada", "llada.generate", dict(LLADA, cfg_scale=0.0), None),
    ("fast_dllm.generate t0.9", "llada", "fast_dllm.generate", FAST, None),
    ("fast_dllm.prefix_cache t0.9", "llada", "fast_dllm.generate_with_prefix_cache", FAST, None),
    ("fast_dllm.dual_cache t0.9", "llada", "fast_dllm.generate_with_dual_cache", FAST, None),
    (
        "dream.diffusion_generate entropy s64",
        "dream",
        "dream.diffusion_generate",
        dict(DREAM, steps=64, alg="entropy"),
        None,
    ),
    (
        "fast_dllm.dream_block t0.9",
        "dream",
        "fast_dllm.dream_block_generate",
        dict(DREAM_BLOCK, dual_cache=False),
        None,
    ),
    (
        "fast_dllm.dream_block t0.9 dual",
        "dream",
        "fast_dllm.dream_block_generate",
        dict(DREAM_BLOCK, dual_cache=True),
        None,
    ),
    (
        "sdar.block_diffusion dyn0.9 b4",
        "sdar",
        "sdar.block_diffusion_generate",
        {
            "mask_id": MASK,
            "gen_length": GEN,
            "block_length": 4,
            "denoising_steps": 4,
            "temperature": 1.0,
            "top_k": 0,
            "top_p": 1.0,
            "remasking_strategy": "low_confidence_dynamic",
            "confidence_threshold": 0.9,
            "stopping_criteria_idx": None,
        },
        0,
    ),
    (
        "refusion.generate_refusion 0.9/0.9",
        "refusion",
        "refusion.generate_refusion",
        {
            "gen_length": GEN,
            "temperature": 0.0,
            "mask_id": MASK,
            "slot_size": 8,
            "serial_num_blocks": 2,
            "slot_threshold": 0.9,
            "token_threshold": 0.9,
        },
        None,
    ),
]


def call_args(args: dict, function: str, prompt_length: int) -> dict:
    """The case's arguments for one prompt: SDAR's gen_length makes prompt + gen a multiple of its block."""
    args = dict(args)
    if function == "sdar.block_diffusion_generate":
        block = args["block_length"]
        args["gen_length"] = -(-(prompt_length + GEN) // block) * block - prompt_length
    return args


def make_prompts(n: int, vocab: int, seed: int = PROMPT_SEED) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randint(16, 32))] for _ in range(n)]


# =========================================================================== peer side (transformers 4 interpreter)
def _peer_setup(a):
    """Imports for a worker: torch with 1 thread, tools/peer_fixtures on sys.path, the sizes of --size."""
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    sys.path.insert(0, str(PEER_FIXTURES))
    import pf_families as F

    hidden, layers, heads, kv, inter, vocab = SIZES[a.size]
    # pf_families builds its configs from these module constants (the fixtures' tiny sizes by default)
    F.HIDDEN, F.LAYERS, F.HEADS, F.KV_HEADS, F.INTER, F.VOCAB = hidden, layers, heads, kv, inter, vocab
    peers = {"llada": a.llada, "fast_dllm": a.fast_dllm, "sdar": a.sdar, "refusion": a.refusion}
    return torch, F, peers


def _load_family(F, peers, name):
    fam = F.FAMILIES[name](peers)
    with contextlib.redirect_stdout(io.StringIO()):  # transformers' import-time notices on peer classes
        fam.load()
    return fam


class _HeadDim:
    """The family's config module with ``head_dim`` overridden (the fixtures pin head_dim 16 for SDAR/ReFusion)."""

    def __init__(self, module, head_dim: int):
        self._module, self._head_dim = module, head_dim

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if isinstance(value, type) and name.endswith("Config"):
            return lambda **kw: value(**{**kw, "head_dim": self._head_dim})
        return value


def worker_build(a) -> int:
    torch, F, peers = _peer_setup(a)
    hidden, _, heads, *_ = SIZES[a.size]
    scales = json.loads(a.head_scale_json)
    out = {}
    for name in a.only.split(","):
        fam = _load_family(F, peers, name)
        if name in ("sdar", "refusion"):
            fam.cfg_mod = _HeadDim(fam.cfg_mod, hidden // heads)
        fam.forbidden = tuple(sorted(set(fam.forbidden) | {MASK, EOS, EOT}))
        if fam.shard_size:  # keep the sharded layout, a few shards
            fam.shard_size = "16MB" if a.size == "small" else "64MB"
        folder = os.path.join(a.dir, name)
        built = fam.build(WEIGHT_SEED, scales[name])
        fam.save(built, folder)
        model = fam.reload(folder)
        ref, got = built.state_dict(), model.state_dict()
        if set(ref) != set(got) or any(not torch.equal(ref[k], got[k]) for k in ref):
            raise RuntimeError(f"{name}: weights reloaded with from_pretrained differ from the saved model")
        out[name] = {
            "class": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "head_scale": scales[name],
            "head_rows_zeroed": list(fam.forbidden),
            "files": sorted(os.listdir(folder)),
        }
    Path(a.worker_out).write_text(json.dumps(out))
    return 0


class _NetworkTimer:
    """Forwards of the peer's network (its top module: backbone and LM head) and the CPU time spent inside them."""

    def __init__(self, model):
        self.forwards, self.seconds, self._start = 0, 0.0, []
        model.register_forward_pre_hook(self._enter)
        model.register_forward_hook(self._exit)

    def reset(self):
        self.forwards, self.seconds, self._start = 0, 0.0, []

    def _enter(self, module, args):
        self.forwards += 1
        self._start.append(time.process_time())

    def _exit(self, module, args, output):
        self.seconds += time.process_time() - self._start.pop()


def _peer_call(torch, F, where, function: str, args: dict, seed, prompt: list[int]) -> dict:
    """One timed call of the peer's own function (tools/peer_fixtures' Family.run), as the fixtures make it."""
    fam, model, counter = where
    ids = torch.tensor([prompt])
    spec = F.Call(function, 0, call_args(args, function, len(prompt)), seed)
    counter.reset()
    if seed is not None:
        torch.manual_seed(seed)
    cpu, wall = time.process_time(), time.perf_counter()
    x, extra = fam.run(model, spec, ids)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "cpu": cpu,
        "wall": wall,
        "forwards": counter.forwards,
        "network_cpu": counter.seconds,
        "tokens": x[0, len(prompt) :].tolist(),
        "nfe": extra.get("nfe"),
    }


def worker_serve(a) -> int:
    """One round's peer process: load every family of the job, then time one case per request.

    Protocol: stdin lines are case indices into the job (or "quit"); each answer is one JSON line on the original
    stdout; anything else the peer code prints goes to stderr (the parent sends it to a file)."""
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    torch, F, peers = _peer_setup(a)
    job = json.loads(Path(a.job).read_text())
    prompts = job["prompts"]
    import transformers

    loaded = {}
    for family in dict.fromkeys(case[1] for case in job["cases"]):
        fam = _load_family(F, peers, family)
        model = fam.reload(os.path.join(a.dir, family))
        loaded[family] = (fam, model, _NetworkTimer(model))
    hello = {"torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads()}
    channel.write(json.dumps(hello) + "\n")
    channel.flush()
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        _name, family, function, args, seed = job["cases"][int(line)]
        with contextlib.redirect_stdout(io.StringIO()):
            _peer_call(torch, F, loaded[family], function, args, seed, prompts[0])  # warm-up, not timed
            calls = [_peer_call(torch, F, loaded[family], function, args, seed, p) for p in prompts]
        channel.write(json.dumps(calls) + "\n")
        channel.flush()
    return 0


# =========================================================================== driver (refusion's interpreter)
def _peer_command(a, worker: str, tmp: Path, extra: list[str]) -> tuple[list[str], dict]:
    cmd = [
        a.peer_python,
        str(Path(__file__).resolve()),
        "--worker",
        worker,
        "--dir",
        str(tmp / "weights"),
        "--size",
        a.size,
        "--llada",
        a.llada,
        "--fast-dllm",
        a.fast_dllm,
        "--sdar",
        a.sdar,
        "--refusion",
        a.refusion,
        *extra,
    ]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(PEER_ENV)
    return cmd, env


def build_weights(a, tmp: Path, only: list[str], scales: dict) -> dict:
    """Build and save one model per family with the peer's own class (a peer process); returns what was made."""
    out = tmp / "build.json"
    cmd, env = _peer_command(
        a, "build", tmp, ["--worker-out", str(out), "--only", ",".join(only), "--head-scale-json", json.dumps(scales)]
    )
    done = subprocess.run(cmd, env=env, cwd=str(tmp), capture_output=True, text=True, check=False)
    if done.returncode or not out.exists():
        raise SystemExit(f"building the peer models failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


class PeerSession:
    """One fresh peer process (one round): it loads the saved weights, then times the cases it is asked for."""

    def __init__(self, a, tmp: Path, round_index: int):
        cmd, env = _peer_command(a, "serve", tmp, ["--job", str(tmp / "job.json")])
        self.log = tmp / f"peer_round{round_index}.log"
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=str(tmp),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self.versions = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self._log.close()
            raise SystemExit(f"the peer process failed (exit {self.proc.returncode}):\n{self.log.read_text()[-4000:]}")
        return json.loads(line)

    def run(self, case_index: int) -> list[dict]:
        self.proc.stdin.write(f"{case_index}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait()
        self._log.close()


def refusion_case(models: dict, case, prompts: list[list[int]]) -> list[dict]:
    """refusion's timed calls of one case: the peer function's preset with the peer's own arguments."""
    import refusion
    from refusion.counters import Counters, observe
    from refusion.peers import peer_functions

    _name, family, function, args, seed = case
    preset = peer_functions()[function].preset
    rows = []
    for prompt in prompts:
        kwargs = call_args(args, function, len(prompt))
        if seed is not None:
            kwargs["seed"] = seed
        with observe(models[family], Counters(), count=False, timing=True) as clock:
            cpu, wall = time.process_time(), time.perf_counter()
            result = refusion.generate(prompt, models[family], preset=preset, **kwargs)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        rows.append(
            {
                "cpu": cpu,
                "wall": wall,
                "forwards": int(result.forwards),
                "network_cpu": clock.network_seconds,
                "tokens": [int(t) for t in result.region_tokens],
                "stopped_at_eos": bool(getattr(result, "stopped_at_eos", False)),
            }
        )
    return rows


def _common():
    """benchmarks/common.py (interleaving records, median/spread formatting, header); refusion's side only."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import common

    return common


def summarise(cases, rounds: list[tuple[dict, dict]], prompts, a, built) -> list[dict]:
    """One record per case: per-call times (median and spread over rounds), within-round ratios, counts, identity.

    Each side of a case is a ``common.Row`` whose runs are the rounds (``cpu``/``wall`` = mean seconds per call in
    that round); the refusion row's ``ratios`` are peer CPU / refusion CPU of the same round."""
    C = _common()
    records = []
    n = len(prompts)
    for name, family, function, _args, _seed in cases:
        peer_row, ours_row, wall_row = C.Row("peer"), C.Row("refusion"), C.Row("refusion wall")
        for peer, ours in rounds:
            for row, calls in ((peer_row, peer["cases"][name]), (ours_row, ours[name])):
                net = (
                    None
                    if any(r.get("network_cpu") is None for r in calls)
                    else sum(r["network_cpu"] for r in calls) / n
                )
                row.runs.append(
                    C.Run(
                        cpu=sum(r["cpu"] for r in calls) / n,
                        wall=sum(r["wall"] for r in calls) / n,
                        network_cpu=net,
                        network_forwards=sum(r["forwards"] for r in calls) / n,
                        rss_rise=0,
                        counts={"rows": [r["tokens"] for r in calls]},
                    )
                )
            ours_row.ratios.append(peer_row.runs[-1].cpu / ours_row.runs[-1].cpu)
            wall_row.ratios.append(peer_row.runs[-1].wall / ours_row.runs[-1].wall)
        peer0, ours0 = rounds[0][0]["cases"][name], rounds[0][1][name]
        same = sum(pr["tokens"] == orr["tokens"] for pr, orr in zip(peer0, ours0))
        stable = all(
            run.counts["rows"] == row.runs[0].counts["rows"] for row in (peer_row, ours_row) for run in row.runs
        )
        gen_tokens = sum(len(r["tokens"]) for r in peer0)
        peer_fwd = sum(r["forwards"] for r in peer0)
        ours_fwd = sum(r["forwards"] for r in ours0)
        forbidden = sum(t in (MASK, EOS, EOT) for r in peer0 + ours0 for t in r["tokens"])

        def ms(row, field):
            return (row.median(field) * 1e3, *(v * 1e3 for v in row.spread(field)))

        rec = {
            "case": name,
            "family": family,
            "peer_function": function,
            "size": a.size,
            "prompts": n,
            "rounds": len(rounds),
            "threads": 1,
            "device": "cpu",
            "same_weights": True,
            "head_scale": built[family]["head_scale"],
            "parameters": built[family]["parameters"],
            "gen_tokens_per_call": gen_tokens / n,
        }
        for key, row, field in (
            ("peer_cpu_ms", peer_row, "cpu"),
            ("refusion_cpu_ms", ours_row, "cpu"),
            ("peer_wall_ms", peer_row, "wall"),
            ("refusion_wall_ms", ours_row, "wall"),
        ):
            rec[key], rec[key + "_min"], rec[key + "_max"] = ms(row, field)
        for key, row in (("speedup_cpu", ours_row), ("speedup_wall", wall_row)):
            rec[key], rec[key + "_min"], rec[key + "_max"] = (
                statistics.median(row.ratios),
                min(row.ratios),
                max(row.ratios),
            )
        rec.update(
            {
                "peer_forwards_per_call": peer_fwd / n,
                "refusion_forwards_per_call": ours_fwd / n,
                "peer_tokens_per_forward": gen_tokens / peer_fwd,
                "refusion_tokens_per_forward": gen_tokens / ours_fwd,
                "identical_tokens": same,
                "tokens_stable_across_rounds": stable,
                "special_ids_generated": forbidden,
                "refusion_stopped_at_eos": sum(r["stopped_at_eos"] for r in ours0),
            }
        )
        # where the time goes: CPU inside the network per forward, and the decoder's own CPU outside it per forward
        for side, row, fwd in (("peer", peer_row, peer_fwd), ("refusion", ours_row, ours_fwd)):
            if any(run.network_cpu is None for run in row.runs):
                rec[f"{side}_network_ms_per_forward"] = rec[f"{side}_outside_ms_per_forward"] = None
                continue
            net = statistics.median(run.network_cpu for run in row.runs)
            rec[f"{side}_network_ms_per_forward"] = net * n / fwd * 1e3
            rec[f"{side}_outside_ms_per_forward"] = (row.median("cpu") - net) * n / fwd * 1e3
        rec["_rows"] = (peer_row, ours_row, wall_row)
        records.append(rec)
    return records


def _pair(record, what: str) -> str:
    got = [record[f"{side}_{what}_ms_per_forward"] for side in ("peer", "refusion")]
    return "/".join("-" if v is None else f"{v:.2f}" for v in got)


def print_table(records, a, peer_versions, wall_total) -> None:
    C = _common()
    print(
        "\n## refusion vs the peers' own decoders -- SAME weights (built by each peer's class, float32), same "
        "prompts, 1 torch thread, CPU"
    )
    print(
        f"{C.header()} (refusion side); peers: torch {peer_versions['torch']}, transformers "
        f"{peer_versions['transformers']}, {peer_versions['threads']} torch thread(s)"
    )
    print(
        f"# size {a.size} ({records[0]['parameters'] / 1e6:.1f}M parameters), {records[0]['prompts']} prompts "
        f"(16-32 tokens), gen {GEN}, {a.rounds} interleaved rounds"
    )
    print(
        "# ms/call: median over rounds of the mean per call [min-max over rounds]; speed-up = peer / refusion "
        "within each round (>1: refusion faster)"
    )
    print(
        "# net ms/fwd: CPU inside the network (backbone + LM head) per forward; outside ms/fwd: the decoder's own "
        "CPU per forward (peer/refusion, medians over rounds)"
    )
    head = (
        f"{'case':<37} {'peer CPU ms':>22} {'refusion CPU ms':>22} {'speed-up CPU':>19} {'speed-up wall':>19} "
        f"{'fwd peer/ref':>13} {'tok/fwd peer/ref':>17} {'net ms/fwd p/r':>15} {'outside ms/fwd p/r':>19} "
        f"{'same':>5}"
    )
    print(head)
    print("-" * len(head))
    for r in records:
        peer_row, ours_row, wall_row = r["_rows"]
        print(
            f"{r['case']:<37} {C.fmt_spread(peer_row, 'cpu', 1e3, 1):>22} "
            f"{C.fmt_spread(ours_row, 'cpu', 1e3, 1):>22} "
            f"{C.fmt_ratio(ours_row):>19} {C.fmt_ratio(wall_row):>19} "
            f"{r['peer_forwards_per_call']:>6.1f}/{r['refusion_forwards_per_call']:<6.1f} "
            f"{r['peer_tokens_per_forward']:>8.2f}/{r['refusion_tokens_per_forward']:<8.2f} "
            f"{_pair(r, 'network'):>15} {_pair(r, 'outside'):>19} "
            f"{r['identical_tokens']:>2}/{r['prompts']}"
        )
    print(f"# wall time of the whole run: {wall_total:.0f} s")
    for r in records:
        notes = []
        if r["identical_tokens"] != r["prompts"]:
            notes.append(f"tokens differ on {r['prompts'] - r['identical_tokens']} prompt(s)")
        if not r["tokens_stable_across_rounds"]:
            notes.append("tokens changed between rounds")
        if r["special_ids_generated"]:
            notes.append(f"{r['special_ids_generated']} mask/EOS ids generated")
        if r["refusion_stopped_at_eos"]:
            notes.append(f"refusion stopped at an EOS on {r['refusion_stopped_at_eos']} prompt(s)")
        if notes:
            print(f"! {r['case']}: " + "; ".join(notes))


def write_csv(records, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fields = [k for k in records[0] if not k.startswith("_")]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in records:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items() if k in fields})


def driver(a) -> int:
    import warnings

    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import refusion

    started = time.perf_counter()
    only = [f.strip() for f in a.only.split(",") if f.strip()]
    bad = sorted(set(only) - set(FAMILIES))
    if bad:
        raise SystemExit(f"--only: unknown families {bad}; choose from {','.join(FAMILIES)}")
    cases = [c for c in CASES if c[1] in only]
    vocab = SIZES[a.size][5]
    prompts = make_prompts(a.prompts, vocab)
    scales = dict(HEAD_SCALE)
    for part in filter(None, (a.head_scale or "").split(",")):
        k, v = part.split("=")
        scales[k.strip()] = float(v)
    with tempfile.TemporaryDirectory(prefix="refusion_peers_") as tmp:
        tmp = Path(tmp)
        (tmp / "weights").mkdir()
        t0 = time.perf_counter()
        built = build_weights(a, tmp, only, scales)
        made = ", ".join(f"{k} ({v['class']}, {v['parameters'] / 1e6:.1f}M)" for k, v in built.items())
        print(f"# built and saved {made} in {time.perf_counter() - t0:.0f} s", flush=True)
        (tmp / "job.json").write_text(json.dumps({"cases": cases, "prompts": prompts}))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            models = {f: refusion.load_model(str(tmp / "weights" / f)) for f in only}
        for case in cases:  # warm-up, not timed
            refusion_case(models, case, prompts[:1])
        rounds = []
        for r in range(a.rounds):
            t0 = time.perf_counter()
            session = PeerSession(a, tmp, r)  # a fresh peer process; its loading is not timed
            peer, ours = {"versions": session.versions, "cases": {}}, {}
            for i, case in enumerate(cases):  # the two sides of a case run back to back; who goes first rotates
                if r % 2 == 0:
                    peer["cases"][case[0]] = session.run(i)
                    ours[case[0]] = refusion_case(models, case, prompts)
                else:
                    ours[case[0]] = refusion_case(models, case, prompts)
                    peer["cases"][case[0]] = session.run(i)
            session.close()
            rounds.append((peer, ours))
            print(
                f"# round {r + 1}/{a.rounds} ({'peer' if r % 2 == 0 else 'refusion'} first in each case) "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    records = summarise(cases, rounds, prompts, a, built)
    print_table(records, a, rounds[0][0]["versions"], time.perf_counter() - started)
    if a.out:
        write_csv(records, a.out)
        print(f"# wrote {a.out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-python", help="interpreter with transformers 4.52 (runs the peers' code)")
    ap.add_argument("--llada", required=True, help="checkout of ML-GSAI/LLaDA")
    ap.add_argument("--fast-dllm", required=True, dest="fast_dllm", help="checkout of NVlabs/Fast-dLLM")
    ap.add_argument("--sdar", required=True, help="checkout of JetAstra/SDAR")
    ap.add_argument("--refusion", required=True, help="checkout of ML-GSAI/ReFusion")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--only", default=",".join(FAMILIES), help="comma-separated subset of " + ",".join(FAMILIES))
    ap.add_argument(
        "--head-scale",
        default="",
        help="override per family, e.g. 'llada=4,dream=32' (defaults: "
        + ",".join(f"{k}={v:g}" for k, v in HEAD_SCALE.items())
        + ")",
    )
    ap.add_argument("--out", default=str(HERE / "results" / "peers.csv"), help="CSV path ('' for none)")
    ap.add_argument("--worker", choices=("build", "serve"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--head-scale-json", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for k in ("llada", "fast_dllm", "sdar", "refusion"):
        setattr(a, k, os.path.abspath(getattr(a, k)))
        if not os.path.isdir(getattr(a, k)):
            ap.error(f"--{k.replace('_', '-')} {getattr(a, k)} is not a folder")
    if a.worker == "build":
        return worker_build(a)
    if a.worker == "serve":
        return worker_serve(a)
    if not a.peer_python:
        ap.error("--peer-python is required (an interpreter with transformers 4.52 that runs the peers' code)")
    if a.rounds < 1 or a.prompts < 1:
        ap.error("--rounds and --prompts must be >= 1")
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
