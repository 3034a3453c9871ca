"""Griffe extension for the API reference: the docstrings' Sphinx roles as links.

refusion's docstrings are reST-flavoured: ``code`` in double backticks (also
valid Markdown) and roles such as :class:`~refusion.errors.ConfigError` or
:meth:`with_params`. mkdocstrings renders Markdown, where a role would show
as literal text. This extension, run once the package is loaded, rewrites
every role into an *optional* cross-reference: a link when the target is an
object the reference renders, plain code otherwise (an optional reference
never fails ``mkdocs build --strict``). Relative targets are looked up from
the documented object outwards (the object, its parents, its module's
imports), then as a name the package exports lazily (``refusion.generate``:
``_EXPORTS`` in ``refusion/__init__.py``), then as the unique object whose path
ends with the target (``Engine.served``). A trailing ``::`` (reST's literal-block marker) becomes ``:``.

Set ``REFUSION_DOCS_ROLES=report`` to print the targets that resolve to no
object at all (a stale name in a docstring).
"""

from __future__ import annotations

import ast
import html
import os
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`([^`]+)`")
TITLED = re.compile(r"^(.*?)\s*<([^>]+)>$")
LITERAL_MARKER = re.compile(r"(\S)::[ \t]*$", re.MULTILINE)


def _final_path(found: Any) -> str | None:
    try:
        if isinstance(found, griffe.Alias):
            return found.final_target.path
        return found.path
    except Exception:  # an alias to something outside the loaded packages
        return getattr(found, "target_path", None)


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring of the loaded package into optional autorefs."""

    def __init__(self) -> None:
        super().__init__()
        self.unresolved: set[tuple[str, str]] = set()

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self.exports = self._lazy_exports(pkg)
        self.paths: list[str] = []
        self._collect(pkg)
        self._walk(pkg, pkg)
        if os.environ.get("REFUSION_DOCS_ROLES") == "report":
            for where, target in sorted(self.unresolved):
                print(f"unresolved role target: {target!r} in {where}")

    @staticmethod
    def _lazy_exports(pkg: griffe.Module) -> dict[str, str]:
        """``{name: module}`` of the package's lazily imported public names, read from its ``__init__``."""
        try:
            tree = ast.parse(pkg.filepath.read_text())
        except Exception:
            return {}
        for node in tree.body:
            targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
            if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets) and node.value is not None:
                try:
                    return dict(ast.literal_eval(node.value))
                except ValueError:
                    return {}
        return {}

    def _collect(self, obj: Any) -> None:
        self.paths.append(obj.path)
        for member in obj.members.values():
            if not isinstance(member, griffe.Alias):
                self._collect(member)

    def _walk(self, obj: Any, pkg: griffe.Module) -> None:
        if isinstance(obj, griffe.Alias):
            return
        if obj.docstring is not None:
            obj.docstring.value = self._rewrite(obj, pkg, obj.docstring.value)
        for member in list(obj.members.values()):
            if not isinstance(member, griffe.Alias):
                self._walk(member, pkg)

    def _rewrite(self, obj: Any, pkg: griffe.Module, text: str) -> str:
        def replace(match: re.Match) -> str:
            content = match.group(1).strip()
            titled = TITLED.match(content)
            if titled:
                title, target = titled.group(1), titled.group(2).strip()
            else:
                target = content
                title = None
            short = target.startswith("~")
            target = target.lstrip("~.")
            if title is None:
                title = target.rsplit(".", 1)[-1] if short else target
            path = self._resolve(obj, pkg, target)
            code = f"<code>{html.escape(title)}</code>"
            if path is None:
                self.unresolved.add((obj.path, target))
                return code
            return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

        return LITERAL_MARKER.sub(r"\1:", ROLE.sub(replace, text))

    def _resolve(self, obj: Any, pkg: griffe.Module, target: str) -> str | None:
        scope = obj
        while scope is not None:
            try:
                return _final_path(scope[target])
            except Exception:
                scope = scope.parent
        root, _, rest = target.partition(".")
        if root == pkg.name and rest:
            name, _, tail = rest.partition(".")
            if name in self.exports:
                return self._resolve(obj, pkg, ".".join(filter(None, (self.exports[name], name, tail))))
            try:
                return _final_path(pkg[rest])
            except Exception:
                return None
        ends = [path for path in self.paths if path.endswith("." + target)]
        return ends[0] if len(ends) == 1 else None
