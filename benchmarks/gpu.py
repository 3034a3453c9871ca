"""One GPU run of what issue 22 measures, in under 8 minutes on one H200; ``--smoke`` runs it tiny on the CPU.

Run:  python benchmarks/gpu.py [--json PATH] [--profile PATH] [--rounds 3] [--logit-scale 1.0] [--sections ...]
      python benchmarks/gpu.py --budget session --deadline 110 ...   (under 2 minutes: benchmarks/gpu_session.py)
      python benchmarks/gpu.py --smoke [--json PATH]      (tiny shapes on the CPU, well under a minute)

Models, built on the device with random bf16 weights (nothing is downloaded):
an 8B-shaped Qwen3 (Qwen3-8B's dimensions; ReFusion's architecture, causal)
and an 8B-shaped LLaDA (LLaDA-8B's dimensions, run as the ``llada`` family
runs it: a bidirectional ``LlamaForCausalLM``). The LM head is multiplied by
``--logit-scale``; at 1 a random model is never confident, so every preset
makes its least progress per step (the most forwards): a worst case, read
tokens per forward beside tokens/s. Prompts: random ids, 64 tokens; batches
1 and 16; 256 generated tokens, no EOS.

Sections, in this order, each with a time box (``--budget``) cut to what is
left of the run's deadline (``--deadline``, 7.5 minutes by default; printed
with its elapsed time; a section admits a run only while its estimate fits
and stops adding rounds when its box is spent, and says what it cut in the
JSON's ``notes``). The JSON is rewritten after every section, so a run
stopped from outside keeps what it measured:

* ``setup``: device, versions, model build times and parameter counts;
* ``kernels``: refusion_kernels' Triton kernels against their torch
  references (CUDA events, median of 20; agreement of tokens and values);
* ``decode``: tokens/s, forwards, tokens per forward and peak memory of the
  ``paper`` preset, the lossless ``ar`` preset and ``fast-dllm`` (Qwen3)
  against transformers ``generate``; ``fast-dllm`` and ``fast-dllm-dual``
  (LLaDA; the paper and lossless strategies need a causal model, the JSON
  says so under ``not_applicable``). Interleaved rounds, order rotating,
  median wall time with [min-max]; speed-up over the baseline taken within
  each round. Beside each: the cost model's prediction
  (:mod:`refusion.measure.costmodel`, from the shapes of the forwards the
  engine ran) in seconds and tokens/s, and measured / predicted; the JSON's
  ``anchors`` hold other systems' published figures with their hardware;
* ``profile``: one ``paper`` decode (batch 1, 32 tokens) under
  torch.profiler: device busy time against wall time, the top device and
  CPU ops, synchronising runtime calls (``--profile`` writes the tables);
* ``host_reads``: host reads per engine step and per sequence per step
  (:class:`refusion.measure.host_reads.HostReads`) and, on a GPU, the
  device's own count of synchronisations
  (:class:`refusion.measure.syncs.CudaSyncs`), 32 generated tokens,
  batches 1 and 16;
* ``compile`` (last: the longest to wait for): the ``paper`` preset on Qwen3
  (``--compile-layers``: a model of its shape with fewer layers) with the
  forward compiled (:func:`refusion.models.compiled.compile_adapter`,
  ``--compile-mode``) against the same network eager, the compiled forward
  swapped in per run; the first compiled run (32 tokens, every graph
  compiled) is timed apart with the compile statistics, and is the one step
  no box can cut short (skipped when under 15 s are left).

``--smoke``: the same code with tiny shapes on the CPU (batches 1 and 4, 16
tokens, 2 rounds); Triton runs in its interpreter (agreement only; its times
mean nothing) and compile is skipped unless ``--smoke-compile``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SECTIONS = ("setup", "kernels", "decode", "profile", "host_reads", "compile")  # compile last: the longest to wait for

#: family, hidden, layers, heads, kv heads, intermediate, vocab, mask id
FULL_SHAPES = {
    "qwen3-8b": ("qwen3", 4096, 36, 32, 8, 12288, 151936, 151670),
    "llada-8b": ("llada", 4096, 32, 32, 32, 12288, 126464, 126336),
}
SMOKE_SHAPES = {
    "qwen3-8b": ("qwen3", 64, 2, 4, 2, 128, 512, 510),
    "llada-8b": ("llada", 64, 2, 4, 4, 128, 512, 510),
}
#: presets tried on each family (the paper and lossless strategies need a causal model: refused on LLaDA, with
#: the reason in the JSON's ``not_applicable``)
PRESETS = {"qwen3": ("paper", "ar", "fast-dllm"), "llada": ("paper", "ar", "fast-dllm", "fast-dllm-dual")}
#: the full run's deadline (seconds after start, models included; imports take ~15 s more); ``--deadline`` changes it
TARGET_SECONDS = 450
#: seconds each section may take, per ``--budget``: ``full`` (the whole run under 8 minutes), ``bench`` (about 4
#: minutes: a device lease that runs only this) or ``session`` (under 2 minutes: a lease that runs the GPU test tier
#: first; benchmarks/gpu_session.py)
BUDGETS = {
    "full": {
        "setup": 30,
        "kernels": 20,
        "decode:qwen3-8b": 120,
        "decode:llada-8b": 70,
        "profile": 15,
        "host_reads": 40,
        "compile": 130,
    },
    "bench": {
        "setup": 15,
        "kernels": 12,
        "decode:qwen3-8b": 75,
        "decode:llada-8b": 30,
        "profile": 10,
        "host_reads": 15,
        "compile": 70,
    },
    "session": {
        "setup": 14,
        "kernels": 6,
        "decode:qwen3-8b": 40,
        "decode:llada-8b": 12,
        "profile": 7,
        "host_reads": 8,
        "compile": 25,
    },
}
#: with --smoke the boxes are only guards: every code path should run
SMOKE_BUDGETS = {
    "setup": 30,
    "kernels": 30,
    "decode:qwen3-8b": 30,
    "decode:llada-8b": 30,
    "profile": 30,
    "compile": 30,
    "host_reads": 30,
}
#: published throughput of other diffusion-LM servers (as issue 35 quotes them), for scale; not comparable runs
ANCHORS = [
    {"system": "SGLang", "model": "LLaDA2.0-flash", "tokens_per_second": 935, "hardware": "8x H20 (TP8)"},
    {"system": "vLLM", "model": "DiffusionGemma", "tokens_per_second": 1756, "batch": 1, "hardware": "H100, FP8"},
    {
        "system": "dInfer",
        "model": "LLaDA",
        "tokens_per_second": 1100,
        "batch": 1,
        "hardware": "not named in the quote ('over 1,100 tok/s')",
    },
    {"system": "JetEngine", "model": "SDAR", "tokens_per_second": 5000, "batch": 128, "hardware": "H200"},
]


class Box:
    """A section's time box: ``left()`` seconds remain of ``budget``; notes say what was cut."""

    def __init__(self, name: str, budget: float):
        self.name, self.budget, self.start = name, budget, time.perf_counter()
        self.notes: list[str] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed()

    def fits(self, estimate: float, what: str) -> bool:
        if estimate <= self.left():
            return True
        self.notes.append(f"skipped {what}: estimated {estimate:.1f} s, {max(0.0, self.left()):.1f} s left in the box")
        return False

    def close(self, result: dict) -> dict:
        result["seconds"] = round(self.elapsed(), 2)
        result["budget_seconds"] = self.budget
        if self.notes:
            result["notes"] = self.notes
        print(
            f"== {self.name}: {self.elapsed():.1f} s (box {self.budget} s)" + "".join(f"\n   {n}" for n in self.notes),
            flush=True,
        )
        return result


class Bench:
    """Everything one run shares: device, settings, models, the cost model's GPU."""

    def __init__(self, args: argparse.Namespace):
        import torch

        self.torch = torch
        self.smoke = args.smoke
        self.cuda = torch.cuda.is_available() and not args.smoke
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.shapes = SMOKE_SHAPES if args.smoke else FULL_SHAPES
        self.budgets = SMOKE_BUDGETS if args.smoke else BUDGETS[args.budget]
        self.batches = (1, 4) if args.smoke else (1, 16)
        self.gen = 16 if args.smoke else 256
        self.host_gen = 16 if args.smoke else 32
        self.prompt_length = 8 if args.smoke else 64
        self.rounds = args.rounds if args.rounds else (2 if args.smoke else 3)
        self.logit_scale = args.logit_scale
        self.smoke_compile = args.smoke_compile
        self.compile_mode = args.compile_mode
        self.compile_layers = args.compile_layers
        self.profile_path = args.profile
        self.models: dict[str, Any] = {}
        self.gpu, self.gpu_note = self._gpu()
        #: the whole run ends by then: a box never reaches past it (the smoke run has no deadline)
        self.deadline = time.perf_counter() + (float("inf") if args.smoke else args.deadline)

    def box(self, name: str, key: str | None = None) -> Box:
        """The time box of section ``name`` (budget ``key``), cut to what is left before the deadline."""
        return Box(name, round(min(self.budgets[key or name], self.deadline - time.perf_counter()), 1))

    def _gpu(self):
        from refusion.measure.costmodel import GPUS

        name = self.torch.cuda.get_device_name().lower() if self.cuda else ""
        for key in GPUS:
            if key in name:
                return GPUS[key], f"cost model for {key} ({name})"
        return GPUS["h200"], f"cost model for h200 (assumed; device: {name or 'cpu'})"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def timed(self, fn: Callable[[], dict]) -> tuple[float, dict]:
        """Wall seconds of ``fn()`` and its counts; on a GPU also its peak memory (``peak_gib``, every tensor
        allocated, both models' weights included) and that peak's rise over what was allocated before."""
        self.sync()
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()
            before = self.torch.cuda.memory_allocated()
        start = time.perf_counter()
        with self.torch.no_grad():
            counts = fn()
        self.sync()
        wall = time.perf_counter() - start
        if self.cuda:
            peak = self.torch.cuda.max_memory_allocated()
            counts = {**counts, "peak_gib": round(peak / 2**30, 3), "peak_rise_gib": round((peak - before) / 2**30, 3)}
        return wall, counts

    def prompts(self, name: str, batch: int) -> list[list[int]]:
        vocab, mask = self.shapes[name][6], self.shapes[name][7]
        g = self.torch.Generator().manual_seed(batch)
        ids = self.torch.randint(0, min(vocab, mask) - 1, (batch, self.prompt_length), generator=g)
        return ids.tolist()


# -- setup -------------------------------------------------------------------------------
def environment(bench: Bench) -> dict:
    """Versions and the device's properties."""
    import platform

    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch_cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"not importable: {exc}"
    if bench.cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(
            {
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count,
                "memory_gib": round(props.total_memory / 2**30, 1),
            }
        )
    return env


def build(bench: Bench, name: str, layers: int = 0):
    """``(adapter, cost-model ModelSize)`` of a random ``name``-shaped model made on the device (``layers``: that many
    layers instead of the shape's)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from refusion.measure.costmodel import ModelSize

    family, hidden, shape_layers, heads, kv, inter, vocab, mask = bench.shapes[name]
    layers = layers or shape_layers
    if family == "qwen3":
        config = Qwen3Config(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=hidden // heads,
            max_position_embeddings=40960,
            tie_word_embeddings=False,
            eos_token_id=None,
            pad_token_id=None,
            bos_token_id=None,
        )
        config.mask_token_id = mask
        cls = Qwen3ForCausalLM
    else:
        from refusion.models.families.llada import LLaDA

        published = {
            "model_type": "llada",
            "d_model": hidden,
            "n_heads": heads,
            "n_kv_heads": kv,
            "n_layers": layers,
            "mlp_hidden_size": inter,
            "vocab_size": vocab,
            "embedding_size": vocab,
            "max_sequence_length": 4096,
            "rope_theta": 500000.0,
            "mask_token_id": mask,
        }
        config = LLaDA().stock_config(published)
        from transformers import LlamaForCausalLM as cls
    with torch.device(bench.device):
        torch.manual_seed(0)
        model = cls._from_config(config, dtype=bench.dtype, attn_implementation="sdpa").eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(bench.logit_scale)
    if family == "qwen3":
        from refusion.models.hf import HFCausalLM

        adapter = HFCausalLM(model)
    else:
        from refusion.models.families.llada import LLaDA

        adapter = LLaDA().adapter(model, None, published)
        adapter.family = "llada"
    return adapter, ModelSize.from_config(model.config, name)


def setup(bench: Bench) -> dict:
    import torch
    import transformers

    box = bench.box("setup")
    result = {
        "device": torch.cuda.get_device_name() if bench.cuda else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(bench.dtype),
        "cost_model": bench.gpu_note,
        "environment": environment(bench),
        "models": {},
    }
    for name in bench.shapes:
        start = time.perf_counter()
        adapter, size = build(bench, name)
        bench.sync()
        bench.models[name] = (adapter, size)
        result["models"][name] = {
            "parameters": sum(p.numel() for p in adapter.model.parameters()),
            "shape": dict(
                zip(
                    ("family", "hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "mask_id"),
                    bench.shapes[name],
                )
            ),
            "build_seconds": round(time.perf_counter() - start, 2),
        }
        print(
            f"built {name}: {result['models'][name]['parameters'] / 1e9:.2f}B parameters in "
            f"{result['models'][name]['build_seconds']:.1f} s",
            flush=True,
        )
    return box.close(result)


# -- kernels -------------------------------------------------------------------------------
def kernel_time(bench: Bench, fn: Callable[[], Any], repeats: int) -> float | None:
    """Median milliseconds of ``fn`` (CUDA events on a GPU, wall clock otherwise) after 3 warm-up calls; ``None``
    (not timed) when ``repeats`` is 0."""
    from common import cuda_milliseconds

    if not repeats:
        return None
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if bench.cuda:
            times.append(cuda_milliseconds(fn))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def kernels(bench: Bench) -> dict:
    import torch

    box = bench.box("kernels")
    from refusion_kernels import (
        confidence,
        confidence_reference,
        lm_head_stats,
        lm_head_stats_reference,
        scatter_kv,
        scatter_kv_reference,
        triton_available,
    )

    if not triton_available():
        return box.close({"skipped": "Triton cannot run here (no CUDA device and TRITON_INTERPRET unset)"})
    interpreter = not bench.cuda
    repeats = 0 if interpreter else 20  # the interpreter's times mean nothing: agreement only
    dev, dt = bench.device, bench.dtype
    _, hidden, layers, _, kv, _, vocab, mask = bench.shapes["qwen3-8b"]
    head_dim = hidden // bench.shapes["qwen3-8b"][3]
    sizes = (4, 16) if bench.smoke else (16, 256)
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []

    def add(op: str, shape: str, triton_fn, torch_fn, agree: Callable[[], dict]) -> None:
        if not box.fits(0.0, f"{op} {shape}"):
            return
        tri, ref = kernel_time(bench, triton_fn, repeats), kernel_time(bench, torch_fn, repeats)
        row = {
            "op": op,
            "shape": shape,
            "triton_ms": tri and round(tri, 4),
            "torch_ms": ref and round(ref, 4),
            "speedup": round(ref / tri, 3) if tri and ref else None,
            **agree(),
        }
        rows.append(row)
        times = f"triton {tri:9.3f} ms  torch {ref:9.3f} ms  {row['speedup']}x" if tri else "not timed (interpreter)"
        print(
            f"{op:<14} {shape:<34} {times}  {dict((k, v) for k, v in row.items() if k.startswith(('agree', 'max')))}",
            flush=True,
        )

    for n in sizes:
        logits = torch.randn(n, vocab, device=dev, dtype=dt, generator=g) * 4

        def agree_conf(logits=logits):
            a, pa = confidence(logits, exclude=mask, backend="triton")
            b, pb = confidence_reference(logits, exclude=mask)
            return {
                "agree_tokens": float((a == b).float().mean()),
                "max_prob_diff": float((pa.float() - pb.float()).abs().max()),
            }

        add(
            "confidence",
            f"{n}x{vocab} {str(dt)[6:]}",
            lambda lg=logits: confidence(lg, exclude=mask, backend="triton"),
            lambda lg=logits: confidence_reference(lg, exclude=mask),
            agree_conf,
        )
    weight = torch.randn(vocab, hidden, device=dev, dtype=dt, generator=g) * 0.02
    for n in sizes:
        h = torch.randn(n, hidden, device=dev, dtype=dt, generator=g)

        def agree_head(h=h):
            a = lm_head_stats(h, weight, None, mask, backend="triton")
            b = lm_head_stats_reference(h, weight, None, mask)
            return {
                "agree_tokens": float((a[0] == b[0]).float().mean()),
                "max_lse_diff": float((a[2].float() - b[2].float()).abs().max()),
            }

        add(
            "lm_head_stats",
            f"{n}x{hidden} @ {vocab}x{hidden}",
            lambda h=h: lm_head_stats(h, weight, None, mask, backend="triton"),
            lambda h=h: lm_head_stats_reference(h, weight, None, mask),
            agree_head,
        )
    batch, context = bench.batches[-1], bench.prompt_length + bench.gen
    cache = torch.zeros(layers, 2, batch, kv, context, head_dim, device=dev, dtype=dt)
    for t in (batch, min(sizes[1], batch * context)):
        src = torch.randn(layers, 2, kv, t, head_dim, device=dev, dtype=dt, generator=g)
        flat = torch.randperm(batch * context, device=dev, generator=g)[:t]
        r, c = flat // context, flat % context

        def agree_scatter(src=src, r=r, c=c):
            a, b = cache.clone(), cache.clone()
            scatter_kv(a, src, r, c, backend="triton")
            scatter_kv_reference(b, src, r, c)
            return {"agree": bool(torch.equal(a, b))}

        add(
            "scatter_kv",
            f"{t} tok into {layers}L x {batch} x {context}",
            lambda src=src, r=r, c=c: scatter_kv(cache, src, r, c, backend="triton"),
            lambda src=src, r=r, c=c: scatter_kv_reference(cache, src, r, c),
            agree_scatter,
        )
    return box.close({"interpreter": interpreter, "repeats": repeats, "rows": rows})


# -- decoding ------------------------------------------------------------------------------
def refusion_run(adapter, size, decoder, prompts, gen: int, gpu) -> dict:
    """Decode ``prompts``; counts and the cost model's seconds for the forwards the engine ran."""
    from refusion.engines import open_engine
    from refusion.measure.costmodel import counted_seconds, recording

    engine = open_engine(adapter, decoder)
    with recording(engine) as counters:
        results = decoder.decode_batch(adapter, prompts, gen, engine=engine)
        return {
            "tokens": sum(len(r.tokens) for r in results),
            "forwards": counters.forwards,
            "head_passes": len(counters.head_rows or ()),
            "engine": engine.name,
            "predicted_seconds": counted_seconds(counters, size, gpu),
        }  # read before recording stops


def generate_run(adapter, size, prompts, gen: int, gpu) -> dict:
    """transformers ``generate`` (greedy, its KV cache, the mask token suppressed), its forwards counted."""
    import torch
    from common import hf_generate

    from refusion.measure.costmodel import autoregressive, estimate

    calls = [0]
    handle = adapter.model.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    try:
        rows = hf_generate(adapter.model, torch.tensor(prompts, device=adapter.device), gen, adapter.mask_token_id)
    finally:
        handle.remove()
    forwards, heads = autoregressive([len(p) for p in prompts], gen)
    return {
        "tokens": sum(len(r) for r in rows),
        "forwards": calls[0],
        "head_passes": len(heads),
        "engine": "generate",
        "predicted_seconds": estimate(forwards, heads, size, gpu),
    }


def summarise(name: str, runs: list[tuple[float, dict]], ratios: list[float]) -> dict:
    walls = [w for w, _ in runs]
    counts = runs[-1][1]
    rates = [c["tokens"] / w for w, c in runs]
    wall = statistics.median(walls)
    predicted = counts["predicted_seconds"]
    row = {
        "name": name,
        "engine": counts["engine"],
        "rounds": len(runs),
        "wall_seconds": round(wall, 4),
        "wall_spread": [round(min(walls), 4), round(max(walls), 4)],
        "tokens_per_second": round(statistics.median(rates), 2),
        "tokens_per_second_spread": [round(min(rates), 2), round(max(rates), 2)],
        "tokens": counts["tokens"],
        "forwards": counts["forwards"],
        "head_passes": counts["head_passes"],
        "tokens_per_forward": round(counts["tokens"] / max(1, counts["forwards"]), 3),
        "predicted_seconds": round(predicted, 4),
        "predicted_tokens_per_second": round(counts["tokens"] / predicted, 2) if predicted else None,
        "measured_over_predicted": round(wall / predicted, 3) if predicted else None,
    }
    peaks = [c["peak_gib"] for _, c in runs if "peak_gib" in c]
    if peaks:
        row["peak_memory_gib"] = max(peaks)
        row["peak_rise_gib"] = max(c["peak_rise_gib"] for _, c in runs)
    if ratios:
        row["speedup_vs_baseline"] = round(statistics.median(ratios), 3)
        row["speedup_spread"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return row


def growth(engine: str, batch: int, bigger: int) -> float:
    """Rough factor from a run at ``batch`` to one at ``bigger``: per-sequence engines scale with the batch."""
    return bigger / batch if engine in ("canvas", "repeat") else 4.0


def interleave(
    bench: Bench,
    box: Box,
    competitors: dict[str, Callable[[], dict]],
    baseline: str | None,
    estimates: dict[str, float],
    what: str,
) -> dict[str, dict]:
    """Rounds of every competitor, order rotating; a run whose estimate does not fit the box is skipped."""
    names, planned = [], 0.0
    for n in competitors:  # admitted in order while the first round's estimated time fits the box
        if box.fits(planned + estimates.get(n, 0.0), f"{n} {what}"):
            names.append(n)
            planned += estimates.get(n, 0.0)
    if not names:
        return {}
    runs: dict[str, list] = {n: [] for n in names}
    ratios: dict[str, list] = {n: [] for n in names}
    for r in range(bench.rounds):
        if r and not box.fits(sum(statistics.median(w for w, _ in runs[n]) for n in names), f"round {r + 1} {what}"):
            break
        order = names[r % len(names) :] + names[: r % len(names)] if names else []
        this: dict[str, float] = {}
        for n in order:
            wall, counts = bench.timed(competitors[n])
            runs[n].append((wall, counts))
            this[n] = wall
        if baseline in this:
            for n in names:
                ratios[n].append(this[baseline] / this[n])
    return {n: summarise(n, runs[n], ratios[n]) for n in names if runs[n]}


def decode(bench: Bench) -> dict:
    from refusion.config.presets import preset
    from refusion.decoding.decoder import Decoder
    from refusion.errors import ConfigError

    start = time.perf_counter()
    result: dict[str, Any] = {}
    for name, (adapter, size) in bench.models.items():
        box = bench.box(f"decode {name}", f"decode:{name}")
        family = bench.shapes[name][0]
        decoders, skipped = {}, {}
        for p in PRESETS[family]:
            try:
                decoder = Decoder.from_spec(preset(p))
                decoder.check_model(adapter)
                decoders[p] = decoder
            except ConfigError as exc:
                skipped[p] = str(exc)

        def make(prompts, gen, adapter=adapter, size=size, family=family, decoders=decoders):
            made = {}  # the baseline first: it is admitted first when the box is short
            if family == "qwen3":
                made["generate"] = lambda: generate_run(adapter, size, prompts, gen, bench.gpu)
            made.update(
                {p: (lambda d=d: refusion_run(adapter, size, d, prompts, gen, bench.gpu)) for p, d in decoders.items()}
            )
            return made

        baseline = "generate" if family == "qwen3" else next(iter(decoders), None)
        warm_gen = min(32, bench.gen)
        estimates = {}
        for n, fn in make(bench.prompts(name, 1), warm_gen).items():  # warm-up: allocator, cuBLAS, kernels
            wall, _ = bench.timed(fn)
            estimates[n] = wall * bench.gen / warm_gen
        per_batch = {}
        for batch in bench.batches:
            rows = interleave(
                bench, box, make(bench.prompts(name, batch), bench.gen), baseline, estimates, f"at batch {batch}"
            )
            per_batch[f"batch {batch}"] = rows
            for n, row in rows.items():
                estimates[n] = row["wall_seconds"] * growth(row["engine"], batch, bench.batches[-1])
                print(
                    f"{name:<9} b{batch:<3} {n:<15} {row['tokens_per_second']:>9.1f} tok/s "
                    f"[{row['tokens_per_second_spread'][0]:.1f}-{row['tokens_per_second_spread'][1]:.1f}] "
                    f"{row['forwards']:>5} fwd {row['tokens_per_forward']:>6.2f} tok/fwd  predicted "
                    f"{row['predicted_tokens_per_second']} tok/s  measured/predicted {row['measured_over_predicted']}"
                    + (f"  x{row['speedup_vs_baseline']} vs {baseline}" if "speedup_vs_baseline" in row else ""),
                    flush=True,
                )
        result[name] = box.close({"batches": per_batch, "baseline": baseline, "not_applicable": skipped})
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


# -- compile -------------------------------------------------------------------------------
def compiled(bench: Bench) -> dict:
    """The paper preset on Qwen3 with its forward compiled (:func:`refusion.models.compiled.compile_adapter`, which
    compiles in place) against the same network eager: the compiled forward is swapped in and out per run."""
    box = bench.box("compile")
    try:
        from refusion.models.compiled import compile_adapter, compile_stats, compiled_module
    except ImportError as exc:
        return box.close({"skipped": f"compile_adapter not available ({exc})"})
    if bench.smoke and not bench.smoke_compile:
        return box.close({"skipped": "in --smoke (torch.compile on the CPU takes ~30 s); --smoke-compile runs it"})
    from refusion.config.presets import preset
    from refusion.decoding.decoder import Decoder

    if box.left() < 15:
        return box.close(
            {"skipped": f"{max(0.0, box.left()):.0f} s left: the first compiled decode cannot be cut short"}
        )
    from torch._dynamo.utils import counters as dynamo_counters

    if bench.compile_layers:
        adapter, size = build(bench, "qwen3-8b", layers=bench.compile_layers)
        model = f"qwen3-8b shape with {bench.compile_layers} layers"
    else:
        adapter, size = bench.models["qwen3-8b"]
        model = "qwen3-8b"
    decoder = Decoder.from_spec(preset("paper"))
    module = compiled_module(adapter)
    start = time.perf_counter()
    compile_adapter(adapter, mode=bench.compile_mode)
    fast = module.__dict__["forward"]
    result: dict[str, Any] = {
        "preset": "paper",
        "mode": bench.compile_mode,
        "model": model,
        "compile_call_seconds": round(time.perf_counter() - start, 2),
    }

    def run(compiled_forward: bool, prompts, gen):
        if compiled_forward:
            module.forward = fast
        else:
            module.__dict__.pop("forward", None)
        return refusion_run(adapter, size, decoder, prompts, gen, bench.gpu)

    try:
        warm_gen = min(32, bench.gen)
        # compiles every graph the decode's branches need (shapes are dynamic); not bounded by the box
        warm, _ = bench.timed(lambda: run(True, bench.prompts("qwen3-8b", 1), warm_gen))
        stats = compile_stats(adapter)
        result["first_run_seconds"] = round(warm, 2)
        result["compile_stats"] = attrs_dict(stats)
        print(f"compile   first run (gen {warm_gen}, compiling) {warm:.1f} s; {result['compile_stats']}", flush=True)
        eager_warm, _ = bench.timed(lambda: run(False, bench.prompts("qwen3-8b", 1), warm_gen))
        for batch in bench.batches:
            prompts = bench.prompts("qwen3-8b", batch)
            runs = {
                "eager": lambda p=prompts: run(False, p, bench.gen),
                "compiled": lambda p=prompts: run(True, p, bench.gen),
            }
            grow = bench.gen / warm_gen * (1 if batch == 1 else growth("branch", 1, batch))
            rows = interleave(
                bench,
                box,
                runs,
                "eager",
                {"eager": eager_warm * grow, "compiled": eager_warm * grow},
                f"at batch {batch}",
            )
            result[f"batch {batch}"] = rows
            for n, row in rows.items():
                print(
                    f"compile   b{batch:<3} {n:<9} {row['tokens_per_second']:>9.1f} tok/s  {row['forwards']} fwd"
                    + (f"  x{row['speedup_vs_baseline']} vs eager" if "speedup_vs_baseline" in row else ""),
                    flush=True,
                )
        result["compile_stats_after"] = attrs_dict(compile_stats(adapter))
        result["cudagraph_counters"] = {k: v for k, v in dynamo_counters["inductor"].items() if "cudagraph" in k}
    finally:
        module.__dict__.pop("forward", None)  # the other sections run the network eagerly
    return box.close(result)


def attrs_dict(value: Any) -> Any:
    import attrs

    if value is None or not attrs.has(type(value)):
        return value
    out = attrs.asdict(value)
    for name in ("recompiles",):
        if hasattr(value, name):
            out[name] = getattr(value, name)
    return out


# -- profile -------------------------------------------------------------------------------
def profile(bench: Bench) -> dict:
    """One decode (``paper`` preset, Qwen3, batch 1, 32 tokens) under torch.profiler: where the time goes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiled

    from refusion.config.presets import preset
    from refusion.decoding.decoder import Decoder

    box = bench.box("profile")
    adapter, size = bench.models["qwen3-8b"]
    decoder = Decoder.from_spec(preset("paper"))
    prompts, gen = bench.prompts("qwen3-8b", 1), min(32, bench.gen)
    bench.timed(lambda: refusion_run(adapter, size, decoder, prompts, gen, bench.gpu))  # warm, outside the trace
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bench.cuda else [])
    with profiled(activities=activities) as trace:
        wall, counts = bench.timed(lambda: refusion_run(adapter, size, decoder, prompts, gen, bench.gpu))
    events = trace.key_averages()

    def total(event, kind: str) -> float:  # microseconds; torch renamed cuda_* to device_*
        for attr in (f"self_device_{kind}", f"self_cuda_{kind}"):
            if hasattr(event, attr):
                return float(getattr(event, attr))
        return 0.0

    device_us = sum(total(e, "time_total") for e in events)
    top = sorted(events, key=lambda e: total(e, "time_total"), reverse=True)[:12]
    runtime = {
        e.key: e.count
        for e in events
        if e.key.startswith(
            ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaLaunchKernel", "cuLaunchKernel")
        )
    }
    result = {
        "preset": "paper",
        "batch": 1,
        "gen_length": gen,
        "wall_seconds_under_profiler": round(wall, 4),
        "forwards": counts["forwards"],
        "device_busy_seconds": round(device_us / 1e6, 4),
        "device_busy_fraction": round(device_us / 1e6 / wall, 3) if wall else None,
        "runtime_calls": runtime,
        "top_device_ops": [
            {"op": e.key, "self_device_ms": round(total(e, "time_total") / 1e3, 3), "calls": e.count}
            for e in top
            if total(e, "time_total") > 0
        ],
        "top_cpu_ops": [
            {"op": e.key, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3), "calls": e.count}
            for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
        ],
    }
    print(
        f"profile   paper b1 gen {gen}: {wall:.2f} s wall under the profiler, device busy "
        f"{result['device_busy_seconds']:.2f} s ({result['device_busy_fraction']}), {counts['forwards']} forwards",
        flush=True,
    )
    if bench.profile_path:
        tables = []
        for keys in ((("self_device_time_total", "self_cuda_time_total"),) if bench.cuda else ()) + (
            ("self_cpu_time_total",),
        ):
            for key in keys:  # the first key this torch knows (it renamed cuda_* to device_*)
                try:
                    tables.append(f"## sorted by {key}\n" + events.table(sort_by=key, row_limit=30))
                    break
                except Exception:
                    continue
        bench.profile_path.write_text(
            f"# one decode: paper preset, Qwen3-8B shape, batch 1, gen {gen}; wall "
            f"{wall:.3f} s under the profiler\n\n" + "\n\n".join(tables)
        )
        result["tables"] = str(bench.profile_path)
    return box.close(result)


# -- host reads ----------------------------------------------------------------------------
def host_reads(bench: Bench) -> dict:
    from refusion.config.presets import preset
    from refusion.decoding.decoder import Decoder
    from refusion.engines import open_engine
    from refusion.errors import ConfigError
    from refusion.measure.host_reads import HostReads

    box = bench.box("host_reads")
    result: dict[str, Any] = {
        "gen_length": bench.host_gen,
        "counts": "CUDA tensors" if bench.cuda else "network-derived tensors (CPU tags)",
    }
    estimate = 0.0
    for name, (adapter, _) in bench.models.items():
        for p in PRESETS[bench.shapes[name][0]]:
            try:
                decoder = Decoder.from_spec(preset(p))
                decoder.check_model(adapter)
            except ConfigError:
                continue
            for batch in bench.batches:
                if not box.fits(estimate, f"{name} {p} batch {batch}"):
                    continue
                start = time.perf_counter()
                engine = open_engine(adapter, decoder)
                with HostReads(adapter) as reads:
                    decoder.decode_batch(adapter, bench.prompts(name, batch), bench.host_gen, engine=engine)
                bench.sync()
                seconds = time.perf_counter() - start
                estimate = seconds * (growth(engine.name, batch, bench.batches[-1]) if batch < bench.batches[-1] else 1)
                summary = reads.summary(sites=5)
                summary.pop("top_placed_sites")
                if bench.cuda:  # the device's own count of the same decode (uploads of host data included)
                    from refusion.measure.syncs import CudaSyncs

                    with CudaSyncs() as syncs:
                        decoder.decode_batch(
                            adapter, bench.prompts(name, batch), bench.host_gen, engine=open_engine(adapter, decoder)
                        )
                    summary["cuda_syncs"] = syncs.summary(sites=5)
                result[f"{name} / {p} / batch {batch}"] = summary
                synced = summary.get("cuda_syncs")
                print(
                    f"host reads {name:<9} {p:<15} b{batch:<3} {summary['steps']:>4} steps {summary['total']:>6} reads "
                    f"{summary['per_step']:>7.2f}/step {summary['per_sequence_step']:>7.3f}/seq/step "
                    f"{dict(summary['by_kind'])}"
                    + (f"; CUDA syncs {synced['per_step']:.2f}/step ({synced['total']})" if synced else ""),
                    flush=True,
                )
    return box.close(result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (tests the script)")
    parser.add_argument("--smoke-compile", action="store_true", help="with --smoke, run the compile section too")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--rounds", type=int, default=0, help="timed rounds per batch (default 3; 2 with --smoke)")
    parser.add_argument("--logit-scale", type=float, default=1.0, help="multiply the random LM head (confidence)")
    parser.add_argument(
        "--compile-mode",
        default=None,
        help="torch.compile mode for the compile section "
        "(default: inductor's default; 'reduce-overhead' captures CUDA graphs)",
    )
    parser.add_argument(
        "--compile-layers",
        type=int,
        default=0,
        help="compile section: a model of the Qwen3-8B shape with this many layers (0: the 8B model "
        "itself); inductor's compile time grows with the layers",
    )
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument(
        "--budget",
        choices=sorted(BUDGETS),
        default="full",
        help="time boxes: 'full' (8 minutes), "
        "'bench' (4 minutes, with --deadline 230) or 'session' (2 minutes, with --deadline 110)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=TARGET_SECONDS,
        help=f"seconds after the start by which every section has ended (default {TARGET_SECONDS})",
    )
    parser.add_argument("--profile", type=Path, help="write the profiler tables of one decode here (profile section)")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton loads: the kernels run in its interpreter
    os.environ.setdefault("OMP_NUM_THREADS", "1" if args.smoke else os.environ.get("OMP_NUM_THREADS", "8"))
    import torch

    if args.smoke:
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs a GPU; `--smoke` runs it with tiny shapes on the CPU")
        return 0
    started = time.perf_counter()
    bench = Bench(args)
    print(
        f"time boxes: {', '.join(f'{k} {v} s' for k, v in bench.budgets.items())}; "
        f"{sum(bench.budgets.values())} s in all",
        flush=True,
    )
    out: dict[str, Any] = {
        "smoke": args.smoke,
        "command": " ".join(["python benchmarks/gpu.py", *(argv or sys.argv[1:])]),
        "settings": {
            "batches": list(bench.batches),
            "gen_length": bench.gen,
            "prompt_length": bench.prompt_length,
            "rounds": bench.rounds,
            "logit_scale": bench.logit_scale,
            "dtype": str(bench.dtype),
            "host_reads_gen_length": bench.host_gen,
            "budget": "smoke" if args.smoke else args.budget,
            "deadline_seconds": None if args.smoke else args.deadline,
        },
        "anchors": ANCHORS,
        "sections": {},
    }
    sections = out["sections"]

    def save() -> None:  # after every section: a run stopped from outside keeps what it measured
        out["total_seconds"] = round(time.perf_counter() - started, 2)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1, default=str))

    sections["setup"] = setup(bench)  # the models every other section needs
    save()
    runners = {"kernels": kernels, "decode": decode, "profile": profile, "host_reads": host_reads, "compile": compiled}
    for name in SECTIONS[1:]:
        if name not in args.sections:
            sections[name] = {"skipped": "not in --sections"}
            continue
        try:
            sections[name] = runners[name](bench)
        except Exception as exc:  # one broken section must not lose the others' figures
            import traceback

            traceback.print_exc()
            sections[name] = {"error": f"{type(exc).__name__}: {exc}"}
        save()
    print(f"total {out['total_seconds']:.1f} s")
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
