"""Shared machinery of the benchmarks: random models, the two AR baselines, interleaved timing.

Rules every benchmark here follows (the machines are shared, absolute times swing):

* competitors run **interleaved**, round by round, in one process (their
  order rotates every round), after a warm-up round;
* each run reports CPU time (``time.process_time``) and wall time; a row's
  figure is the **median over rounds**, with the spread (min-max) beside it;
* a ratio to a baseline is taken **within each round** (baseline and method
  measured minutes apart at most), then the median of those ratios;
* 1 torch thread unless asked otherwise;
* hardware-independent counts come with every row: forwards, tokens fed per
  forward, tokens generated per forward, bytes of keys/values copied, peak
  memory rise (live C-heap bytes), and the time spent outside the network per sequence
  and forward.
"""

from __future__ import annotations

import ctypes
import gc
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import torch

from refusion.counters import Counters, observe

# -- models -------------------------------------------------------------------------
SIZES = {
    # name: (hidden, layers, heads, kv heads, intermediate factor, vocab)
    "20m": (256, 8, 8, 4, 3, 32000),
    "100m": (640, 12, 10, 5, 3, 32000),
}


def random_qwen3(size: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, max_positions: int = 4096):
    """A randomly initialised Qwen3 causal LM of about ``size`` parameters (``"20m"`` or ``"100m"``), no EOS."""
    from refusion.models.tiny import tiny_qwen3

    hidden, layers, heads, kv, factor, vocab = SIZES[size]
    return tiny_qwen3(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=factor * hidden,
        max_positions=max_positions,
        seed=seed,
        dtype=dtype,
    )


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- the AR baselines -------------------------------------------------------------------
def hf_generate(
    model, prompts: torch.Tensor, new_tokens: int, mask_id: int | None = None, eos: list[int] | None = None
) -> list[list[int]]:
    """transformers ``generate``: greedy, its KV cache, exactly ``new_tokens`` per row unless ``eos`` stops it."""
    kwargs = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0 if mask_id is None else mask_id)
    if eos:
        kwargs["eos_token_id"] = eos
    else:
        kwargs["min_new_tokens"] = new_tokens
    if mask_id is not None:
        kwargs["suppress_tokens"] = [mask_id]
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), **kwargs)
    return out[:, prompts.shape[1] :].tolist()


def greedy_loop(
    model, prompts: torch.Tensor, new_tokens: int, mask_id: int | None = None, eos: list[int] | None = None
) -> list[list[int]]:
    """A hand-written greedy loop with a ``DynamicCache``: the least a Python AR decoder can do per token."""
    from transformers import DynamicCache

    from refusion.models.hf import cache_keyword

    cache = DynamicCache(config=model.config)
    keyword = cache_keyword(model.forward) or "cache"
    logits = model(input_ids=prompts, **{keyword: cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
    rows = []
    done = torch.zeros(prompts.shape[0], dtype=torch.bool)
    eos_t = torch.tensor(eos or [], dtype=torch.long)
    for _ in range(new_tokens):
        if mask_id is not None:
            logits[:, mask_id] = float("-inf")
        token = logits.argmax(-1)
        rows.append(token)
        if eos:
            done |= torch.isin(token, eos_t)
            if bool(done.all()):
                break
        logits = model(input_ids=token[:, None], **{keyword: cache}, use_cache=True).logits[:, -1]
    out = torch.stack(rows, 1).tolist()
    if eos:
        out = [_cut(row, set(eos)) for row in out]
    return out


def _cut(row: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(row):
        if t in eos:
            return row[: i + 1]
    return row


# -- measuring ---------------------------------------------------------------------------
class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _heap_reader() -> Callable[[], int] | None:
    """Bytes the C heap holds for live allocations (glibc ``mallinfo2``: in-use arena + mmapped blocks), if
    available."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2

    def read() -> int:
        info = mallinfo2()
        return info.uordblks + info.hblkhd

    return read


_read_heap = _heap_reader()


class PeakMemory:
    """Peak memory rise during a block, sampled every millisecond.

    ``rise`` is the peak of the C heap's live bytes (glibc ``mallinfo2``) above
    its level at entry: tensors freed by an earlier competitor do not hide a
    later one's allocations, as they do for the resident set size. Where
    ``mallinfo2`` is missing it falls back to the resident set size
    (``/proc/self/statm``), which only shows growth past the earlier peak.
    """

    def __init__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.rise = 0
        self._stop = threading.Event()

    def _read(self) -> int:
        if _read_heap is not None:
            return _read_heap()
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.rise = max(self.rise, self._read() - self.base)
            time.sleep(0.001)

    def __enter__(self) -> PeakMemory:
        gc.collect()
        self.base = self._read()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.rise = max(self.rise, self._read() - self.base)


class KVBufferPeak:
    """Largest memory of keys/values the engines allocated while active (bytes): the ``branch`` engine's page pool
    (``PagePool.data``, as created and grown)."""

    def __init__(self):
        self.peak = 0
        self._saved: list[tuple[str, Any]] = []

    def __enter__(self) -> KVBufferPeak:
        from refusion.cache.pages import PagePool

        probe = self

        def note(pool) -> None:
            probe.peak = max(probe.peak, pool.data.numel() * pool.data.element_size())

        for name in ("__init__", "_grow"):
            original = getattr(PagePool, name)
            self._saved.append((name, original))

            def wrapped(pool, *args, _original=original, **kwargs):
                _original(pool, *args, **kwargs)
                note(pool)

            setattr(PagePool, name, wrapped)
        return self

    def __exit__(self, *exc) -> None:
        from refusion.cache.pages import PagePool

        for name, original in self._saved:
            setattr(PagePool, name, original)


@attrs.define
class Run:
    """One timed run of one competitor."""

    cpu: float
    wall: float
    network_cpu: float
    network_forwards: int
    rss_rise: int
    counts: dict[str, Any]
    kv_buffer: int = 0


@attrs.define
class Row:
    """A competitor's runs over all rounds, and its per-round ratios to the baseline."""

    name: str
    runs: list[Run] = attrs.field(factory=list)
    ratios: list[float] = attrs.field(factory=list)

    def median(self, field: str) -> float:
        return statistics.median(getattr(r, field) for r in self.runs)

    def spread(self, field: str) -> tuple[float, float]:
        values = [getattr(r, field) for r in self.runs]
        return min(values), max(values)

    @property
    def counts(self) -> dict[str, Any]:
        return self.runs[-1].counts


def interleave(
    competitors: dict[str, Callable[[], dict]],
    model: Any,
    *,
    rounds: int = 3,
    baseline: str | None = None,
    warmup: bool = True,
    memory: bool = True,
) -> list[Row]:
    """Run every competitor once per round, rotating their order; ratios are ``baseline cpu / method cpu``.

    Each callable decodes and returns its counts (``tokens``, ``forwards`` ...). ``model`` is the adapter (its
    lazy LM head is timed with the network) or the transformers model.
    """
    names = list(competitors)
    baseline = baseline or names[0]
    rows = {name: Row(name) for name in names}
    if warmup:
        for fn in competitors.values():
            fn()
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        this_round = {}
        for name in order:
            gc.collect()
            network = observe(model, Counters(), timing=True)  # forwards and CPU time inside the network
            rss = PeakMemory() if memory else None
            with torch.no_grad(), network as clock, KVBufferPeak() as kv:
                if rss:
                    rss.__enter__()
                cpu0, wall0 = time.process_time(), time.perf_counter()
                counts = competitors[name]()
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                if rss:
                    rss.__exit__()
            run = Run(cpu, wall, clock.network_seconds, clock.forwards, rss.rise if rss else 0, counts, kv.peak)
            rows[name].runs.append(run)
            this_round[name] = run
        for name in names:
            rows[name].ratios.append(this_round[baseline].cpu / this_round[name].cpu)
    return [rows[n] for n in names]


def fmt_spread(row: Row, field: str, scale: float = 1.0, digits: int = 2) -> str:
    lo, hi = row.spread(field)
    return f"{row.median(field) * scale:.{digits}f} [{lo * scale:.{digits}f}-{hi * scale:.{digits}f}]"


def fmt_ratio(row: Row) -> str:
    return f"{statistics.median(row.ratios):.2f}x [{min(row.ratios):.2f}-{max(row.ratios):.2f}]"


def header() -> str:
    import platform

    import transformers

    return (
        f"# torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} torch "
        f"thread(s), {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    )


def refusion_counts(results: list[Any]) -> dict[str, Any]:
    """Counts of one ``decode_batch``: tokens, network forwards, fed tokens, KV bytes (engine totals)."""
    totals = results[0].engine_totals
    return {
        "tokens": sum(len(r.tokens) for r in results),
        "forwards": totals["forwards"],
        "fed": totals["fed_tokens"],
        "padded": totals["padded_tokens"],
        "kv_context": totals["kv_bytes"]["context"],
        "kv_new": totals["kv_bytes"]["new"],
        "rows": [r.tokens.tolist() for r in results],
    }


def ar_counts(rows: list[list[int]], forwards: int, fed: int) -> dict[str, Any]:
    return {
        "tokens": sum(len(r) for r in rows),
        "forwards": forwards,
        "fed": fed,
        "padded": 0,
        "kv_context": None,
        "kv_new": None,
        "rows": rows,
    }


def cuda_milliseconds(fn: Callable[[], Any]) -> float:
    """One call of ``fn`` timed with CUDA events (milliseconds, the device's own clock)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)
