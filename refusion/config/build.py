"""From a part's name (or class, or ``"module:Class"`` path) and parameters to the part itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.errors import ConfigError
from refusion.plugins.registry import PART_KINDS

__all__ = ["PART_KINDS", "build_part", "class_path", "part_class", "part_parameters"]


def class_path(cls: Any) -> str:
    """``"module:Class"`` of a class (or of an object's class)."""
    cls = cls if isinstance(cls, type) else type(cls)
    return f"{cls.__module__}:{cls.__qualname__}"


def part_class(kind: str, name: str) -> type:
    """The class a part name or ``"module:Class"`` path stands for (registered names first)."""
    from refusion.plugins.registry import import_class, registry

    return import_class(name, kind) if ":" in name else registry().get(kind, name)


def part_parameters(kind: str, name: str, cls: type | None = None) -> dict[str, Any]:
    """The parameters (with defaults) of the ``kind`` part called ``name`` (of class ``cls``, when known)."""
    from refusion.plugins.registry import Registration

    return Registration(kind, name, cls or part_class(kind, name), "local", "local").parameters()


def build_part(kind: str, name: str, params: Mapping[str, Any], cls: type | None = None, instance: Any = None) -> Any:
    """The ``kind`` part: ``instance`` itself, else ``cls`` (or the class ``name`` stands for) built with ``params``;
    errors name the part and the parameter."""
    from refusion.plugins.registry import registry

    if instance is not None:
        return registry().build(kind, instance)
    try:
        return registry().build(kind, cls if cls is not None else name, **dict(params))
    except ConfigError as exc:
        if exc.param is None:
            exc.param = kind
        raise
