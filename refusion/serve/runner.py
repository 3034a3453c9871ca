"""Run a server: check the options, bind the port, load the model, build the generator and the app, serve until
stopped.

On SIGINT/SIGTERM uvicorn stops taking connections and lets live streams
finish for up to ``shutdown_timeout`` seconds; what is still running then is
cancelled and its streams end.
"""

from __future__ import annotations

import ipaddress
import math
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from refusion.errors import ConfigError
from refusion.serve.options import ServeDefaults, ServePolicy, check_guidance

#: uvicorn's log levels
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def model_name_of(model: Any) -> str:
    """The name a server uses for ``model`` by default: the checkpoint folder's name, or ``refusion-default``."""
    return Path(model).name if isinstance(model, (str, Path)) else "refusion-default"


def check_number(name: str, value: Any, low: float, high: float | None = None, *, integer: bool = True,
                 optional: bool = False, note: str = "") -> None:
    """Raise :class:`ConfigError` naming ``name`` unless ``value`` is a finite number in ``[low, high]``.

    ``integer`` asks for an int (not a bool); ``optional`` lets ``None`` (not
    set) through; ``note`` is added to the allowed values (``"0 = unbounded"``).
    """
    if optional and value is None:
        return
    kind = "an integer" if integer else "a finite number"
    finite = isinstance(value, int) or (not integer and isinstance(value, float) and math.isfinite(value))
    ok = finite and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if not ok:
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        extra = f" ({note})" if note else ""
        raise ConfigError(f"`{name}` must be {kind} {bound}{extra}; got {value!r}.", param=name)


def check_host(host: Any, name: str = "host") -> None:
    """Refuse ``host`` unless it is an IP address or a well-formed host name; the error names the address.

    Digits-and-dots and anything with a colon must parse as an IPv4 or IPv6
    address (``256.1.1.1`` does not); other names are checked for DNS syntax
    only (whether they resolve shows when the port is bound).
    """
    text = host if isinstance(host, str) else ""
    if text and (set(text) <= set("0123456789.") or ":" in text):
        try:
            ipaddress.ip_address(text.strip("[]"))
            return
        except ValueError:
            pass
    elif text and len(text) <= 253 and all(_LABEL.fullmatch(label) for label in text.rstrip(".").split(".")):
        return
    raise ConfigError(f"`{name}` {host!r} is not an IP address or a host name; give e.g. 127.0.0.1 (this machine "
                      "only), 0.0.0.0 (every interface), ::1 or localhost.", param=name)


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` as uvicorn binds (``SO_REUSEADDR``), not listening yet.

    Raises :class:`ConfigError` naming ``host:port`` when the address does not
    resolve or cannot be bound (in use, not this machine's, a privileged port).
    """
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"Cannot listen on {address(host, port)}: {reason} (choose another port or host).",
                          param="port") from None
    sock.set_inheritable(True)
    return sock


def check_server_options(*, host: Any, port: Any, max_rows: Any, max_batch_tokens: Any, max_queue: Any,
                         retry_after: Any, shutdown_timeout: Any, log_level: Any, torch_threads: Any,
                         names: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` naming the first of :func:`serve`'s options that is out of range.

    ``names`` spells an option as the caller's user knows it (the CLI's
    ``{"torch_threads": "--threads"}``); by default the keyword's name.
    """
    def name(key: str) -> str:
        return (names or {}).get(key, key)

    check_host(host, name("host"))
    check_number(name("port"), port, 1, 65535)
    check_number(name("max_rows"), max_rows, 1)
    check_number(name("max_batch_tokens"), max_batch_tokens, 1, optional=True)
    check_number(name("max_queue"), max_queue, 1, optional=True, note="None = unbounded")
    check_number(name("retry_after"), retry_after, 0, note="seconds")
    check_number(name("shutdown_timeout"), shutdown_timeout, 0, integer=False, note="seconds")
    check_number(name("torch_threads"), torch_threads, 1, optional=True)
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"`{name('log_level')}` must be one of {', '.join(LOG_LEVELS)}; got {log_level!r}.",
                          param=name("log_level"))


def serve(model: Any = None, *, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          defaults: ServeDefaults | None = None, max_rows: int = 16, max_batch_tokens: int | None = None,
          max_queue: int | None = 256, engine: Any = None, retry_after: int = 1, shutdown_timeout: float = 30.0,
          log_level: str = "info", torch_threads: int | None = None, policy: ServePolicy | None = None,
          sock: socket.socket | None = None, loader: Callable[[], Any] | None = None) -> None:
    """Serve ``model`` (default: the shipped one; a path or a loaded adapter) over HTTP until interrupted.

    ``defaults`` are the decoding defaults of every request, ``policy`` what a
    request may send (:class:`ServePolicy`); ``max_rows``,
    ``max_batch_tokens`` and ``max_queue`` bound the running batch and the
    queue (see :class:`~refusion.generator.Generator`). The options are checked
    and ``host:port`` is bound (or ``sock``, already bound, is used) before the
    model loads (``loader()``, when given, loads it instead of ``model``); bad
    values and a taken port raise :class:`ConfigError` naming them.
    """
    check_server_options(host=host, port=port, max_rows=max_rows, max_batch_tokens=max_batch_tokens,
                         max_queue=max_queue, retry_after=retry_after, shutdown_timeout=shutdown_timeout,
                         log_level=log_level, torch_threads=torch_threads)
    listener = sock if sock is not None else bind(host, port)
    try:
        _run(model, loader, listener, host=host, port=port, model_name=model_name, defaults=defaults or ServeDefaults(),
             max_rows=max_rows, max_batch_tokens=max_batch_tokens, max_queue=max_queue, engine=engine,
             retry_after=retry_after, shutdown_timeout=shutdown_timeout, log_level=log_level,
             torch_threads=torch_threads, policy=policy or ServePolicy())
    finally:
        listener.close()


def _run(model: Any, loader: Callable[[], Any] | None, listener: socket.socket, *, host: str, port: int, model_name: str | None,
         defaults: ServeDefaults, max_rows: int, max_batch_tokens: int | None, max_queue: int | None, engine: Any,
         retry_after: int, shutdown_timeout: float, log_level: str, torch_threads: int | None,
         policy: ServePolicy) -> None:
    import logging

    import uvicorn

    from refusion.api import build_decoder, load_model
    from refusion.generator import Generator
    from refusion.serve.app import create_app

    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    adapter = loader() if loader is not None else load_model(model)
    decoder, length = build_decoder(adapter, preset=defaults.preset, **defaults.parts, **defaults.params)
    decoder.check_model(adapter)  # a default that cannot run on the model is refused at start-up, naming those that can
    generator = Generator(adapter, decoder, engine=engine, max_rows=max_rows, max_tokens=max_batch_tokens,
                          max_queue=max_queue, gen_length=defaults.gen_length or length)
    check_guidance(generator.decoder, generator.engine)
    app = create_app(generator, model_name=model_name or model_name_of(model), defaults=defaults,
                     retry_after=retry_after, policy=policy)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout)
    logging.getLogger("uvicorn.error").info("refusion serve: bound to http://%s; serving once the application has "
                                            "started (Press CTRL+C to quit)", address(host, listener.getsockname()[1]))
    uvicorn.Server(config).run(sockets=[listener])
