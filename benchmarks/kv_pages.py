"""Keys/values of many ragged rows on pages: memory held against what the rows need, copies when rows leave.

Run:  python benchmarks/kv_pages.py [--model 20m] [--rows 32] [--shortest 16] [--longest 512] [--rounds 3]

A random Qwen3 (built in code, vocabulary 32,000, float32, no EOS) and ``--rows`` prompts of lengths spread evenly
between ``--shortest`` and ``--longest`` tokens (shuffled), each generating 8 to 64 tokens (so rows leave at
different steps), submitted together to one :class:`refusion.Generator` (the ``ar`` composition, ``max_rows`` = all
rows, no prefix cache: the figure is the live rows' own memory; issue 34). After every forward the probe reads the
pages held and the live rows' own lengths. Reported, hardware-independent: the pages held against the pages the
rows' own lengths fill (goal <= 1.1x) and against a rows x longest buffer (the layout before issue 34), at the step
where the pages held peak and at worst over all steps; the bytes of cached keys/values copied (counted by the
engine), by the rows (rows leaving included: none should be) apart from the pool's growth (a quarter at a time)
towards the budget. Timed, interleaved round by round in one process, 1 torch thread: transformers ``generate`` on
the same prompts left-padded to the longest (one batch), and the generator. Tokens are compared with ``generate``'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, header, interleave, random_qwen3

from refusion.decoding.decoder import Decoder
from refusion.generator import Generator
from refusion.models.hf import HFCausalLM


def ragged_prompts(vocab: int, rows: int, shortest: int, longest: int) -> tuple[list[list[int]], list[int]]:
    """Prompts of lengths spread evenly over ``[shortest, longest]`` (shuffled) and gen lengths of 8..64."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.linspace(shortest, longest, rows).round().long()[torch.randperm(rows, generator=g)].tolist()
    prompts = [torch.randint(0, vocab - 1, (n,), generator=g).tolist() for n in lengths]
    gens = [8 * (1 + i % 8) for i in range(rows)]
    return prompts, gens


def padded_generate(model, prompts: list[list[int]], gens: list[int], pad: int) -> list[list[int]]:
    """transformers ``generate`` on all prompts left-padded to the longest, greedy, each row cut to its own length."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max(gens),
        min_new_tokens=max(gens),
        do_sample=False,
        pad_token_id=pad,
    )
    return [out[i, width : width + g].tolist() for i, g in enumerate(gens)]


class PageProbe:
    """After every forward of the lossless loop: pages held, pages the live rows' lengths fill, rows x longest."""

    def __init__(self, engine):
        self.engine, self.samples = engine, []
        original = engine.keep_columns

        def keep_columns(states, kept):
            original(states, kept)
            self.sample(states)

        engine.keep_columns = keep_columns

    def sample(self, states) -> None:
        kv = self.engine.kv
        lengths = [state.store.table.length for state in states]
        own = sum(kv.pages_for(n) for n in lengths)
        self.samples.append((kv.pool.used, own, sum(lengths), len(lengths) * max(lengths)))


def served(adapter, decoder, prompts, gens) -> dict:
    generator = Generator(adapter, decoder, prefix_cache=False, max_rows=len(prompts))
    probe = PageProbe(generator.engine)
    requests = [generator.submit(p, gen_length=g) for p, g in zip(prompts, gens)]
    tokens = [r.wait().tokens.tolist() for r in requests]
    return {"tokens": tokens, "samples": probe.samples, "engine": generator.engine}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="20m")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--shortest", type=int, default=16)
    parser.add_argument("--longest", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = random_qwen3(args.model)
    adapter = HFCausalLM(model)
    prompts, gens = ragged_prompts(adapter.vocab_size, args.rows, args.shortest, args.longest)
    decoder = Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=8, serial_num_blocks=1)
    competitors = {
        "generate (left-padded)": lambda: {"tokens": padded_generate(model, prompts, gens, adapter.mask_token_id)},
        "refusion (pages)": lambda: served(adapter, decoder, prompts, gens),
    }
    rows = interleave(competitors, adapter, rounds=args.rounds, memory=False)
    ours = rows[1].counts
    engine = ours["engine"]
    same = sum(a == b for a, b in zip(rows[0].counts["tokens"], ours["tokens"]))
    print(header())
    print(
        f"# random {args.model} Qwen3, {args.rows} rows: prompts of {args.shortest}..{args.longest} tokens, gen 8..64, "
        f"page {engine.kv.page_size} tokens, {args.rounds} rounds; rows with generate's tokens: {same}/{args.rows}"
    )
    print("| competitor | CPU s | wall s | vs `generate` | forwards |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row.name} | {fmt_spread(row, 'cpu')} | {fmt_spread(row, 'wall')} | {fmt_ratio(row)} | "
            f"{row.runs[-1].network_forwards} |"
        )
    samples = ours["samples"]
    page_tokens = engine.kv.page_size
    peak = max(samples, key=lambda s: s[0])
    held, own, tokens, dense = peak
    worst = max(s[0] / s[1] for s in samples)
    mib = held * engine.kv.pool.page_bytes / 2**20
    print(
        f"- at the peak ({held} pages = {held * page_tokens} token slots, {mib:.1f} MiB): {held / own:.3f}x the "
        f"pages the rows' own lengths fill ({own}), {held * page_tokens / tokens:.3f}x their tokens ({tokens}); "
        f"a rows x longest buffer would hold {dense} token slots "
        f"({dense / (held * page_tokens):.2f}x the pages)"
    )
    print(f"- worst over {len(samples)} forwards: {worst:.3f}x the pages the live rows' own lengths fill")
    growth = engine.kv.pool.growth_bytes
    print(
        f"- cached keys/values copied: {(engine.counters.kv_context_bytes - growth) / 2**20:.1f} MiB by rows "
        f"(leaving included), {growth / 2**20:.1f} MiB when the pool grew (to {engine.kv.pool.capacity} pages); "
        f"new entries written: {engine.counters.kv_new_bytes / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
