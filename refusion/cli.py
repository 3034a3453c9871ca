"""The ``refusion`` command line: ``generate``, ``train`` and ``plugins``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from refusion.config import PRESETS
from refusion.errors import RefusionError


def _value(text: str) -> Any:
    """``"0.5"`` -> 0.5, ``"3"`` -> 3, ``"true"`` -> True, else the string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, _value(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refusion", description="Plan-and-infill decoding for diffusion LMs (ReFusion).")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode a prompt", description="Decode a prompt with ReFusion's algorithm.")
    gen.add_argument("prompt", nargs="+", help="prompt text (or token ids with --ids); several prompts form a batch")
    gen.add_argument("--model", default=None, help="checkpoint directory (default: the model shipped with refusion)")
    gen.add_argument("--ids", action="store_true", help="the prompt is comma-separated token ids, not text")
    gen.add_argument("--preset", default=None, choices=sorted(PRESETS),
                     help="named configuration (default: the checkpoint's refusion.json, else paper)")
    gen.add_argument("--gen-length", type=int, default=None, help="tokens to generate (rounded up to whole slots)")
    gen.add_argument("--partitioner", default=None, help="partitioner name (see `refusion plugins`)")
    gen.add_argument("--selector", default=None, help="slot selector name")
    gen.add_argument("--infiller", default=None, help="infiller name")
    gen.add_argument("--reorderer", default=None, help="cache reorderer name")
    gen.add_argument("--slot-size", type=int, default=None, help="tokens per slot (partitioner `slot_size`)")
    gen.add_argument("--serial-blocks", type=int, default=None, help="serial blocks (partitioner `serial_num_blocks`)")
    gen.add_argument("--slot-threshold", type=float, default=None, help="selector `slot_threshold` in [0, 1]")
    gen.add_argument("--token-threshold", type=float, default=None, help="infiller `token_threshold` in [0, 1]")
    gen.add_argument(
        "-p", "--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
        help="any part parameter, e.g. -p k=2 or -p selector.k=2 (repeatable)",
    )
    gen.add_argument("--chat", dest="chat", action="store_true", default=None, help="apply the tokenizer's chat template")
    gen.add_argument("--no-chat", dest="chat", action="store_false", help="feed the prompt as is")
    gen.add_argument("--device", default=None, help="torch device for the model, e.g. cuda")
    gen.add_argument("--dtype", default="auto", help="model dtype: auto, float32, bfloat16, ...")
    gen.add_argument("--mask-token-id", type=int, default=None, help="mask token id, if the checkpoint does not say")
    gen.add_argument("--eos-token-id", type=int, action="append", default=None, help="EOS id (repeatable)")
    gen.add_argument("--json", action="store_true", help="print a JSON object (text, tokens, forwards, steps)")
    gen.set_defaults(func=_generate)

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
    train.set_defaults(func=_train)

    plugins = sub.add_parser("plugins", help="list registered strategies and model adapters")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(func=_plugins)
    return parser


def _generate(args: argparse.Namespace) -> int:
    import torch

    from refusion.api import generate, load_model

    params = dict(args.param)
    for flag, key in (("slot_size", "slot_size"), ("serial_blocks", "serial_num_blocks"),
                      ("slot_threshold", "slot_threshold"), ("token_threshold", "token_threshold")):
        if getattr(args, flag) is not None:
            params[key] = getattr(args, flag)
    from refusion.errors import ConfigError

    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype, None)
    if not isinstance(dtype, (str, torch.dtype)):
        raise ConfigError(f"`--dtype` must be auto or a torch dtype name such as float32 or bfloat16; got {args.dtype!r}.")
    kwargs: dict[str, Any] = {"dtype": dtype}
    if args.device:
        kwargs["device"] = args.device
    if args.mask_token_id is not None:
        kwargs["mask_token_id"] = args.mask_token_id
    if args.eos_token_id:
        kwargs["eos_token_id"] = args.eos_token_id
    model = load_model(args.model, **kwargs)
    prompts: list[Any] = list(args.prompt)
    if args.ids:
        try:
            prompts = [[int(t) for t in p.split(",")] for p in prompts]
        except ValueError:
            raise ConfigError(f"`prompt` with --ids must be comma-separated integers; got {args.prompt!r}.") from None
    results = generate(
        prompts, model, gen_length=args.gen_length, preset=args.preset, chat=args.chat,
        partitioner=args.partitioner, selector=args.selector, infiller=args.infiller, reorderer=args.reorderer,
        **params,
    )
    for result in results:
        if args.json:
            print(json.dumps({
                "text": result.text,
                "tokens": result.tokens.tolist(),
                "forwards": result.forwards,
                "tokens_per_forward": result.tokens_per_forward,
                "iterations": len(result.steps),
                "steps": [{"block": s.block, "selected": s.selected, "committed": s.committed, "forwards": s.forwards}
                          for s in result.steps],
            }))
        else:
            print(result.text if result.text is not None else " ".join(map(str, result.tokens.tolist())))
            print(f"[{len(result.tokens)} tokens, {result.forwards} forwards, "
                  f"{result.tokens_per_forward:.2f} tokens/forward, {len(result.steps)} iterations]", file=sys.stderr)
    return 0


def _train(args: argparse.Namespace) -> int:
    import attrs
    import torch

    from refusion.training.trainer import TrainConfig, train

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size)) if v is not None}
    config = attrs.evolve(TrainConfig(seed=args.seed), **overrides)
    summary = train(config, args.out, progress=not args.no_progress)
    print(json.dumps({k: summary[k] for k in ("parameters", "train_seconds", "torch_threads", "final_loss")}))
    return 0


def _plugins(args: argparse.Namespace) -> int:
    from refusion.registry import registry

    rows = [
        {
            "kind": r.kind, "name": r.name, "class": f"{r.cls.__module__}.{r.cls.__qualname__}",
            "source": r.source, "plugin": r.plugin, "parameters": r.parameters(),
        }
        for r in registry()
    ]
    if args.json:
        print(json.dumps(rows, indent=2, default=repr))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        params = ", ".join(f"{k}={v!r}" for k, v in r["parameters"].items()) or "-"
        print(f"{r['kind']:<13} {r['name']:<{width}}  {r['source']:<12} {r['class']}  ({params})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RefusionError as exc:
        print(f"refusion: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
