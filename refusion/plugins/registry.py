"""Name -> class look-up for every kind of part, filled once from the plugin hooks.

``registry().build("selector", "threshold", slot_threshold=0.8)`` is how names
become objects; the decoder itself only ever sees instances.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from refusion.errors import ConfigError, PluginError, RegistrationError, unknown_name
from refusion.plugins.hookspecs import DECODER_NAMES
from refusion.plugins.manager import PluginManager, make_plugin_manager
from refusion.validators import finite_fields


def _interfaces() -> dict[str, type]:
    from refusion.engines.base import Engine
    from refusion.models.base import ModelAdapter
    from refusion.models.families.base import ModelFamily
    from refusion.strategies.base import CacheReorderer, Infiller, Reviser, SlotPartitioner, SlotSelector

    return {
        "partitioner": SlotPartitioner,
        "selector": SlotSelector,
        "infiller": Infiller,
        "reorderer": CacheReorderer,
        "reviser": Reviser,
        "model_adapter": ModelAdapter,
        "model_family": ModelFamily,
        "engine": Engine,
    }


#: the kinds of decoding parts (their parameters are routed by name: see :data:`DECODER_NAMES`)
PART_KINDS = ("partitioner", "selector", "infiller", "reorderer", "reviser")


def part_interface(kind: str) -> type:
    """The interface every ``kind`` part implements (:class:`~refusion.strategies.base.Reviser` for
    ``"reviser"``); :class:`ConfigError` for an unknown kind."""
    interfaces = _interfaces()
    if kind not in interfaces:
        raise ConfigError(f"`kind` must be one of {', '.join(interfaces)}; got {kind!r}.", param="kind")
    return interfaces[kind]


#: Kind of part -> the hook that registers it.
HOOKS = {
    "partitioner": "register_partitioners",
    "selector": "register_selectors",
    "infiller": "register_infillers",
    "reorderer": "register_reorderers",
    "reviser": "register_revisers",
    "model_adapter": "register_model_adapters",
    "model_family": "register_model_families",
    "engine": "register_engines",
}


@attrs.frozen
class Registration:
    """One registered part: its kind, name, class and where it came from."""

    kind: str
    name: str
    cls: Any  # the part's class, a subclass of its kind's interface
    plugin: str
    source: str

    @property
    def package(self) -> str:
        return self.cls.__module__.split(".")[0]

    def parameters(self) -> dict[str, Any]:
        """The part's parameters with their defaults (``None`` when required)."""
        if attrs.has(self.cls):
            out = {}
            for f in attrs.fields(self.cls):
                if not f.init:
                    continue
                default = f.default
                if isinstance(default, attrs.Factory):  # type: ignore[arg-type]  # attrs.Factory is a class
                    default = default.factory() if not default.takes_self else None
                out[f.alias or f.name] = None if default is attrs.NOTHING else default
            return out
        params = inspect.signature(self.cls).parameters
        bound = ("model",) if self.kind == "engine" else ()  # the caller supplies the model
        return {
            n: (None if p.default is inspect.Parameter.empty else p.default)
            for n, p in params.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in bound
        }


class Registry:
    """All registered parts, by kind and name."""

    def __init__(self, pm: PluginManager):
        self.pm = pm
        self._entries: dict[str, dict[str, Registration]] = {kind: {} for kind in HOOKS}
        interfaces = _interfaces()
        for kind, hook_name in HOOKS.items():
            hook = getattr(pm.hook, hook_name)
            for impl in hook.get_hookimpls():  # registration order
                plugin = impl.plugin_name
                source = pm.sources.get(plugin, "local")

                def register(cls: type, *, _kind=kind, _plugin=plugin, _source=source) -> type:
                    self._add(_kind, interfaces[_kind], cls, _plugin, _source)
                    return cls

                try:
                    impl.function(register=register)
                except RegistrationError:
                    raise
                except Exception as exc:
                    raise PluginError(
                        f"Plugin {plugin!r} ({source}) raised in hook {hook_name}: {exc}", plugin=plugin, source=source
                    ) from exc

    def add(self, cls: Any, *, replace: bool = False) -> Registration:
        """Register the part class ``cls`` from running code (no entry point, no plugin module): its kind is the
        interface it subclasses, its key its own ``name``; checked like any registration (source ``"local"``,
        plugin: the class's module). ``replace=True`` replaces an earlier in-process registration of that name
        (re-running a notebook cell); a built-in's or an entry-point plugin's part is never replaced."""
        interfaces = _interfaces()
        kinds = [kind for kind, interface in interfaces.items() if inspect.isclass(cls) and issubclass(cls, interface)]
        if not kinds:
            raise RegistrationError(
                f"{cls!r} cannot be registered: it subclasses none of refusion's part interfaces "
                f"({', '.join(i.__name__ for i in interfaces.values())})."
            )
        kind = kinds[0]
        name = cls.__dict__.get("name")
        existing = self._entries[kind].get(name) if isinstance(name, str) else None
        replaced = replace and existing is not None and existing.source == "local"
        if replaced:
            del self._entries[kind][name]
        try:
            self._add(kind, interfaces[kind], cls, cls.__module__, "local")
        except RegistrationError:
            if replaced and existing is not None:  # a refused replacement leaves the earlier registration in place
                self._entries[kind][name] = existing
            raise
        return self._entries[kind][name]

    def _add(self, kind: str, interface: type, cls: Any, plugin: str, source: str) -> None:
        where = f"plugin {plugin!r} ({source})"
        if not inspect.isclass(cls) or not issubclass(cls, interface):
            raise RegistrationError(
                f"{where} registered {cls!r} as a {kind}, but it does not subclass {interface.__name__}."
            )
        if inspect.isabstract(cls):
            missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
            raise RegistrationError(f"{where} registered {cls.__name__}, which does not implement: {missing}.")
        name = cls.__dict__.get("name")
        if not isinstance(name, str) or not name:
            raise RegistrationError(f"{where} registered {cls.__name__} without a `name` class attribute of its own.")
        entry = Registration(kind, name, cls, plugin, source)
        if kind in PART_KINDS:
            taken = [p for p in entry.parameters() if p in DECODER_NAMES]
            if taken:
                raise RegistrationError(
                    f"{where} registered {kind} {name!r} with parameter `{taken[0]}`, a name the decoder owns "
                    f"({', '.join(DECODER_NAMES)}): a value given as `{taken[0]}` goes to the decoder and could never "
                    "reach the part. Rename the parameter."
                )
        existing = self._entries[kind].get(name)
        if existing is not None:
            raise RegistrationError(
                f"{kind} name {name!r} is registered twice: by {existing.cls.__module__}.{existing.cls.__qualname__} "
                f"(plugin {existing.plugin!r}) and by {cls.__module__}.{cls.__qualname__} ({where})."
            )
        self._entries[kind][name] = entry

    # -- look-up -------------------------------------------------------------
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def names(self, kind: str) -> tuple[str, ...]:
        return tuple(self._kind(kind))

    def entries(self, kind: str) -> tuple[Registration, ...]:
        """Every registration of ``kind``, in registration order."""
        return tuple(self._kind(kind).values())

    def __iter__(self) -> Iterator[Registration]:
        for entries in self._entries.values():
            yield from entries.values()

    def entry(self, kind: str, name: str) -> Registration:
        """The registration of ``name``; an unknown name's error lists the known names and, when entry-point
        plugins failed to import, names them and their errors (one of them may have provided it)."""
        entries = self._kind(kind)
        if name not in entries:
            raise self.unavailable(unknown_name(kind.replace("_", " "), name, entries))
        return entries[name]

    def unavailable(self, error: ConfigError) -> ConfigError:
        """``error`` (something asked for is not registered) with the entry-point plugins that failed to import
        named in its message, the first one's import error chained as its cause; ``error`` itself when none
        failed."""
        failures = list(getattr(self.pm, "failures", {}).values())
        if not failures:
            return error
        named = "; ".join(f.describe() for f in failures)
        out = type(error)(
            f"{error} It may be provided by a plugin that was skipped: {named} ({failures[0].remedy()}).",
            param=error.param,
        )
        out.__cause__ = failures[0].error
        return out

    def get(self, kind: str, name: str) -> Any:
        """The class registered as ``name`` for ``kind``; the error lists the known names."""
        return self.entry(kind, name).cls

    def build(self, kind: str, spec: Any, **params: Any) -> Any:
        """Resolve ``spec`` to an instance of a ``kind`` part.

        ``spec`` is an instance (returned as is; no params allowed), a class, a
        ``"module:Class"`` string or a registered name; classes are called with
        ``params``. Bad params raise :class:`ConfigError` naming the part.
        """
        interface = _interfaces()[self._kind_name(kind)]
        if isinstance(spec, interface):
            if params:
                raise ConfigError(f"Parameters {sorted(params)} were given for a ready-made {kind} instance {spec!r}.")
            finite_fields(spec, f"{kind}.")
            return spec
        if isinstance(spec, str):
            cls = import_class(spec, kind) if ":" in spec else self.get(kind, spec)
        elif inspect.isclass(spec):
            cls = spec
        else:
            raise ConfigError(
                f"`{kind}` must be a registered name, a class or an instance of {interface.__name__}; got {spec!r}.",
                param=kind,
            )
        if not inspect.isclass(cls) or not issubclass(cls, interface):
            raise ConfigError(f"`{kind}` {spec!r} is not a {interface.__name__}.", param=kind)
        try:
            part = cls(**params)
        except TypeError as exc:
            accepted = ", ".join(f"`{p}`" for p in Registration(kind, "", cls, "", "").parameters()) or "none"
            raise ConfigError(f"Bad parameters for {kind} {spec!r}: {exc}. It accepts: {accepted}.") from exc
        finite_fields(part, f"{kind}.")
        return part

    def _kind_name(self, kind: str) -> str:
        if kind not in self._entries:
            raise ConfigError(f"`kind` must be one of {', '.join(self._entries)}; got {kind!r}.", param="kind")
        return kind

    def _kind(self, kind: str) -> dict[str, Registration]:
        return self._entries[self._kind_name(kind)]


#: while untrusted input is read (a checkpoint's ``refusion.json``, a record): how to refuse a module path instead of
#: importing it (``refusal(path, param)`` -> the error); ``None``: imports are allowed
_REFUSAL: contextvars.ContextVar[Callable[[str, str | None], Exception] | None] = contextvars.ContextVar(
    "refusion_import_refusal", default=None
)


@contextlib.contextmanager
def imports_refused(refusal: Callable[[str, str | None], Exception]) -> Iterator[None]:
    """Within the block, :func:`import_class` raises ``refusal(path, param)`` instead of importing anything.

    For code that reads input which must not run code (:mod:`refusion.config.trust`): whatever path through the
    configuration code reaches a ``"module:Class"`` name, no module is imported (not even a standard one).
    """
    token = _REFUSAL.set(refusal)
    try:
        yield
    finally:
        _REFUSAL.reset(token)


def import_class(path: str, param: str | None = None) -> type:
    """The class a ``"module:Class"`` path names (imports the module); every failure is a :class:`ConfigError`
    naming the path and ``param``: a malformed or relative path, a module that cannot be imported or raises while
    it is imported, a missing attribute, or one that is not a class. Inside :func:`imports_refused`, nothing is
    imported: its refusal is raised."""
    refusal = _REFUSAL.get()
    if refusal is not None:
        raise refusal(path, param)
    module_name, _, attr = path.partition(":")
    if (
        not module_name
        or not attr
        or module_name.startswith(".")
        or not all(part.isidentifier() for part in (*module_name.split("."), *attr.split(".")))
    ):
        raise ConfigError(
            f"{path!r} is not a class path: write it as `package.module:Class` (an absolute module, "
            "a colon, then the class).",
            param=param,
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"Cannot import {path!r}: {exc}.", param=param) from exc
    except Exception as exc:  # the module itself is broken: say which, with its error
        raise ConfigError(
            f"Cannot import {path!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}.", param=param
        ) from exc
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise ConfigError(f"Cannot import {path!r}: {exc}.", param=param) from exc
    if not isinstance(obj, type):
        raise ConfigError(
            f"{path!r} names a {type(obj).__name__}, not a class; name the class itself (`package.module:Class`).",
            param=param,
        )
    return obj


_REGISTRY: Registry | None = None


def register(cls: type | None = None, *, replace: bool = False) -> Any:
    """Register a part class in this process's registry, so that its ``name`` works wherever a registered name
    does (``refusion.generate(selector="mine")``, ``Decoder.from_names``, a ``Generator`` or a server started
    in this process). Returns the class, so it also works as a decorator (``@refusion.register`` or
    ``@refusion.register(replace=True)``).

    The kind is the interface ``cls`` subclasses (``SlotSelector``, ``Infiller``, ..., ``ModelFamily``,
    ``Engine``); it is checked as an entry point's part is (its own ``name``, no abstract method, no duplicate
    name: :class:`~refusion.errors.RegistrationError`). ``replace=True`` replaces an earlier in-process
    registration of the same name. A registry rebuilt by :func:`reset_registry` starts without it; other
    processes (``refusion`` commands, Ray workers) need an entry point (``docs/plugin_hooks.md``).
    """
    if cls is None:
        return lambda c: register(c, replace=replace)
    registry().add(cls, replace=replace)
    return cls


def registry() -> Registry:
    """The process-wide registry (built on first use, entry points included)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry(make_plugin_manager())
    return _REGISTRY


def reset_registry(new: Registry | None = None) -> None:
    """Replace the process-wide registry (``None``: rebuild on next use). For tests and notebooks."""
    global _REGISTRY
    _REGISTRY = new
