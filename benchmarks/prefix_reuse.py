"""Requests sharing a long system prompt, with and without prefix reuse across requests (issue 34).

Run:  python benchmarks/prefix_reuse.py [--model 20m] [--system 512] [--question 16] [--requests 32] [--gen 32]
                                       [--rounds 3]

A random Qwen3 (built in code, vocabulary 32,000, float32, no EOS) and ``--requests`` prompts made of one
``--system``-token system prompt and a distinct ``--question``-token question each. The first request is decoded
alone (it publishes the system prompt's pages), then the others are submitted together to one
:class:`refusion.Generator` (the ``ar`` composition: ``leftmost`` + ``greedy-verify``, slot 8, whose tokens are
``generate``'s). Competitors, interleaved round by round in one process, 1 torch thread: transformers ``generate``
and the hand-written greedy loop on all prompts as one batch (equal lengths, no padding), and the generator with
``prefix_cache=False`` (every prompt computed, as before issue 34) and ``prefix_cache=True``, and the latter with all
requests submitted at once (the first encodes the shared pages, the others wait a step for them). Reported: CPU and wall
seconds (median [min-max]), the ratio to ``generate`` in the same round, forwards, and for requests 2..N the prompt
tokens computed: from the tokens each request fed the model (``DecodeResult.fed_tokens``), independently of the
cache's own hit counter (printed beside it). Tokens are checked identical across all competitors.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt_ratio, fmt_spread, greedy_loop, header, hf_generate, interleave, random_qwen3

from refusion.decoding.decoder import Decoder
from refusion.generator import Generator
from refusion.models.hf import HFCausalLM

SLOT, BLOCK = 8, 32


def prompts_sharing_a_system_prompt(vocab: int, system: int, question: int, requests: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    head = torch.randint(0, vocab - 1, (1, system), generator=g).expand(requests, system)
    return torch.cat([head, torch.randint(0, vocab - 1, (requests, question), generator=g)], 1)


def served(adapter, decoder: Decoder, prompts: list[list[int]], gen: int, reuse: bool, together: bool = False) -> dict:
    """The first request alone, then the rest together (``together``: all at once), on one generator; tokens and
    what each request fed."""
    generator = Generator(adapter, decoder, prefix_cache=reuse, max_rows=len(prompts), gen_length=gen)
    if together:
        first, *rest = [r.wait() for r in [generator.submit(p) for p in prompts]]
    else:
        first = generator.submit(prompts[0]).wait()
        rest = [r.wait() for r in [generator.submit(p) for p in prompts[1:]]]
    stats = generator.engine.prefixes.stats if reuse else None
    return {
        "tokens": [r.tokens.tolist() for r in [first, *rest]],
        "fed_rest": sum(r.fed_tokens for r in rest),
        "hits": stats.hits if stats else 0,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="20m")
    parser.add_argument("--system", type=int, default=512)
    parser.add_argument("--question", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = random_qwen3(args.model)
    adapter = HFCausalLM(model)
    prompts = prompts_sharing_a_system_prompt(adapter.vocab_size, args.system, args.question, args.requests)
    lists = prompts.tolist()
    decoder = Decoder.from_names(
        selector="leftmost", infiller="greedy-verify", slot_size=SLOT, serial_num_blocks=max(1, args.gen // BLOCK)
    )
    mask = adapter.mask_token_id
    competitors = {
        "generate": lambda: {"tokens": hf_generate(model, prompts, args.gen, mask)},
        "hand loop": lambda: {"tokens": greedy_loop(model, prompts, args.gen, mask)},
        "refusion, no prefix reuse": lambda: served(adapter, decoder, lists, args.gen, False),
        "refusion, prefix reuse": lambda: served(adapter, decoder, lists, args.gen, True),
        "refusion, prefix reuse, all submitted at once": lambda: served(adapter, decoder, lists, args.gen, True, True),
    }
    rows = interleave(competitors, adapter, rounds=args.rounds, memory=False)
    expected = [t[: args.gen] for t in rows[0].counts["tokens"]]
    same = all(row.counts["tokens"] == expected for row in rows)
    print(header())
    print(
        f"# random {args.model} Qwen3, {args.requests} requests: a {args.system}-token system prompt + a "
        f"{args.question}-token question each, gen {args.gen}, {args.rounds} rounds; same tokens: {same}"
    )
    print("| competitor | CPU s | wall s | vs `generate` | forwards | prompt tokens computed, requests 2..N |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    off, on = rows[2].counts, rows[3].counts
    prompt_tokens = (args.requests - 1) * prompts.shape[1]
    computed = {row.name: prompt_tokens - (off["fed_rest"] - row.counts["fed_rest"]) for row in rows[2:]}
    for row in rows:
        done = computed.get(row.name)
        share = f"{done} ({done / prompt_tokens:.1%})" if done is not None else "-"
        print(
            f"| {row.name} | {fmt_spread(row, 'cpu')} | {fmt_spread(row, 'wall')} | {fmt_ratio(row)} | "
            f"{row.runs[-1].network_forwards} | {share} |"
        )
    gain = statistics.median(a.cpu / b.cpu for a, b in zip(rows[2].runs, rows[3].runs))
    print(f"- prefix reuse against none, same rounds: {gain:.2f}x CPU")
    print(
        f"- the prefix cache's own count of tokens found: {on['hits']} "
        f"(not computed: {off['fed_rest'] - on['fed_rest']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
