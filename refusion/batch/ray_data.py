"""Batch rows on Ray Data: an actor pool of :class:`~refusion.batch.worker.BatchWorker` s, results streamed back.

:func:`run_on_ray` turns the rows still to run into a Ray Dataset of
``{"number", "line"}`` rows and maps it in batches (``map_batches``) onto
``workers`` actors, each loading the model once and decoding its batches on
its own continuous-batching batcher. A batch holds :data:`BATCH_ROWS`
batchers' worth of rows, so that the batcher refills as rows finish
instead of waiting for the slowest of a batch; its result rows come back
when it ends, batches in order of completion, and the caller writes them
(:class:`~refusion.batch.output.ResultWriter`).

Ray Data restarts an actor that dies (``max_restarts=-1``) and retries the
batches it held (``max_task_retries=-1``): their rows run again on the
replacement, with the same seeds, so they come out the same; a row that was
already sent back before its worker died is not returned twice.

Needs the ``[ray]`` extra (``pip install 'refusion[ray]'``); nothing here
imports Ray until a run starts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from refusion.batch.lines import unreadable
from refusion.batch.output import row_key, row_line
from refusion.errors import ConfigError, warn_caller
from refusion.limits import DEFAULT_MAX_ROWS

#: what a run without Ray says
NEEDS_RAY = "`--ray` needs Ray: pip install 'refusion[ray]'"
#: rows per batch, in batchers' worth (``max_rows``): a worker's batcher refills from its batch as rows finish
#: (measured: 1 gives two thirds of the embedded run's rows/s once started, 4 all of it)
BATCH_ROWS = 4


@attrs.frozen
class WorkerInfo:
    """One worker process as it reported itself after its last batch: its actor ``handle`` (the same across
    restarts), ``node`` and ``pid``, the ``rows`` it returned, its CPU seconds (``cpu``, model loading included)
    and its peak resident memory in bytes (``peak_rss``)."""

    handle: Any
    node: str
    pid: int
    rows: int
    cpu: float
    peak_rss: int


def import_ray() -> Any:
    """``ray`` with Ray Data loaded; :class:`ConfigError` (``param="ray"``) saying how to install it if missing."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise ConfigError(NEEDS_RAY, param="ray") from None
    return ray


def connect(ray: Any, address: str | None) -> bool:
    """Join the Ray cluster at ``address`` (``"auto"``, ``host:port``, ``ray://host:10001``; ``None`` or
    ``"local"``: start a new one on this machine) unless this process is already connected; whether this call
    connected (then the run shuts Ray down at its end)."""
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address in (None, "local"):  # a new Ray on this machine, even where `ray start` runs one
        options.update(address="local", include_dashboard=False)
    else:
        check_reachable(address)
        options["address"] = address
    try:
        with quiet_ray_backend():
            ray.init(**options)
    except ConnectionError as exc:
        raise ConfigError(f"`ray`: cannot connect to the Ray cluster at {address!r}: {exc}", param="ray") from None
    return True


@contextlib.contextmanager
def quiet_ray_backend() -> Iterator[None]:
    """Around ``ray.init``: keep the C++ log of this process's Ray core worker off stderr, unless the user set
    ``RAY_BACKEND_LOG_LEVEL``. Ray Data's actor pools always log ``E ... core_worker.cc: Actor ... has constructor
    arguments in the object store and max_restarts > 0`` (ray-project/ray#53727), a note about Ray's own design,
    not a failure (failures reach the run as Python exceptions); the level is set to ``fatal``, and the one line
    the core worker prints about that setting while it starts is sent to /dev/null with the rest of what
    ``ray.init`` writes to the stderr file descriptor."""
    if "RAY_BACKEND_LOG_LEVEL" in os.environ:
        yield
        return
    os.environ["RAY_BACKEND_LOG_LEVEL"] = "fatal"
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """A ``host:port`` or ``ray://host:port`` address must accept a connection (Ray itself retries an unreachable
    head for minutes); :class:`ConfigError` naming ``ray`` if it does not. ``auto`` is left to Ray."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"`ray`: no Ray cluster answers at {address!r} ({exc.strerror or exc}); give the head's "
            "host:port (`ray start --head` prints it), ray://host:10001, or auto.",
            param="ray",
        ) from None


def check_room(ray: Any, cpus_per_worker: float, gpus_per_worker: float, started: bool) -> None:
    """Refuse a worker no node of the cluster can hold (Ray Data would wait for it in silence): a
    :class:`ConfigError` naming the resource on a Ray this run started, a warning on a cluster joined (an
    autoscaler may still add such a node)."""
    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    if any(n.get("CPU", 0) >= cpus_per_worker and n.get("GPU", 0) >= gpus_per_worker for n in nodes):
        return
    gpus_short = not any(n.get("GPU", 0) >= gpus_per_worker for n in nodes)
    param, kind, wanted = (
        ("gpus_per_worker", "GPU", gpus_per_worker) if gpus_short else ("cpus_per_worker", "CPU", cpus_per_worker)
    )
    most = max((n.get(kind, 0) for n in nodes), default=0)
    message = (
        f"`{param}` (`--{param.replace('_', '-')}`) is {wanted:g}, but no node of the Ray cluster has that "
        f"many {kind}s (the most on one node: {most:g}), so no worker could start"
    )
    if started:
        raise ConfigError(message + ".", param=param)
    warn_caller(message + " yet; the run waits until the cluster has such a node.")


def model_for_workers(model: Any) -> Any:
    """``model`` as every worker can load it: ``None``, a path or a mapping of model options (``"model"``: the path),
    a path that exists here made absolute (a hub id stays as it is)."""
    if model is None:
        return None
    if isinstance(model, Mapping):
        options = dict(model)
        if options.get("model") is not None:
            options["model"] = model_for_workers(options["model"])
        return options
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        return os.path.abspath(path) if os.path.exists(path) else path
    raise ConfigError(
        f"`model` on Ray must be None, a path or model options (each worker loads it); got a {type(model).__name__}.",
        param="model",
    )


def plain(value: Any) -> Any:
    """A Dataset value as plain JSON-able Python (numpy arrays and scalars from Arrow become lists and numbers)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return plain(value.tolist())
    return value


def dataset_lines(dataset: Any) -> Iterator[tuple[int, str | None]]:
    """``(row number, JSON text)`` of a Ray Dataset, numbered from 1 in the order it yields its rows: a row of one
    text column ``line`` (or ``text``, as ``ray.data.read_text`` gives) is the JSON text of a row, any other row
    is a row object, its null fields left out (``None`` text: not JSON-able, an error row)."""
    for number, row in enumerate(dataset.iter_rows(), 1):
        row = dict(row)
        if len(row) == 1 and set(row) <= {"line", "text"} and isinstance(next(iter(row.values())), str):
            yield number, next(iter(row.values()))
            continue
        row = {k: v for k, v in row.items() if v is not None}  # a column only some rows have is null in the others
        try:
            yield number, json.dumps(plain(row), allow_nan=False)
        except (TypeError, ValueError):
            yield number, None


class _Workers:
    """A small registry actor: each worker process reports its handle and, after each batch, its figures."""

    def __init__(self):
        self.workers: dict[str, dict] = {}
        self.failure: ConfigError | None = None

    def join(self, key: str, handle: Any, node: str, pid: int, cpu: float, peak_rss: int) -> None:
        self.workers[key] = dict(handle=handle, node=node, pid=pid, rows=0, cpu=cpu, peak_rss=peak_rss)

    def report(self, key: str, rows: int, cpu: float, peak_rss: int) -> None:
        self.workers[key].update(rows=rows, cpu=cpu, peak_rss=peak_rss)

    def fail(self, error: ConfigError) -> None:
        self.failure = error

    def list(self) -> list[dict]:
        return list(self.workers.values())

    def failed(self) -> ConfigError | None:
        return self.failure


def usage() -> tuple[float, int]:
    """This process's CPU seconds (user and system) and peak resident memory in bytes."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime, used.ru_maxrss if sys.platform == "darwin" else used.ru_maxrss * 1024


class _BatchActor:
    """The callable class of ``map_batches``: one :class:`BatchWorker` per actor, one batch of lines per call."""

    def __init__(self, model: Any, worker_options: dict, threads: int, registry: Any):
        import ray
        import torch

        from refusion.batch.worker import BatchWorker

        torch.set_num_threads(threads)
        try:
            self.worker = BatchWorker(model, **worker_options)
        except ConfigError as error:  # a bad model: the run fails with this error, not Ray's account of it
            ray.get(registry.fail.remote(error))
            raise
        self._ray, self.registry = ray, registry
        context = ray.get_runtime_context()
        self.key = f"{context.get_node_id()}:{os.getpid()}"
        self.rows = 0
        ray.get(registry.join.remote(self.key, context.current_actor, context.get_node_id(), os.getpid(), *usage()))

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, list]:
        """The batch's result rows as JSON text, one per line."""
        lines = zip((int(n) for n in batch["number"]), (str(t) for t in batch["line"]))
        results = [row_line(row).decode("utf-8") for row in self.worker.run(lines)]
        self.rows += len(results)
        self._ray.get(self.registry.report.remote(self.key, self.rows, *usage()))  # before the rows reach the driver
        return {"result": results}


class RayRun:
    """The result rows of one Ray run, an iterator: rows as workers finish them, each id once, then the cleanup.

    Built by :func:`run_on_ray`. :meth:`workers` lists the worker processes
    (live and replaced) with their figures; :meth:`close` stops the run
    (called at the end of iteration, and by the caller if it stops early).
    """

    def __init__(
        self,
        ray: Any,
        lines: Iterable[tuple[int, str | None]],
        early: deque,
        *,
        workers: int,
        gpus_per_worker: float,
        cpus_per_worker: float,
        model: Any,
        worker_options: dict,
        started: bool,
    ):
        self._ray, self._early, self._started = ray, early, started
        self._final: list[WorkerInfo] | None = None
        self._source: Iterator[dict] = iter(())
        self._seen: set[str | int] = set()  # rows returned so far, by their key
        self._quiet = logging.getLogger("ray.data")
        self._level = self._quiet.level
        self._quiet.setLevel(logging.CRITICAL)  # Ray Data's notes would cross the progress bar; failures raise
        self._registry = ray.remote(num_cpus=0)(_Workers).remote()
        try:
            items = []
            for number, text in lines:
                if text is None:
                    early.append(unreadable(number))
                else:
                    items.append((number, text))
            if items:
                self._source = iter(
                    self._pipeline(items, workers, gpus_per_worker, cpus_per_worker, model, worker_options).iter_rows()
                )
        except BaseException:
            self.close()
            raise

    def _pipeline(
        self,
        items: list[tuple[int, str]],
        workers: int,
        gpus_per_worker: float,
        cpus_per_worker: float,
        model: Any,
        worker_options: dict,
    ) -> Any:
        """The Dataset of result rows: ``items`` (line numbers and texts) in blocks of one batch each, mapped by an
        actor pool (each worker holds at most 2 batches, so that the last ones go to whichever worker is free)."""
        import pyarrow
        import ray.data

        runtime = worker_options.get("runtime")
        max_rows = runtime.max_rows if runtime is not None else worker_options.get("max_rows", DEFAULT_MAX_ROWS)
        batch = max(1, min(BATCH_ROWS * max_rows, -(-len(items) // workers)))  # every worker gets one when few
        # one block per batch (from_items would split the rows evenly, and Ray Data bundle small blocks together)
        blocks = [
            pyarrow.table(dict(zip(("number", "line"), map(list, zip(*items[i : i + batch])))))
            for i in range(0, len(items), batch)
        ]
        context = ray.data.DataContext.get_current()  # a Dataset keeps a copy of it from its creation on
        saved = context.enable_progress_bars
        context.enable_progress_bars = False  # the caller's bar counts rows
        try:
            gpus = {"num_gpus": gpus_per_worker} if gpus_per_worker else {}
            return ray.data.from_arrow(blocks).map_batches(
                _BatchActor,
                batch_size=batch,
                num_cpus=cpus_per_worker,
                **gpus,
                compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=2),
                fn_constructor_kwargs={
                    "model": model,
                    "worker_options": worker_options,
                    "threads": max(1, int(cpus_per_worker)),
                    "registry": self._registry,
                },
            )
        finally:
            context.enable_progress_bars = saved

    def __iter__(self) -> RayRun:
        return self

    def __next__(self) -> dict:
        """The next result row; a row sent again by a retried batch (its worker died) is passed over."""
        while not self._early:
            try:
                row = json.loads(next(self._source)["result"])
            except StopIteration:
                if self._early:
                    break
                self.close()
                raise
            except Exception as exc:
                failure = self._failure()
                self.close()
                if failure is not None:
                    raise failure from exc
                raise
            key = row_key(row["id"], row["line"])
            if key not in self._seen:
                self._seen.add(key)
                return row
        return self._early.popleft()

    def _failure(self) -> ConfigError | None:
        """The error a worker failed to start with, if one did (a model that does not load)."""
        try:
            return self._ray.get(self._registry.failed.remote(), timeout=10)
        except Exception:
            return None

    def workers(self) -> list[WorkerInfo]:
        """Every worker process that joined this run, in order of joining (a replaced worker stays listed)."""
        if self._final is not None:
            return list(self._final)
        return [WorkerInfo(**info) for info in self._ray.get(self._registry.list.remote())]

    def close(self) -> None:
        """Stop the pipeline and the registry (the worker figures stay readable); shut Ray down if the run
        started it."""
        if self._final is not None:
            return
        try:
            self._final = self.workers()
        except Exception:  # the registry is gone with a lost cluster: no figures
            self._final = []
        close = getattr(self._source, "close", None)
        if close is not None:  # stops Ray Data's executor and its actors
            close()
        self._ray.kill(self._registry)
        self._quiet.setLevel(self._level)
        if self._started:
            self._ray.shutdown()


def run_on_ray(
    input_path: Any,
    writer: Any,
    pending_lines: Iterable[tuple[int, str | None]] | None,
    *,
    workers: int = 1,
    gpus_per_worker: float = 0,
    cpus_per_worker: float = 1,
    address: str | None = None,
    model: Any = None,
    worker_options: dict | None = None,
    progress: bool = True,
) -> RayRun:
    """Result rows of ``pending_lines`` (``(line number, raw JSON text)``, the rows not yet in the output) decoded on
    Ray Data by ``workers`` actors of ``cpus_per_worker`` CPUs and ``gpus_per_worker`` GPUs; a :class:`RayRun`.

    ``pending_lines`` ``None``: ``input_path`` is a ``ray.data.Dataset`` of
    ``{"line": str}`` or row objects, read here (rows whose id ``writer.done``
    holds are skipped, a repeated id is an error row). ``address``: ``None``
    or ``"local"`` for a Ray started on this machine, else a cluster address;
    a process already connected to Ray stays on its cluster. ``model`` is
    loaded by every worker (``None``, a path or model options);
    ``worker_options`` are :class:`~refusion.batch.worker.BatchWorker`'s
    keywords. Rows are yielded, never written: the caller writes them with
    ``writer``. ``progress`` is the caller's: Ray Data's own bars stay off.
    Without Ray: :class:`ConfigError` naming ``ray``.
    """
    ray = import_ray()
    model = model_for_workers(model)
    early: deque = deque()
    if pending_lines is None:
        from refusion.batch.lines import pending_lines as still_to_run

        pending_lines = still_to_run(dataset_lines(input_path), writer.done, early, {"skipped": 0})
    started = connect(ray, address)
    try:
        check_room(ray, cpus_per_worker, gpus_per_worker, started)
    except ConfigError:
        if started:
            ray.shutdown()
        raise
    return RayRun(
        ray,
        pending_lines,
        early,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        cpus_per_worker=cpus_per_worker,
        model=model,
        worker_options=dict(worker_options or {}),
        started=started,
    )
