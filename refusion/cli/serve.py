"""``refusion serve``: the OpenAI-compatible server.

Every flag is checked while the command line is parsed (:mod:`refusion.serve.settings` and the argparse types of
:mod:`refusion.cli.options`), so a bad ``--port`` is refused before FastAPI, torch or the model is imported.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from refusion.cli.options import (
    add_decoding_options,
    add_kv_cache_options,
    add_model_options,
    add_trust_options,
    check_decoding,
    chosen_preset,
    decoding_params,
    integer,
    load,
    number,
)
from refusion.config import PART_KINDS
from refusion.errors import ConfigError
from refusion.limits import DEFAULT_MAX_ROWS, MAX_THREADS
from refusion.serve.settings import LOG_LEVELS, check_host

#: serve()'s keywords spelled as this command's flags
FLAGS = {
    "host": "--host",
    "port": "--port",
    "max_rows": "--max-rows",
    "max_batch_tokens": "--max-batch-tokens",
    "max_queue": "--max-queue",
    "retry_after": "--retry-after",
    "shutdown_timeout": "--shutdown-timeout",
    "log_level": "--log-level",
    "torch_threads": "--threads",
    "kv_memory": "--kv-memory",
}

#: the flags that only mean something with ``--ray``
REPLICA_FLAGS = ("--replicas", "--min-replicas", "--max-replicas", "--cpus-per-replica", "--gpus-per-replica")


def host(text: str) -> str:
    """An argparse ``type``: an IP address or a well-formed host name (:func:`~refusion.serve.settings.check_host`)."""
    try:
        check_host(text, "value")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("`value` ").rstrip(".")) from None
    return text


def server_options(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """``(serve()'s keywords, the ServePolicy)`` from the flags, each checked; :class:`ConfigError` names the flag."""
    from refusion.serve.options import ServePolicy
    from refusion.serve.settings import check_server_options

    options = {
        "host": args.host,
        "port": args.port,
        "max_rows": args.max_rows,
        "max_batch_tokens": args.max_batch_tokens,
        "max_queue": args.max_queue or None,
        "retry_after": args.retry_after,
        "shutdown_timeout": args.shutdown_timeout,
        "log_level": args.log_level,
        "torch_threads": args.threads,
        "prefix_cache": args.prefix_cache,
        "kv_memory": args.kv_memory,
    }
    runtime = ("max_rows", "max_batch_tokens", "prefix_cache", "kv_memory")  # checked while parsing; RuntimeConfig's
    check_server_options(**{k: v for k, v in options.items() if k not in runtime}, names=FLAGS)
    limits = {"max_body_bytes": args.max_body_bytes} if args.max_body_bytes is not None else {}
    policy = ServePolicy(
        **limits,
        max_prompt_chars=args.max_prompt_chars,
        allow_imports=args.allow_imports,
        allow_special_tokens=args.allow_special_tokens,
    )
    return options, policy


def ray_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """``deploy()``'s Ray keywords from ``--ray`` and the replica flags, each checked; ``None`` without ``--ray``.

    :class:`ConfigError` names the flag: a replica flag without ``--ray``,
    ``--replicas`` with autoscaling bounds, ``--min-replicas`` without
    ``--max-replicas``, a count or a resource out of range.
    """
    from refusion.validators import check_integer

    given = [flag for flag in REPLICA_FLAGS if getattr(args, flag[2:].replace("-", "_")) is not None]
    if args.ray is None:
        if given:
            raise ConfigError(
                f"`{given[0]}` needs `--ray` (replicas run on Ray Serve); add `--ray` for a local Ray "
                "or `--ray ADDRESS` for a cluster.",
                param=given[0],
            )
        return None
    if not args.ray.strip():
        raise ConfigError(
            "`--ray` takes no value (a local Ray), `auto`, `host:port` or `ray://host:port`; got ''.", param="--ray"
        )
    if args.replicas is not None and (args.min_replicas is not None or args.max_replicas is not None):
        raise ConfigError(
            "`--replicas` and `--min-replicas`/`--max-replicas` exclude each other: give a fixed count "
            "or autoscaling bounds.",
            param="--replicas",
        )
    if args.min_replicas is not None and args.max_replicas is None:
        raise ConfigError("`--min-replicas` needs `--max-replicas` (the autoscaling bounds).", param="--min-replicas")
    if args.max_replicas is not None:
        low = 1 if args.min_replicas is None else args.min_replicas
        check_integer("--max-replicas", args.max_replicas, max(1, low), why="and >= --min-replicas")
        replicas: Any = (low, args.max_replicas)
    else:
        replicas = 1 if args.replicas is None else args.replicas
    cpus = 1 if args.cpus_per_replica is None else args.cpus_per_replica
    gpus = 0 if args.gpus_per_replica is None else args.gpus_per_replica
    return {"address": args.ray, "replicas": replicas, "cpus_per_replica": cpus, "gpus_per_replica": gpus}


def run_serve(args: argparse.Namespace) -> int:
    on_ray = ray_options(args)  # flag combinations, before anything heavy is imported
    try:
        from refusion.serve import ServeDefaults, serve
    except ImportError as exc:
        raise ConfigError(
            f"`refusion serve` needs the serve extra: pip install 'refusion[serve]' ({exc}).", param="serve"
        ) from exc
    options, policy = server_options(args)
    check_decoding(args)  # a bad part or parameter before the port is bound and the model loads
    params = decoding_params(args)
    parts = {kind: getattr(args, kind) for kind in PART_KINDS if getattr(args, kind) is not None}
    engine = params.pop("engine", None)
    defaults = ServeDefaults(preset=chosen_preset(args), parts=parts, params=params, gen_length=args.gen_length)
    model_name = args.served_model_name or (
        args.model.rstrip("/").rsplit("/", 1)[-1] if args.model else "refusion-default"
    )
    if on_ray is not None:
        from refusion.cli.options import model_settings
        from refusion.models.loading import load_from_options
        from refusion.serve.ray_app import serve_on_ray

        # each replica loads the model itself: the loader travels to the replicas, so it holds only the model flags
        loader = functools.partial(load_from_options, model_settings(args))
        serve_on_ray(
            None,
            loader=loader,
            model_name=model_name,
            defaults=defaults,
            engine=engine,
            policy=policy,
            **options,
            **on_ray,
        )
        return 0
    serve(
        None,
        loader=lambda: load(args),
        model_name=model_name,
        defaults=defaults,
        engine=engine,
        policy=policy,
        **options,
    )
    return 0


def add_parsers(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server on continuous batching",
        description="Serve the model over OpenAI's /v1/completions and /v1/chat/completions "
        "(streaming too), /v1/models, /health and /metrics; requests join the running batch "
        "between steps. The decoding options below are every request's defaults. "
        "See docs/serving.md.",
    )
    serve.add_argument("--host", type=host, default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=integer(1, 65535), default=8000, help="port (default 8000)")
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="the `model` clients send (default: the checkpoint folder's name, or refusion-default)",
    )
    serve.add_argument(
        "--max-rows",
        type=integer(1),
        default=DEFAULT_MAX_ROWS,
        help=f"requests decoding at once (default {DEFAULT_MAX_ROWS})",
    )
    serve.add_argument(
        "--max-batch-tokens",
        type=integer(1),
        default=None,
        help="positions (prompts plus answers) the live requests may reserve together",
    )
    serve.add_argument(
        "--max-queue",
        type=integer(0),
        default=256,
        help="waiting requests before new ones get 503 with Retry-After (default 256; 0 = unbounded)",
    )
    serve.add_argument(
        "--retry-after", type=integer(0), default=1, help="seconds in Retry-After when the queue is full"
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=number(0),
        default=30.0,
        help="seconds live streams may take to finish on shutdown before they are cut (default 30)",
    )
    serve.add_argument("--threads", type=integer(1, MAX_THREADS), default=None, help="torch threads")
    add_kv_cache_options(serve, what="requests")
    serve.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="uvicorn log level: critical, error, warning, info (default), debug or trace",
    )
    limits = serve.add_argument_group("limits and trust (see docs/serving.md)")
    limits.add_argument(
        "--max-body-bytes",
        type=integer(1),
        default=None,
        help="largest request body; larger ones get 413 (default 262144 = 256 KiB)",
    )
    limits.add_argument(
        "--max-prompt-chars",
        type=integer(1),
        default=None,
        help="longest prompt text (all chat messages together), refused before it is tokenised "
        "(default: 8 per model position)",
    )
    add_trust_options(limits, what="requests")
    ray = serve.add_argument_group("several replicas on Ray Serve (pip install 'refusion[ray]'; see docs/serving.md)")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="serve on Ray Serve: alone, a new local Ray; or `auto`, `host:port`, `ray://host:port` "
        "(a cluster). Ray Serve's proxy listens on --host/--port",
    )
    ray.add_argument(
        "--replicas", type=integer(1), default=None, help="replicas, each with its own model and generator (default 1)"
    )
    ray.add_argument(
        "--min-replicas",
        type=integer(0),
        default=None,
        help="autoscaling: the fewest replicas (default 1; 0 lets Ray scale to zero)",
    )
    ray.add_argument(
        "--max-replicas",
        type=integer(1),
        default=None,
        help="autoscaling: the most replicas (Ray adds one while replicas hold over --max-rows requests)",
    )
    ray.add_argument(
        "--cpus-per-replica", type=number(0), default=None, help="CPUs Ray reserves per replica (default 1)"
    )
    ray.add_argument(
        "--gpus-per-replica", type=number(0), default=None, help="GPUs Ray reserves per replica (default 0)"
    )
    add_model_options(serve)
    add_decoding_options(serve)
    serve.set_defaults(func=run_serve)
