"""How decodes run, declared once: the engine and what the batch may hold.

:class:`RuntimeConfig` is the one value that says which engine runs the model calls and how much it may hold at
once: ``engine``, ``max_rows`` (live rows), ``max_batch_tokens`` (prompt plus generation positions reserved by the
live rows), ``kv_memory`` (bytes of keys/values), ``prefix_cache`` (prompts' pages shared across requests),
``page_size`` (tokens per page) and ``batch_invariant`` (every row's numbers the ones it gets alone). It is checked
once, when made (every field names itself in its error), and passed as it is through
:class:`~refusion.batcher.Batcher`, :func:`refusion.serve`, :func:`refusion.run_batch`, the batch workers and
the Ray replicas. A :class:`~refusion.decoding.decoder.Decoder` says nothing of any of it but two requests: an
``engine`` by name and ``batch_invariant`` (:meth:`RuntimeConfig.for_decoder`).
"""

from __future__ import annotations

from typing import Any

import attrs

from refusion.errors import ConfigError
from refusion.limits import DEFAULT_MAX_ROWS
from refusion.validators import check_boolean, check_integer

#: tokens per page of keys/values (vLLM's default block size)
DEFAULT_PAGE_SIZE = 16
#: the most bytes of keys/values one can ask for (1 EiB: anything larger is a typo)
MAX_KV_MEMORY = 1 << 60


def _engine(instance: Any, attribute: Any, value: Any) -> None:
    if value is None:
        return
    from refusion.engines import Engine, engine_class

    if not isinstance(value, Engine):
        engine_class(value)


def _positive(instance: Any, attribute: Any, value: Any) -> None:
    check_integer(attribute.name, value, 1)


def _optional_positive(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None:
        check_integer(attribute.name, value, 1)


def _kv_memory(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None:
        check_integer("kv_memory", value, 1, MAX_KV_MEMORY, "bytes of keys/values (at most 1 EiB)")


def _optional_boolean(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None:
        check_boolean(attribute.name, value)


def _boolean(instance: Any, attribute: Any, value: Any) -> None:
    check_boolean(attribute.name, value)


@attrs.frozen
class RuntimeConfig:
    """How decodes run (see the module docstring).

    ``engine``: a registered engine name, an :class:`~refusion.engines.base.Engine` subclass or a live engine
    (``None``: the best engine for the model). ``prefix_cache``: ``None`` turns it on where the engine can,
    ``True`` requires it. ``kv_memory`` ``None``: the engine's default from its device.
    """

    engine: Any = attrs.field(default=None, validator=_engine)
    max_rows: int = attrs.field(default=DEFAULT_MAX_ROWS, validator=_positive)
    max_batch_tokens: int | None = attrs.field(default=None, validator=_optional_positive)
    kv_memory: int | None = attrs.field(default=None, validator=_kv_memory)
    prefix_cache: bool | None = attrs.field(default=None, validator=_optional_boolean)
    page_size: int = attrs.field(default=DEFAULT_PAGE_SIZE, validator=_positive)
    batch_invariant: bool = attrs.field(default=False, validator=_boolean)

    @classmethod
    def of(cls, runtime: RuntimeConfig | None = None, **options: Any) -> RuntimeConfig:
        """``runtime`` (default: the defaults) with ``options`` set, those given as ``None`` left as they are.
        ``max_tokens`` is the old name of ``max_batch_tokens``; giving a field both ways is an error."""
        if "max_tokens" in options:
            value = options.pop("max_tokens")
            if value is not None:
                if options.get("max_batch_tokens") is not None:
                    raise ConfigError("Give `max_batch_tokens` or its old name `max_tokens`, not both.")
                options["max_batch_tokens"] = value
        unknown = sorted(set(options) - set(attrs.fields_dict(cls)))
        if unknown:
            raise ConfigError(
                f"Unknown runtime option(s) {', '.join(map(repr, unknown))}; known: "
                f"{', '.join(attrs.fields_dict(cls))}.",
                param=unknown[0],
            )
        given = {k: v for k, v in options.items() if v is not None}
        base = runtime if runtime is not None else cls()
        if not isinstance(base, RuntimeConfig):
            raise ConfigError(f"`runtime` must be a RuntimeConfig; got {base!r:.80}.", param="runtime")
        return attrs.evolve(base, **given) if given else base

    @classmethod
    def for_decoder(cls, decoder: Any, runtime: RuntimeConfig | None = None, **options: Any) -> RuntimeConfig:
        """The runtime a decoder asks for: its ``engine`` (when it names one) and ``batch_invariant``, over
        ``runtime`` and ``options``."""
        config = cls.of(runtime, **options)
        asked: dict[str, Any] = {}
        if getattr(decoder, "engine", None) is not None and config.engine is None:
            asked["engine"] = decoder.engine
        if getattr(decoder, "batch_invariant", False):
            asked["batch_invariant"] = True
        return attrs.evolve(config, **asked) if asked else config

    def open(self, model: Any, decoder: Any = None) -> Any:
        """A live engine for ``model`` as this configuration says (a live ``engine`` is checked and returned)."""
        from refusion.engines import open_engine

        options: dict[str, Any] = {}
        if self.page_size != DEFAULT_PAGE_SIZE:
            options["page_size"] = self.page_size
        return open_engine(
            model,
            _Asks(self.batch_invariant),
            self.engine if self.engine is not None else getattr(decoder, "engine", None),
            prefix_cache=self.prefix_cache,
            kv_memory=self.kv_memory,
            **options,
        )


@attrs.frozen
class _Asks:
    """What :func:`~refusion.engines.open_engine` reads of a decoder: its ``batch_invariant`` (no engine: the
    runtime's is passed apart)."""

    batch_invariant: bool
    engine: Any = None
