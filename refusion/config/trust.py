"""Which class names may import code: registered names always, ``"module:Class"`` paths only from trusted callers.

A part or engine named by a ``"module:Class"`` path is imported when the
decoder is built, which runs that module. That is what a researcher wants
from their own Python code, CLI flags or preset files; it is not what a
server should do for a client's request, nor what ``refusion reproduce``
should do for a record someone sent. Those callers check the names first with
:func:`refuse_import_paths`, before anything is merged or built, and let the
user opt in (``refusion serve --allow-imports``, ``reproduce --allow-imports``).

A checkpoint's ``refusion.json`` and a record are read whole as untrusted
input: their raw JSON is checked before it is parsed (every part form a file
may hold: ``"selector": "m:X"``, ``{"name": "m:X"}``, a record's
``{"name", "class"}``, ``params.engine``), and the parsing itself runs inside
:func:`no_imports`, so no path through the configuration code can import a
module they name, whatever the current directory or ``sys.path`` hold.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from refusion.config.build import PART_KINDS
from refusion.errors import ImportRefused

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
            elif isinstance(value, Mapping) and _other_class(field, name, value.get("class")):
                found[field] = str(value["class"])  # a record's {"name", "class"}: the class is what it builds
        nested = config.get("params")
        if isinstance(nested, Mapping):
            found.update({f"params.{k}": v for k, v in import_paths({k: nested[k] for k in nested}).items()})
    return found


def _other_class(kind: str, name: Any, path: Any) -> bool:
    """Whether a record's ``class`` field ``path`` names a module path other than the class registered as
    ``name`` (the spec reader builds that class then)."""
    from refusion.config.build import class_path
    from refusion.plugins.registry import registry

    if not is_import_path(path):
        return False
    reg = registry()
    return not (isinstance(name, str) and name in reg.names(kind) and class_path(reg.get(kind, name)) == path)


def refusal(field: str | None, path: str, *, where: str, opt_in: str, param: str | None = None) -> ImportRefused:
    """The error refusing ``path`` (a ``"module:Class"`` name) given as ``field``: names both and the way in; its
    ``param`` is ``param`` if given, else the field."""
    from refusion.plugins.registry import registry

    field = field or "part"
    kind = field.rpartition(".")[2]
    names = registry().names(kind) if kind in registry().kinds() else ()
    accepted = f"only registered {kind} names are accepted here ({', '.join(names)})" if names else "refused here"
    return ImportRefused(
        f"{where}: `{field}` = {path!r} names a class by module path, which would import and run "
        f"that module; {accepted}. {opt_in}",
        param=param or field,
    )


def refuse_import_paths(config: Any, *, where: str, opt_in: str, param: str | None = None) -> None:
    """Raise :class:`~refusion.errors.ImportRefused` naming the first field of ``config`` that is a module path.

    ``where`` says what was read (``"request"``, ``"record 'run.json'"``);
    ``opt_in`` says how a trusted user allows it; ``param``, the error's
    ``param`` (default: the field). Nothing is imported.
    """
    for field, path in import_paths(config).items():
        raise refusal(field, path, where=where, opt_in=opt_in, param=param)


@contextlib.contextmanager
def no_imports(*, where: str, opt_in: str, param: str | None = None) -> Iterator[None]:
    """Within the block, any ``"module:Class"`` name that reaches
    :func:`~refusion.plugins.registry.import_class` is refused (the :func:`refusal` error) instead of imported:
    wrap the reading of untrusted input in it, after :func:`refuse_import_paths` on its raw form."""
    from refusion.plugins.registry import imports_refused

    with imports_refused(lambda path, field: refusal(field, path, where=where, opt_in=opt_in, param=param)):
        yield
