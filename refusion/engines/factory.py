"""Which engine runs a model: named, given as a class or instance, or the best registered one; opening one, and
lending an idle one to a direct decode."""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from refusion.engines.base import Engine
from refusion.errors import ConfigError


def engine_class(spec: Any) -> type[Engine]:
    """Resolve a registered name, a ``"module:Class"`` string or an :class:`Engine` subclass."""
    from refusion.plugins.registry import import_class, registry

    if isinstance(spec, str):
        cls = import_class(spec, "engine") if ":" in spec else registry().get("engine", spec)
    else:
        cls = spec
    if not inspect.isclass(cls) or not issubclass(cls, Engine):
        raise ConfigError(
            f"`engine` must be a registered engine name, an Engine subclass or instance; got {spec!r}.", param="engine"
        )
    return cls


def choose_engine(model: Any, decoder: Any = None) -> type[Engine]:
    """The engine class for ``model``: the decoder's ``engine`` if it names one, else the best that can run it.

    "Best" is the highest ``priority`` among the registered engines whose
    :meth:`~Engine.unsupported` says nothing against the model (ties: by
    name). A named engine that cannot run the model is an error with the
    reason, never silently replaced.
    """
    from refusion.plugins.registry import registry

    spec = getattr(decoder, "engine", None)
    if spec is not None:
        cls = engine_class(spec)
        reason = cls.unsupported(model)
        if reason is not None:
            raise ConfigError(f"`engine` {cls.name!r} cannot run {type(model).__name__}: {reason}.", param="engine")
        return cls
    reasons = []
    for entry in sorted(registry().entries("engine"), key=lambda r: (-r.cls.priority, r.name)):
        reason = entry.cls.unsupported(model)
        if reason is None:
            return entry.cls
        reasons.append(f"{entry.name}: {reason}")
    raise ConfigError(f"No registered engine can run {type(model).__name__} ({'; '.join(reasons)}).", param="engine")


def open_engine(
    model: Any,
    decoder: Any = None,
    engine: Any = None,
    *,
    prefix_cache: bool | None = False,
    kv_memory: int | None = None,
    **options: Any,
) -> Engine:
    """A live engine for ``model``: ``engine`` (instance, name or class) if given, else :func:`choose_engine`.

    The decoder's ``batch_invariant`` option is passed to the engine (a live
    engine must have been opened with it). ``prefix_cache`` (prompts' pages
    reused across sequences): ``False`` off, ``True`` required (an engine that
    cannot is refused), ``None`` on where the engine can; a live ``engine`` is
    taken as it was opened (``True`` refuses one opened without it).
    ``kv_memory``: bytes the engine's keys/values may take (engines with a
    memory budget; ``None``: the engine's default from the device); not with a
    live engine, which has its budget already.
    """
    from refusion.validators import check_boolean, check_integer

    if prefix_cache is not None:
        check_boolean("prefix_cache", prefix_cache)
    if kv_memory is not None:
        check_integer("kv_memory", kv_memory, 1)
    invariant = bool(getattr(decoder, "batch_invariant", False))
    if isinstance(engine, Engine):
        if engine.model is not model:
            raise ConfigError(
                "`engine` was opened for another model; open one for this model or pass its name.", param="engine"
            )
        check_invariance(engine, invariant)
        if kv_memory is not None:
            raise ConfigError(
                "`kv_memory` is set when an engine is opened; pass the engine's name instead of a live engine, or "
                "open it with `kv_memory=`.",
                param="kv_memory",
            )
        if prefix_cache and not getattr(engine, "prefix_cache", False):
            raise ConfigError(
                f"`prefix_cache=True` needs an engine opened with it; this {engine.name!r} engine was not (open it "
                "with `prefix_cache=True`, or pass the engine's name).",
                param="prefix_cache",
            )
        return engine
    cls = engine_class(engine) if engine is not None else choose_engine(model, decoder)
    if engine is not None:
        reason = cls.unsupported(model)
        if reason is not None:
            raise ConfigError(f"`engine` {cls.name!r} cannot run {type(model).__name__}: {reason}.", param="engine")
    parameters = inspect.signature(cls).parameters
    if invariant:
        if "batch_invariant" not in parameters and not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            raise ConfigError(
                f"`batch_invariant` needs an engine that takes it; engine {cls.name!r} does not (its "
                "__init__ must accept `batch_invariant` and pass it to Engine.__init__).",
                param="batch_invariant",
            )
        options["batch_invariant"] = True
    reuses = "prefix_cache" in parameters and bool(getattr(cls, "reuses_prefixes", True))
    can_reuse = reuses and not invariant
    if prefix_cache and not can_reuse:
        raise ConfigError(
            f"`prefix_cache` needs an engine that reuses prompt prefixes without `batch_invariant`; engine "
            f"{cls.name!r} {'does not' if not reuses else 'cannot under batch_invariant'} "
            "(the 'branch' engine does, for causal models).",
            param="prefix_cache",
        )
    if can_reuse and prefix_cache is not False:
        options["prefix_cache"] = True
    if kv_memory is not None:
        if "kv_memory" not in parameters:
            raise ConfigError(
                f"`kv_memory` needs an engine with a key/value memory budget; engine {cls.name!r} has none (the "
                "'branch' engine does, for causal models).",
                param="kv_memory",
            )
        options["kv_memory"] = kv_memory
    return cls(model, **options)


def check_invariance(engine: Engine, invariant: bool) -> None:
    """Refuse to run a decoder with ``batch_invariant=True`` on a live engine opened without it."""
    if invariant and not getattr(engine, "batch_invariant", False):
        raise ConfigError(
            f"The decoder asks for `batch_invariant`=True but engine {engine.name!r} was opened without "
            "it; open the engine with batch_invariant=True (or from this decoder).",
            param="batch_invariant",
        )


#: an idle engine a direct decode may keep for the next one on the same model, at most this many bytes of pages
KEEP_IDLE_BYTES = 256 << 20

_IDLE: weakref.WeakKeyDictionary[Any, dict[Any, Engine]] = weakref.WeakKeyDictionary()
_IDLE_LOCK = threading.Lock()


@contextmanager
def lent_engine(model: Any, decoder: Any = None, engine: Any = None) -> Iterator[Engine]:
    """A live engine for one direct decode (``Decoder.decode`` / ``decode_batch``) on ``model``.

    A live ``engine`` is taken as :func:`open_engine` takes it. Otherwise the engine the decoder names (or the best
    one) is opened, or an idle one this process opened before for the same model, engine and batch invariance is
    reused (none of its sequences live, at most :data:`KEEP_IDLE_BYTES` of pages held), and kept for the next
    decode once this one is done: a loop of single decodes does not open an engine each time. Its counters run
    on: a decode reports its own part of them.
    """
    if isinstance(engine, Engine):
        yield open_engine(model, decoder, engine)
        return
    cls = engine_class(engine) if engine is not None else choose_engine(model, decoder)
    key = (cls, bool(getattr(decoder, "batch_invariant", False)))
    with _IDLE_LOCK:
        live = _IDLE.get(model, {}).pop(key, None)
    if live is None:
        live = open_engine(model, decoder, cls)
    try:
        yield live
    finally:
        if _idle(live):
            with _IDLE_LOCK:
                _IDLE.setdefault(model, {})[key] = live


def _idle(engine: Engine) -> bool:
    """Whether ``engine`` holds no live sequence and little enough memory to be kept for the next decode."""
    manager = getattr(engine, "kvm", None)
    if manager is None:
        return True
    pool = manager.pool
    return not manager.reserved and pool.data.numel() * pool.data.element_size() <= KEEP_IDLE_BYTES
