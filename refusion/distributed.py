"""Data-parallel generation with torch.distributed: each rank decodes its share, results come back in order.

Start with torchrun (one process per GPU, or per CPU group with gloo)::

    torchrun --nproc_per_node 4 -m refusion.distributed --prompts prompts.txt --out results.jsonl --preset gsm8k

Rank ``r`` of ``w`` takes prompts ``r, r + w, r + 2w, ...`` and decodes them as
one batch; rank 0 writes every result, in prompt order. From Python, call
:func:`generate_distributed` inside an initialised process group. Several
nodes work the same way (``torchrun --nnodes N --node_rank i --rdzv_endpoint
HOST:PORT``). A model too large for one device is sharded instead with
``load_model(path, device_map="auto")`` (accelerate) in a single process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

import torch
import torch.distributed as dist

from refusion.errors import ConfigError


def init_from_env(backend: str | None = None) -> None:
    """Initialise the default process group from torchrun's environment, if not done yet."""
    if dist.is_initialized():
        return
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ConfigError("Not started by torchrun: RANK and WORLD_SIZE are not set; launch with `torchrun ...`.")
    chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(chosen)
    if chosen == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))


def generate_distributed(prompts: Sequence[Any], model: Any = None, **generate_kwargs: Any) -> list[Any]:
    """Decode this rank's share of ``prompts`` and gather every result, in order, on every rank.

    Each result is a plain dict (``text``, ``tokens``, ``forwards``,
    ``tokens_per_forward``, ``rank``) so that it travels between processes.
    """
    from refusion.api import generate

    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ConfigError("`prompts` must be a non-empty list of prompts.", param='prompts')
    if not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialised; call refusion.distributed.init_from_env() first.")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = list(range(rank, len(prompts), world))
    local: list[tuple[int, dict]] = []
    if mine:
        results = generate([prompts[i] for i in mine], model, **generate_kwargs)
        local = [(i, {"text": r.text, "tokens": r.tokens.tolist(), "forwards": r.forwards,
                      "tokens_per_forward": r.tokens_per_forward, "rank": rank}) for i, r in zip(mine, results)]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, local)
    ordered = sorted((pair for part in gathered for pair in part), key=lambda p: p[0])
    return [result for _, result in ordered]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refusion.distributed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", required=True, help="text file, one prompt per line")
    parser.add_argument("--out", required=True, help="JSON-lines output, written by rank 0 in prompt order")
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the shipped model)")
    parser.add_argument("--preset", default=None)
    parser.add_argument("--gen-length", type=int, default=None)
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--backend", default=None, help="gloo (CPU) or nccl (GPU); default: by device")
    args = parser.parse_args(argv)
    from refusion.api import load_model
    from refusion.config.params import parse_param

    init_from_env(args.backend)
    try:
        device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else None
        model = load_model(args.model, **({"device": device} if device else {}))
        with open(args.prompts) as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
        results = generate_distributed(prompts, model, preset=args.preset, gen_length=args.gen_length,
                                       **dict(parse_param(p) for p in args.param))
        if dist.get_rank() == 0:
            with open(args.out, "w") as f:
                for prompt, result in zip(prompts, results):
                    f.write(json.dumps({"prompt": prompt, **result}) + "\n")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
