"""Run a server: load the model, build the generator and the app, serve them with uvicorn until stopped.

On SIGINT/SIGTERM uvicorn stops taking connections and lets live streams
finish for up to ``shutdown_timeout`` seconds; what is still running then is
cancelled and its streams end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from refusion.serve.options import ServeDefaults


def model_name_of(model: Any) -> str:
    """The name a server uses for ``model`` by default: the checkpoint folder's name, or ``refusion-default``."""
    return Path(model).name if isinstance(model, (str, Path)) else "refusion-default"


def serve(model: Any = None, *, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          defaults: ServeDefaults | None = None, max_rows: int = 16, max_batch_tokens: int | None = None,
          max_queue: int | None = 256, engine: Any = None, retry_after: int = 1, shutdown_timeout: float = 30.0,
          log_level: str = "info", torch_threads: int | None = None) -> None:
    """Serve ``model`` (default: the shipped one; a path or a loaded adapter) over HTTP until interrupted.

    ``defaults`` are the decoding defaults of every request; ``max_rows``,
    ``max_batch_tokens`` and ``max_queue`` bound the running batch and the
    queue (see :class:`~refusion.generator.Generator`).
    """
    import uvicorn

    from refusion.api import build_decoder, load_model
    from refusion.generator import Generator
    from refusion.serve.app import create_app

    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    defaults = defaults or ServeDefaults()
    adapter = load_model(model)
    decoder, length = build_decoder(adapter, preset=defaults.preset, **defaults.parts, **defaults.params)
    generator = Generator(adapter, decoder, engine=engine, max_rows=max_rows, max_tokens=max_batch_tokens,
                          max_queue=max_queue, gen_length=defaults.gen_length or length)
    app = create_app(generator, model_name=model_name or model_name_of(model), defaults=defaults,
                     retry_after=retry_after)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout)
    uvicorn.Server(config).run()
