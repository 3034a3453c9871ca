"""``refusion plugins``: every registered part."""

from __future__ import annotations

import argparse
import json
from typing import Any


def run_plugins(args: argparse.Namespace) -> int:
    from refusion.plugins.registry import registry

    rows: list[dict[str, Any]] = [
        {
            "kind": r.kind,
            "name": r.name,
            "class": f"{r.cls.__module__}.{r.cls.__qualname__}",
            "source": r.source,
            "package": r.package,
            "plugin": r.plugin,
            "parameters": r.parameters(),
            "traits": traits(r.cls),
        }
        for r in registry()
    ]
    if args.json:
        print(json.dumps(rows, indent=2, default=repr))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        params = ", ".join(f"{k}={v!r}" for k, v in r["parameters"].items()) or "-"
        declared = "; ".join(f"{k}={v}" for k, v in r["traits"].items())
        print(
            f"{r['kind']:<13} {r['name']:<{width}}  {r['source']:<12} {r['class']}  ({params})"
            + (f"  [{declared}]" if declared else "")
        )
    return 0


def traits(cls: Any) -> dict[str, Any]:
    """What a part or engine declares so that the decode loop can decide its rows together (``batched``: the
    infiller's batched form, or ``per sequence``; ``leftmost_only``, ``commit_order``, ``revises``; an engine's
    ``lays_out`` and ``causal_lanes``), as text."""
    names = list(getattr(cls, "traits", {}))
    if getattr(cls, "kind", None) == "engine":
        names = ["lays_out", "causal_lanes"]
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(cls, name, None)
        if name == "batched":
            value = "per sequence" if value is None else str(value).rpartition(":")[2] or repr(value)
        out[name] = value
    return out


def add_parsers(sub: Any) -> None:
    plugins = sub.add_parser(
        "plugins",
        help="list registered parts, engines, model adapters and families",
        description="List every registered part: kind, name, source (built-in or package), "
        "class, parameters with defaults, and the traits that let the decode loop decide its rows together "
        "(an infiller's batched form, or 'per sequence').",
    )
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(func=run_plugins)
