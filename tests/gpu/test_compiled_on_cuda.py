"""Compiled forwards on CUDA: inductor, and CUDA graphs (``compile="reduce-overhead"``), give eager's tokens.

The decode-step shapes are the engines' own (prompt prefill, plans, one-token verification, packed batches of
several sequences). On the CPU (``REFUSION_GPU_TIER_DEVICE=cpu``) the same decodes run with dynamo's ``eager``
backend: a check of this file, not of inductor.
"""

from __future__ import annotations

import time

import pytest
import torch

from refusion.models.compiled import compile_stats
from refusion.models.loading import load_model
from tests.models.test_compiled_forward import DECODERS, PROMPTS, model, tokens

BATCH = [PROMPTS[0], PROMPTS[1], [5, 5], [7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]


def on(device, dtype=torch.float32):
    adapter = model(dtype=dtype, attn_implementation="sdpa")
    adapter.model.to(device)
    return adapter


def inductor_counters() -> dict:
    from torch._dynamo.utils import counters

    return {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_decoding_gives_eager_tokens(device, on_gpu, mode, record):
    eager = on(device)
    want = {
        (d, e): tokens(eager, e, d, BATCH if e == "branch" else BATCH[:2])
        for d in DECODERS
        for e in ("branch", "repeat")
    }
    options = {"mode": mode} if on_gpu else {"backend": "eager"}
    compiled = load_model(on(device), compile=options)
    before = inductor_counters()
    start = time.perf_counter()
    got = {
        (d, e): tokens(compiled, e, d, BATCH if e == "branch" else BATCH[:2])
        for d in DECODERS
        for e in ("branch", "repeat")
    }
    stats = compile_stats(compiled)
    record(f"{mode}_first_decodes_seconds", round(time.perf_counter() - start, 2))
    record(
        f"{mode}_compile_stats",
        {
            "calls": stats.calls,
            "compiling_calls": stats.compiling_calls,
            "graphs": stats.graphs,
            "graph_breaks": stats.graph_breaks,
            "compile_seconds": round(stats.compile_seconds, 2),
        },
    )
    skips = {k: v - before.get(k, 0) for k, v in inductor_counters().items()}
    record(f"{mode}_cudagraph_counters", skips)
    assert got == want
    assert stats.graph_breaks == 0, stats
    assert stats.compiling_calls <= 12, stats  # a graph per Python branch, not per shape
    again = {(d, "branch"): tokens(compiled, "branch", d, BATCH[1:]) for d in DECODERS}  # replays, new shapes
    assert again == {(d, "branch"): tokens(eager, "branch", d, BATCH[1:]) for d in DECODERS}
    if on_gpu and mode == "reduce-overhead":
        assert skips.get("cudagraph_skips", 0) == 0, (
            f"CUDA graphs were skipped: {skips} (TORCH_LOGS=perf_hints says why)"
        )
