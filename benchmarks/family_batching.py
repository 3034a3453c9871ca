"""Every family batches: 8 prompts of different lengths decoded one by one, then together, with the family's preset.

For each tiny checkpoint under ``tests/fixtures/peers`` (built by the authors' own classes), in the family's default
preset, as a new user would call it (``refusion.generate(prompts, model)``): the forwards of the eight prompts
decoded alone (their sum and the longest), the forwards of the batch, and CPU and wall time of both, interleaved
round by round (the goal: the batch takes at most 1.25x the longest member's forwards and at least 3x less CPU
than one by one); the tokens must be the same both ways.

    python benchmarks/family_batching.py --rounds 3 [--families llada,dream] [--dtype float32]
    python benchmarks/family_batching.py --memory --rows 32

``--memory``: one batch of ``--rows`` prompts per family (the 8 above, repeated), measuring the engine's peak
memory of keys/values (its page pool, as allocated and grown; DiffusionGemma's caches: its rows' own caches and
the batch cache the step builds) against the sum of the rows' own keys/values (prompt plus region positions times
the bytes of a token's keys and values, every layer; DiffusionGemma, whose layers differ: the most bytes each row's
own cache held), and the peak rise of the process's live heap during the
decode (keys/values plus activations).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import KVBufferPeak, PeakMemory, fmt_ratio, fmt_spread, header, interleave  # noqa: E402

FIXTURES = HERE.parent / "tests" / "fixtures" / "peers"
FAMILIES = ("refusion", "llada", "dream", "sdar", "llada2", "diffusion_gemma")
PROMPTS = ["a", "hello", "rev abc", "copy xyzw", "the quick fox", "count 1 2 3 4", "sort dcba hgfe", "a b c d e f g h"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--memory", action="store_true", help="peak memory of one batch of --rows prompts instead")
    parser.add_argument("--rows", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import refusion

    if args.memory:
        return memory(args)

    print(header())
    print(f"# 8 prompts of {min(map(len, PROMPTS))}-{max(map(len, PROMPTS))} characters, each family's preset")
    print()
    print(
        "| family | engine | forwards: 8 alone (sum) / longest alone / the batch | batch / longest | CPU s one by one "
        "| CPU s together | CPU alone / batch | wall alone / batch | same tokens |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for family in args.families.split(","):
        model = refusion.load_model(str(FIXTURES / family), dtype=args.dtype)

        def alone(model=model) -> dict:
            results = [refusion.generate(p, model) for p in PROMPTS]
            return {
                "forwards": [r.forwards for r in results],
                "rows": [r.tokens.tolist() for r in results],
                "engine": results[0].engine,
            }

        def together(model=model) -> dict:
            results = refusion.generate(PROMPTS, model)
            return {"forwards": results[0].engine_totals["forwards"], "rows": [r.tokens.tolist() for r in results]}

        rows = interleave({"one by one": alone, "together": together}, model, rounds=args.rounds, memory=False)
        one, both = rows
        each = one.counts["forwards"]
        batch = both.counts["forwards"]
        wall = statistics.median(a.wall / b.wall for a, b in zip(one.runs, both.runs))
        print(
            f"| {family} | {one.counts['engine']} | {sum(each)} / {max(each)} / {batch} | {batch / max(each):.2f}x "
            f"| {fmt_spread(one, 'cpu')} | {fmt_spread(both, 'cpu')} | {fmt_ratio(both)} | {wall:.2f}x "
            f"| {one.counts['rows'] == both.counts['rows']} |"
        )


def memory(args: argparse.Namespace) -> None:
    import refusion
    from refusion.cache.stores import bytes_per_token

    print(header())
    print(
        f"# {args.rows} prompts of {min(map(len, PROMPTS))}-{max(map(len, PROMPTS))} characters, each family's preset"
    )
    print()
    print(
        "| family | rows' own keys/values MiB | engine's keys/values peak MiB | peak / own | heap peak rise MiB "
        "| heap rise / own |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.rows)]
    for family in args.families.split(","):
        model = refusion.load_model(str(FIXTURES / family), dtype=args.dtype)
        refusion.generate(prompts[:2], model)  # warm-up: code paths, the head
        seen = _DenoiserPeak() if family == "diffusion_gemma" else None
        with PeakMemory() as heap, KVBufferPeak() as pool:
            if seen is not None:
                seen.__enter__()
            results = refusion.generate(prompts, model)
            if seen is not None:
                seen.__exit__()
        if seen is not None:  # layers differ (sliding windows, shared keys/values): each row's cache as it grew
            own, peak = sum(seen.own.values()), seen.peak
        else:
            layers, heads, dim, dtype = model.kv_shape()
            token = bytes_per_token(layers, heads, dim, dtype)
            own, peak = sum(r.prompt_length + r.partition.gen_length for r in results) * token, pool.peak
        mib = 1 << 20
        print(
            f"| {family} | {own / mib:.2f} | {peak / mib:.2f} | {peak / own:.2f}x | {heap.rise / mib:.2f} "
            f"| {heap.rise / own:.2f}x |"
        )


class _DenoiserPeak:
    """The largest bytes of keys/values the denoiser engine holds at once: every row's own cache plus the batch
    cache it builds for a step, measured after each of its forwards."""

    def __enter__(self) -> _DenoiserPeak:
        from refusion.engines.denoiser import DenoiserEngine

        self.peak, self.saved = 0, DenoiserEngine.run
        self.own: dict[int, int] = {}  # per row: the most bytes its own cache held
        probe = self

        def run(engine, calls):
            out = probe.saved(engine, calls)
            storages: dict[int, int] = {}  # every distinct storage held (a row's cache may be a view of the batch's)
            for state in calls:
                size = _cache_bytes(state.cache, storages)
                probe.own[id(state)] = max(probe.own.get(id(state), 0), size)
            if engine._batch is not None:
                _cache_bytes(engine._batch[1], storages)
            probe.peak = max(probe.peak, sum(storages.values()))
            return out

        DenoiserEngine.run = run
        return self

    def __exit__(self, *exc) -> None:
        from refusion.engines.denoiser import DenoiserEngine

        DenoiserEngine.run = self.saved


def _cache_bytes(cache, storages: dict[int, int]) -> int:
    """The bytes of ``cache``'s keys and values (as a row's own: its entries); records their storages'
    sizes in ``storages``."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
                storage = t.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return total


if __name__ == "__main__":
    main()
