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
        }
        for r in registry()
    ]
    if args.json:
        print(json.dumps(rows, indent=2, default=repr))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        params = ", ".join(f"{k}={v!r}" for k, v in r["parameters"].items()) or "-"
        print(f"{r['kind']:<13} {r['name']:<{width}}  {r['source']:<12} {r['class']}  ({params})")
    return 0


def add_parsers(sub: Any) -> None:
    plugins = sub.add_parser(
        "plugins",
        help="list registered parts, engines, model adapters and families",
        description="List every registered part: kind, name, source (built-in or package), "
        "class and parameters with defaults.",
    )
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(func=run_plugins)
