"""``refusion train``: retrain the shipped model."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from refusion.cli.options import at_least
from refusion.errors import ConfigError


def check_output_dir(path: Any, param: str = "out") -> None:
    """Refuse an output directory that is an existing file or cannot be created (checks only, creates nothing)."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"`{param}` must be a directory path; got {path!r}.", param=param)
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"`{param}` {str(path)!r} is an existing file; name a directory (it is created if missing).", param=param)
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(f"`{param}` {str(path)!r} cannot be created: {str(existing)!r} is not a writable directory.", param=param)


def run_train(args: argparse.Namespace) -> int:
    import attrs
    import torch

    from refusion.training.trainer import TrainConfig, train

    for flag, value in (("--threads", args.threads), ("--steps", args.steps), ("--batch-size", args.batch_size)):
        if value is not None:
            at_least(flag, value, 1)
    check_output_dir(args.out, "--out")  # before 30 minutes of training, not after
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    overrides = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size)) if v is not None}
    config = attrs.evolve(TrainConfig(seed=args.seed), **overrides)
    summary = train(config, args.out, progress=not args.no_progress)
    print(json.dumps({k: summary[k] for k in ("parameters", "train_seconds", "torch_threads", "final_loss")}))
    return 0


def add_parsers(sub: Any) -> None:
    train = sub.add_parser(
        "train", help="train a small ReFusion model on the synthetic tasks (CPU)",
        description="Train the Qwen3-architecture ReFusion model that ships with refusion (defaults reproduce it).",
    )
    train.add_argument("--out", required=True, help="output directory (weights, config, tokenizer)")
    train.add_argument("--seed", type=int, default=0, help="seed of the data, masks and initial weights")
    train.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the shipped model's)")
    train.add_argument("--batch-size", type=int, default=None, help="examples per step")
    train.add_argument("--threads", type=int, default=None, help="torch threads (weights are reproducible per count)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.set_defaults(func=run_train)
