"""``refusion serve --ray``: the OpenAI-compatible app as a Ray Serve deployment, on several replicas.

Each replica is a Ray actor whose constructor loads the model once and
builds its own :class:`~refusion.batcher.Batcher` and
:func:`~refusion.serve.app.create_app`'s FastAPI app, served through Ray
Serve's ASGI ingress (``@serve.ingress``); the batcher's thread starts and
stops with the app's lifespan, which Ray Serve runs in the replica. Ray
Serve's proxy is the one HTTP entry point on ``host:port`` and routes every
request (``/metrics`` too) to one replica. A fixed number of replicas, or
autoscaling bounds ``(min, max)``: Ray adds a replica while replicas hold
more than ``max_rows`` requests each and removes one when they idle.

Needs ``pip install "refusion[ray]"``; without Ray :func:`deploy` raises a
one-line :class:`ConfigError` saying so. Everything else (decoding defaults,
limits, trust) is as :func:`refusion.serve.serve`.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import attrs

from refusion.config.runtime import RuntimeConfig
from refusion.errors import ConfigError, RefusionError
from refusion.serve.options import ServeDefaults, ServePolicy
from refusion.serve.settings import address as host_port
from refusion.serve.settings import bind, check_server_options, model_name_of
from refusion.validators import check_integer, check_number

#: what to install when Ray is missing
RAY_HINT = 'pip install "refusion[ray]"'
#: the Ray Serve application's and deployment's name
APP_NAME = "refusion"
#: uvicorn's log levels as Python logging's (Ray Serve's)
RAY_LOG_LEVELS = {
    "critical": "CRITICAL",
    "error": "ERROR",
    "warning": "WARNING",
    "info": "INFO",
    "debug": "DEBUG",
    "trace": "DEBUG",
}
#: requests a replica takes at once beyond ``max_rows`` when its queue is unbounded
UNBOUNDED_QUEUE = 4096
#: replica starts that may fail before the deployment fails (where Ray Serve has ``max_constructor_retry_count``)
CONSTRUCTOR_TRIES = 2


def import_serve() -> Any:
    """``ray.serve``, or a one-line :class:`ConfigError` telling to install the extra."""
    try:
        from ray import serve
    except ImportError as exc:
        raise ConfigError(f"Serving on Ray needs Ray Serve: {RAY_HINT} ({exc}).", param="ray") from None
    return serve


def check_replicas(replicas: Any, name: str = "replicas") -> None:
    """Refuse ``replicas`` unless it is an int >= 1 or autoscaling bounds ``(min, max)``, 0 <= min <= max, max >= 1."""
    if isinstance(replicas, tuple):
        if len(replicas) != 2:
            raise ConfigError(
                f"`{name}` must be an integer >= 1 or autoscaling bounds (min, max); got {replicas!r}.", param=name
            )
        low, high = replicas
        check_integer(f"{name} (min)", low, 0)
        check_integer(f"{name} (max)", high, max(1, low), why="and >= min")
        return
    check_integer(name, replicas, 1, why="or autoscaling bounds (min, max)")


@attrs.frozen
class ReplicaSettings:
    """What every replica builds its app from; pickled to the replicas, so ``loader`` must pickle (cloudpickle)."""

    model: Any
    loader: Callable[[], Any] | None
    model_name: str
    defaults: ServeDefaults
    policy: ServePolicy
    runtime: RuntimeConfig
    max_queue: int | None
    retry_after: int
    torch_threads: int | None


def build_app(settings: ReplicaSettings) -> Any:
    """In a replica: load the model, build the batcher (not started) and the FastAPI app that starts it."""
    from refusion.api import build_decoder, load_model
    from refusion.batcher import Batcher
    from refusion.serve.app import create_app
    from refusion.serve.options import check_guidance

    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    adapter = settings.loader() if settings.loader is not None else load_model(settings.model)
    defaults = settings.defaults
    decoder, length = build_decoder(adapter, preset=defaults.preset, **defaults.parts, **defaults.params)
    decoder.check_model(adapter)  # a default that cannot run on the model is refused at start-up
    batcher = Batcher(
        adapter,
        decoder,
        runtime=settings.runtime,
        max_queue=settings.max_queue,
        gen_length=defaults.gen_length or length,
    )
    check_guidance(batcher.decoder, batcher.engine)
    return create_app(
        batcher,
        model_name=settings.model_name,
        defaults=defaults,
        retry_after=settings.retry_after,
        policy=settings.policy,
    )


#: the app this process's replica built in its constructor, for its ingress app to serve (Ray Serve runs every
#: replica in a process of its own)
_BUILT: dict[str, Any] = {}


def start_replica(settings: ReplicaSettings) -> None:
    """In a replica's constructor: :func:`build_app`, kept for this process's :class:`ReplicaApp`."""
    _BUILT[APP_NAME] = build_app(settings)


class ReplicaApp:
    """The ingress app Ray Serve hands every request and the lifespan of a replica: the app the replica's constructor
    built (:func:`build_app`), which starts its batcher when the lifespan starts and closes it when it ends."""

    def __init__(self) -> None:
        self.app: Any = None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if self.app is None:
            self.app = _BUILT.pop(APP_NAME)
        await self.app(scope, receive, send)

    def healthy(self) -> bool:
        """Whether the batcher's thread runs (or the app has not started yet)."""
        if self.app is None:
            return True
        batcher = self.app.state.server.batcher
        return batcher.running or batcher.closing


def deployment(
    *,
    replicas: int | tuple[int, int],
    max_rows: int,
    max_queue: int | None,
    shutdown_timeout: float,
    log_level: str,
    cpus_per_replica: float,
    gpus_per_replica: float,
) -> Any:
    """The Ray Serve deployment (bind it to :class:`ReplicaSettings`), with its replicas and resources."""
    import inspect

    serve = import_serve()

    @serve.ingress(ReplicaApp())
    class Refusion:
        """One replica: refusion's app on a model and batcher of its own, built when the replica starts."""

        def __init__(self, settings: ReplicaSettings):
            start_replica(settings)

        def check_health(self) -> None:
            app = getattr(self, "app", None)  # Ray Serve's ASGI wrapper exposes the ingress app as ``app``
            if isinstance(app, ReplicaApp) and not app.healthy():
                raise RuntimeError("the batcher's thread has stopped")

    queue = max_queue if max_queue is not None else UNBOUNDED_QUEUE
    options: dict[str, Any] = {
        "name": APP_NAME,
        "max_ongoing_requests": max_rows + queue,
        "graceful_shutdown_timeout_s": shutdown_timeout,
        "ray_actor_options": {"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        "logging_config": {"log_level": RAY_LOG_LEVELS[log_level]},
    }
    if "max_constructor_retry_count" in inspect.signature(serve.deployment).parameters:
        options["max_constructor_retry_count"] = CONSTRUCTOR_TRIES
    if isinstance(replicas, tuple):
        options["autoscaling_config"] = {
            "min_replicas": replicas[0],
            "max_replicas": replicas[1],
            "initial_replicas": max(1, replicas[0]),
            "target_ongoing_requests": max_rows,
        }
    else:
        options["num_replicas"] = replicas
    return serve.deployment(Refusion).options(**options)


@attrs.define
class RayServer:
    """A running deployment: ``url`` is Ray Serve's HTTP entry point."""

    url: str
    owns_ray: bool  # this process connected to Ray (so :meth:`stop` disconnects)

    def replicas(self) -> dict[str, int]:
        """The deployment's replicas by state, as Ray Serve's status reports them (``{"RUNNING": 2}``)."""
        application = import_serve().status().applications.get(APP_NAME)
        found = application.deployments.get(APP_NAME) if application is not None else None
        states = found.replica_states if found is not None else {}
        return {str(getattr(state, "value", state)): count for state, count in states.items()}

    def stop(self) -> None:
        """Shut Ray Serve down (its proxy and every replica, live streams given ``shutdown_timeout``), then Ray."""
        import ray

        serve = import_serve()
        try:
            serve.shutdown()
        finally:
            if self.owns_ray:
                ray.shutdown()


def connect(address: str | None, log_level: str) -> bool:
    """Connect this process to Ray; ``True`` when it did (``False``: Ray was connected already).

    ``None`` or ``"local"`` starts a local Ray instance; ``"auto"`` joins the
    cluster on this machine; ``host:port`` or ``ray://host:port`` that cluster.
    """
    import logging

    import ray

    if ray.is_initialized():
        return False
    target = "local" if address in (None, "local") else address
    reach(target)
    try:
        ray.init(address=target, logging_level=getattr(logging, RAY_LOG_LEVELS[log_level]))
    except (ConnectionError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"Cannot connect to Ray at {target!r}: {first}", param="ray") from None
    return True


def reach(address: str) -> None:
    """Refuse a ``host:port`` or ``ray://host:port`` address nothing answers on (Ray itself retries for minutes)."""
    import socket

    where = address.removeprefix("ray://")
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        return  # "local", "auto" or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise ConfigError(
            f"Cannot connect to Ray at {address!r}: {exc.strerror or exc} (is the cluster up? "
            "`ray status` on its head node tells).",
            param="ray",
        ) from None


def deploy(
    model: Any = None,
    *,
    replicas: int | tuple[int, int] = 1,
    address: str | None = None,
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
    loader: Callable[[], Any] | None = None,
    cpus_per_replica: float = 1,
    gpus_per_replica: float = 0,
    on_connect: Callable[[], None] | None = None,
) -> RayServer:
    """Deploy the server of :func:`refusion.serve.serve` on Ray Serve and return once every replica is up.

    ``replicas`` is a count or autoscaling bounds ``(min, max)``; each replica
    reserves ``cpus_per_replica`` CPUs and ``gpus_per_replica`` GPUs and loads
    the model itself (``model``: a path, a hub id or ``None`` for the shipped
    one; or ``loader()``, which must pickle). ``address``: ``None``/``"local"``
    (a new local Ray, unless this process is connected already), ``"auto"``,
    ``host:port`` or ``ray://host:port``. The other options are :func:`serve`'s;
    all are checked, and for a new local Ray ``host:port`` is probed, before
    Ray starts. Raises :class:`ConfigError` (one line) for bad options, a taken
    port, a missing Ray or an unreachable cluster, :class:`RefusionError` when
    the replicas fail to start (Ray Serve's replica logs have the traceback).
    ``on_connect()`` is called once connected to Ray, before Ray Serve starts.
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
    check_replicas(replicas)
    check_number("cpus_per_replica", cpus_per_replica, 0)
    check_number("gpus_per_replica", gpus_per_replica, 0)
    serve = import_serve()
    import ray

    if address in (None, "local") and not ray.is_initialized():
        bind(host, port).close()  # a taken port is one line now, not a proxy failing later
    settings = ReplicaSettings(
        model=model,
        loader=loader,
        model_name=model_name or model_name_of(model),
        defaults=defaults or ServeDefaults(),
        policy=policy or ServePolicy(),
        runtime=runtime,
        max_queue=max_queue,
        retry_after=retry_after,
        torch_threads=torch_threads,
    )
    owns_ray = connect(address, log_level)
    server = RayServer(url=f"http://{host_port(host, port)}", owns_ray=owns_ray)
    try:
        if on_connect is not None:
            on_connect()
        serve.start(http_options={"host": host, "port": port})
        app = deployment(
            replicas=replicas,
            max_rows=runtime.max_rows,
            max_queue=max_queue,
            shutdown_timeout=shutdown_timeout,
            log_level=log_level,
            cpus_per_replica=cpus_per_replica,
            gpus_per_replica=gpus_per_replica,
        ).bind(settings)
        serve.run(app, name=APP_NAME, route_prefix="/")
    except Exception as exc:
        reason = failure(serve, exc)
        server.stop()
        raise RefusionError(
            f"The Ray Serve replicas did not start: {reason} (the replica logs under Ray's session "
            "folder have the traceback)."
        ) from exc
    except BaseException:
        server.stop()
        raise
    return server


_RAISED = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")


def failure(serve: Any, exc: Exception) -> str:
    """Why the deployment failed, in one line: the last exception its replicas raised, else ``exc``'s own."""
    try:
        found = serve.status().applications[APP_NAME].deployments[APP_NAME].message
    except Exception:
        found = ""
    for text in (found, str(exc)):
        raised = [m for m in map(_RAISED.match, text.splitlines()) if m]
        cause = [m for m in raised if m.group(1) != "RuntimeError"] or raised  # Ray wraps the cause in RuntimeErrors
        if cause:
            return f"{cause[-1].group(1)}: {cause[-1].group(2).strip()}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def serve_on_ray(model: Any = None, **options: Any) -> None:
    """:func:`deploy` ``model`` with ``options``, serve until SIGINT/SIGTERM, then stop Ray Serve and Ray.

    Stopping shuts Ray Serve down on the cluster (every live stream gets up to
    ``shutdown_timeout`` seconds) and disconnects from Ray; a local Ray started
    here stops with it. A signal while deploying stops what was started and
    raises :class:`KeyboardInterrupt`. The signal handlers are put back on return.
    """
    stopping, deploying = threading.Event(), threading.Event()
    deploying.set()
    previous: dict[int, Any] = {}

    def on_signal(number: int, frame: Any) -> None:
        if deploying.is_set():
            raise KeyboardInterrupt  # deploy() stops what it started and raises it on
        stopping.set()

    def install() -> None:  # after Ray's own handlers, which ray.init() installs
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                previous.setdefault(number, signal.signal(number, on_signal))

    try:
        server = deploy(model, on_connect=install, **options)
        deploying.clear()
        try:
            if options.get("log_level", "info") in ("info", "debug", "trace"):
                counts = ", ".join(f"{n} {state.lower()}" for state, n in server.replicas().items())
                print(
                    f"refusion serve: Ray Serve on {server.url} ({counts} replicas) (Press CTRL+C to quit)",
                    file=sys.stderr,
                    flush=True,
                )
            while not stopping.wait(0.5):
                pass
        finally:
            server.stop()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
