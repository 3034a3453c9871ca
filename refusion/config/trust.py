"""Which class names may import code: registered names always, ``"module:Class"`` paths only from trusted callers.

A part or engine named by a ``"module:Class"`` path is imported when the
decoder is built, which runs that module. That is what a researcher wants
from their own Python code, CLI flags or preset files; it is not what a
server should do for a client's request, nor what ``refusion reproduce``
should do for a record someone sent. Those callers check the names first with
:func:`refuse_import_paths`, before anything is merged or built, and let the
user opt in (``refusion serve --allow-imports``, ``reproduce --allow-imports``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.config.build import PART_KINDS
from refusion.errors import ConfigError

#: the fields whose string value names a class (parts and the engine)
CLASS_FIELDS = (*PART_KINDS, "engine")


def is_import_path(name: Any) -> bool:
    """Whether ``name`` is a ``"module:Class"`` path rather than a registered name."""
    return isinstance(name, str) and ":" in name


def import_paths(config: Any) -> dict[str, str]:
    """``{field: path}`` for every part or engine of ``config`` named by a ``"module:Class"`` path.

    ``config`` is a :class:`~refusion.config.spec.DecoderSpec` or a mapping of
    options (part names, ``engine``, and, for a server request, the same keys
    nested under ``params``). Classes and instances handed in from Python are
    not paths: they were imported by the caller.
    """
    from refusion.config.spec import DecoderSpec

    found: dict[str, str] = {}
    if isinstance(config, DecoderSpec):
        for kind, part in config.parts().items():
            if part.cls is None and part.instance is None and is_import_path(part.name):
                found[kind] = part.name
        if is_import_path(config.engine):
            found["engine"] = config.engine
        return found
    if isinstance(config, Mapping):
        for field in CLASS_FIELDS:
            value = config.get(field)
            name = value.get("name") if isinstance(value, Mapping) else value  # {"name": ..., "params": ...} too
            if is_import_path(name):
                found[field] = str(name)
        nested = config.get("params")
        if isinstance(nested, Mapping):
            found.update({f"params.{k}": v for k, v in import_paths({k: nested[k] for k in nested}).items()})
    return found


def refuse_import_paths(config: Any, *, where: str, opt_in: str) -> None:
    """Raise :class:`ConfigError` naming the first field of ``config`` that is a ``"module:Class"`` path.

    ``where`` says what was read (``"request"``, ``"record 'run.json'"``);
    ``opt_in`` says how a trusted user allows it. Nothing is imported.
    """
    from refusion.plugins.registry import registry

    for field, path in import_paths(config).items():
        kind = field.rpartition(".")[2]
        names = ", ".join(registry().names(kind))
        raise ConfigError(
            f"{where}: `{field}` = {path!r} names a class by module path, which would import and run "
            f"that module; only registered {kind} names are accepted here ({names}). {opt_in}",
            param=field,
        )
