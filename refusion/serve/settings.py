"""A server's network and queue settings, checked before anything heavy is imported or loaded.

:func:`check_server_options` refuses a bad value naming the option;
:func:`bind` binds the port before the model loads, so a taken port is one
line at once. Nothing here imports torch, FastAPI or the model code: the
command line checks its flags with these first.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from refusion.errors import ConfigError
from refusion.limits import MAX_THREADS
from refusion.validators import check_integer, check_number

#: uvicorn's log levels
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def model_name_of(model: Any) -> str:
    """The name a server uses for ``model`` by default: the checkpoint folder's name, or ``refusion-default``."""
    return Path(model).name if isinstance(model, (str, Path)) else "refusion-default"


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
    raise ConfigError(
        f"`{name}` {host!r} is not an IP address or a host name; give e.g. 127.0.0.1 (this machine "
        "only), 0.0.0.0 (every interface), ::1 or localhost.",
        param=name,
    )


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` as uvicorn binds (``SO_REUSEADDR``), not listening yet.

    Raises :class:`ConfigError` naming ``host:port`` when the address does not
    resolve or cannot be bound (in use, not this machine's, a privileged port).
    """
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"Cannot listen on {address(host, port)}: {reason} (choose another port or host).", param="port"
        ) from None
    sock.set_inheritable(True)
    return sock


def check_server_options(
    *,
    host: Any,
    port: Any,
    max_queue: Any,
    retry_after: Any,
    shutdown_timeout: Any,
    log_level: Any,
    torch_threads: Any,
    names: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`ConfigError` naming the first of :func:`serve`'s own options that is out of range (the
    runtime's are :class:`~refusion.config.runtime.RuntimeConfig`'s to check).

    ``names`` spells an option as the caller's user knows it (the CLI's
    ``{"torch_threads": "--threads"}``); by default the keyword's name.
    """

    def name(key: str) -> str:
        return (names or {}).get(key, key)

    check_host(host, name("host"))
    check_integer(name("port"), port, 1, 65535)
    if max_queue is not None:
        check_integer(name("max_queue"), max_queue, 1, why="None = unbounded")
    check_integer(name("retry_after"), retry_after, 0, why="seconds")
    check_number(name("shutdown_timeout"), shutdown_timeout, 0, why="seconds")
    if torch_threads is not None:
        check_integer(name("torch_threads"), torch_threads, 1, MAX_THREADS)
    if log_level not in LOG_LEVELS:
        raise ConfigError(
            f"`{name('log_level')}` must be one of {', '.join(LOG_LEVELS)}; got {log_level!r}.", param=name("log_level")
        )
