"""Run a server: check the options, bind the port, load the model, build the batcher and the app, serve until
stopped.

On SIGINT/SIGTERM uvicorn stops taking connections and lets live streams
finish for up to ``shutdown_timeout`` seconds; what is still running then is
cancelled and its streams end.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from refusion.config.runtime import RuntimeConfig
from refusion.serve.options import ServeDefaults, ServePolicy, check_guidance
from refusion.serve.settings import address, bind, check_server_options, model_name_of


def serve(
    model: Any = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    defaults: ServeDefaults | None = None,
    runtime: RuntimeConfig | None = None,
    max_rows: int | None = None,
    max_batch_tokens: int | None = None,
    max_queue: int | None = 256,
    engine: Any = None,
    prefix_cache: bool | None = None,
    kv_memory: int | None = None,
    retry_after: int = 1,
    shutdown_timeout: float = 30.0,
    log_level: str = "info",
    torch_threads: int | None = None,
    policy: ServePolicy | None = None,
    sock: socket.socket | None = None,
    loader: Callable[[], Any] | None = None,
) -> None:
    """Serve ``model`` (default: the shipped one; a path or a loaded adapter) over HTTP until interrupted.

    ``defaults`` are the decoding defaults of every request, ``policy`` what a
    request may send (:class:`ServePolicy`); ``runtime`` (a
    :class:`~refusion.config.runtime.RuntimeConfig`, or its fields ``engine``,
    ``max_rows``, ``max_batch_tokens``, ``prefix_cache``, ``kv_memory`` as
    keywords) says what runs the model and what the running batch may hold
    (requests wait for room; see :class:`~refusion.batcher.Batcher`), and
    ``max_queue`` bounds the queue. The options are checked
    and ``host:port`` is bound (or ``sock``, already bound, is used) before the
    model loads (``loader()``, when given, loads it instead of ``model``); bad
    values and a taken port raise :class:`ConfigError` naming them.
    """
    runtime = RuntimeConfig.of(
        runtime,
        engine=engine,
        max_rows=max_rows,
        max_batch_tokens=max_batch_tokens,
        prefix_cache=prefix_cache,
        kv_memory=kv_memory,
    )
    check_server_options(
        host=host,
        port=port,
        max_queue=max_queue,
        retry_after=retry_after,
        shutdown_timeout=shutdown_timeout,
        log_level=log_level,
        torch_threads=torch_threads,
    )
    listener = sock if sock is not None else bind(host, port)
    try:
        _run(
            model,
            loader,
            listener,
            host=host,
            port=port,
            model_name=model_name,
            defaults=defaults or ServeDefaults(),
            runtime=runtime,
            max_queue=max_queue,
            retry_after=retry_after,
            shutdown_timeout=shutdown_timeout,
            log_level=log_level,
            torch_threads=torch_threads,
            policy=policy or ServePolicy(),
        )
    finally:
        listener.close()


def _run(
    model: Any,
    loader: Callable[[], Any] | None,
    listener: socket.socket,
    *,
    host: str,
    port: int,
    model_name: str | None,
    defaults: ServeDefaults,
    runtime: RuntimeConfig,
    max_queue: int | None,
    retry_after: int,
    shutdown_timeout: float,
    log_level: str,
    torch_threads: int | None,
    policy: ServePolicy,
) -> None:
    import logging

    import uvicorn

    from refusion.api import build_decoder, load_model
    from refusion.batcher import Batcher
    from refusion.serve.app import create_app

    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    adapter = loader() if loader is not None else load_model(model)
    decoder, length = build_decoder(adapter, preset=defaults.preset, **defaults.parts, **defaults.params)
    decoder.check_model(adapter)  # a default that cannot run on the model is refused at start-up, naming those that can
    batcher = Batcher(adapter, decoder, runtime=runtime, max_queue=max_queue, gen_length=defaults.gen_length or length)
    check_guidance(batcher.decoder, batcher.engine)
    app = create_app(
        batcher,
        model_name=model_name or model_name_of(model),
        defaults=defaults,
        retry_after=retry_after,
        policy=policy,
    )
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout)
    logging.getLogger("uvicorn.error").info(
        "refusion serve: bound to http://%s; serving once the application has started (Press CTRL+C to quit)",
        address(host, listener.getsockname()[1]),
    )
    uvicorn.Server(config).run(sockets=[listener])
