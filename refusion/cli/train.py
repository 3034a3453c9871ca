"""``refusion train``: retrain the shipped model."""

from __future__ import annotations

import argparse
import json
from typing import Any

from refusion.cli.options import integer
from refusion.files import check_output_dir
from refusion.limits import MAX_THREADS, SEED_LIMIT


def run_train(args: argparse.Namespace) -> int:
    import attrs
    import torch

    from refusion.training.trainer import TrainConfig, train

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
        "train",
        help="train a small ReFusion model on the synthetic tasks (CPU)",
        description="Train the Qwen3-architecture ReFusion model that ships with refusion (defaults reproduce it).",
    )
    train.add_argument("--out", required=True, help="output directory (weights, config, tokenizer)")
    train.add_argument(
        "--seed", type=integer(0, SEED_LIMIT - 1), default=0, help="seed of the data, masks and initial weights"
    )
    train.add_argument("--steps", type=integer(1), default=None, help="optimizer steps (default: the shipped model's)")
    train.add_argument("--batch-size", type=integer(1), default=None, help="examples per step")
    train.add_argument(
        "--threads",
        type=integer(1, MAX_THREADS),
        default=None,
        help="torch threads (weights are reproducible per count)",
    )
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.set_defaults(func=run_train)
