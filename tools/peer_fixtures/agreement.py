#!/usr/bin/env python3
"""How many peer calls refusion reproduces token for token, per family, function and dtype.

Run with the project's interpreter (it imports refusion, never a peer):

    python tools/peer_fixtures/agreement.py [--fixtures tests/fixtures/peers] [--only llada,dream] [--engine repeat]
        [--show] [--json out.json]

For every call in each family's ``golden.json`` (made by the peers' own code, see
``tests/fixtures/peers/README.md``), the checkpoint is loaded with ``refusion.load_model(path, dtype=...)`` in the
call's dtype and decoded by the preset that takes the peer function's arguments; the tokens are compared with the
golden tokens as ``tests/models/test_peer_checkpoints.py`` compares them. Prints a table of ``same/total`` and,
with ``--show``, the first differing position of every call that differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def compare(got: list[int], want: list[int], stopped: bool) -> int | None:
    """First position where ``got`` differs from ``want`` (None when they agree); positions refusion left
    undecoded after an EOS block (negative ids) are not compared."""
    if len(got) != len(want):
        return min(len(got), len(want))
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b and not (stopped and a < 0):
            return i
    return None


def run_call(model, call: dict, prompt: list[int], engine: str | None = None) -> tuple[list[int], bool]:
    import torch

    import refusion
    from refusion.peers import peer_functions

    args = dict(call["args"])
    if args.get("attention_mask") == "ones_like(prompt)":
        args["attention_mask"] = torch.ones(1, len(prompt), dtype=torch.long)
    if call.get("seed") is not None:
        args["seed"] = call["seed"]
    if engine is not None:
        args["engine"] = engine
    preset = peer_functions()[call["function"]].preset
    result = refusion.generate(prompt, model, preset=preset, **args)
    return result.extra["all_tokens"], bool(result.stopped_at_eos)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures" / "peers"))
    ap.add_argument("--only", default="llada,dream,sdar,refusion")
    ap.add_argument("--show", action="store_true", help="print each differing call")
    ap.add_argument("--json", help="write the counts here")
    ap.add_argument("--engine", default=None, help="decode on this engine (default: the one refusion picks)")
    a = ap.parse_args(argv)
    import torch

    import refusion

    torch.set_num_threads(1)
    table: dict = defaultdict(lambda: [0, 0])
    for family in a.only.split(","):
        folder = Path(a.fixtures) / family
        golden = json.loads((folder / "golden.json").read_text())
        models = {}
        for call in golden["calls"]:
            dtype = call.get("dtype", "float32")
            if dtype not in models:
                models[dtype] = refusion.load_model(str(folder), dtype=dtype)
            prompt = golden["prompts"][call["prompt"]]
            got, stopped = run_call(models[dtype], call, prompt, a.engine)
            where = compare(got, call["tokens"], stopped)
            key = (family, call["function"], dtype)
            table[key][1] += 1
            table[key][0] += where is None
            if where is not None and a.show:
                print(
                    f"  differs: {family} {call['function']} {dtype} prompt {call['prompt']} {call['args']} "
                    f"at {where}:\n    got  {got}\n    want {call['tokens']}"
                )
    print(f"{'family':<9} {'function':<38} {'dtype':<9} same/total")
    for (family, function, dtype), (same, total) in sorted(table.items()):
        print(f"{family:<9} {function:<38} {dtype:<9} {same}/{total}")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                [
                    {"family": f, "function": fn, "dtype": d, "same": s, "total": t}
                    for (f, fn, d), (s, t) in sorted(table.items())
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
