"""The plugin manager: built-in parts as default plugins, third parties via entry points.

Built-ins register themselves in the module that defines them (a module-level
``@hookimpl`` function); :data:`DEFAULT_PLUGINS` lists those modules. Third
parties declare ``[project.entry-points.refusion]`` in their pyproject; entry
points are loaded when the registry is first built, never at import time.
An entry point that fails to import is skipped with a warning naming it, its
distribution and how to disable it (:data:`DISABLE_ENV`), and remembered
(:attr:`PluginManager.failures`): asking for a name no other plugin provides
then fails with its import error. :data:`DISABLE_ENV` turns entry points off
by name, by distribution, or all of them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Mapping

import attrs
import pluggy

from refusion.errors import PluginError, warn_caller

hookimpl = pluggy.HookimplMarker("refusion")

ENTRY_POINT_GROUP = "refusion"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "refusion.strategies.partitioners.fixed",
    "refusion.strategies.partitioners.semi_ar",
    "refusion.strategies.selectors.threshold",
    "refusion.strategies.selectors.leftmost",
    "refusion.strategies.selectors.topk",
    "refusion.strategies.selectors.margin",
    "refusion.strategies.selectors.entropy",
    "refusion.strategies.selectors.random",
    "refusion.strategies.selectors.factor",
    "refusion.strategies.selectors.llada_steps",
    "refusion.strategies.selectors.dream_steps",
    "refusion.strategies.selectors.dream_blocks",
    "refusion.strategies.selectors.sdar_steps",
    "refusion.strategies.selectors.wino",
    "refusion.strategies.selectors.entropy_bound",
    "refusion.strategies.selectors.credit",
    "refusion.strategies.selectors.d3llm",
    "refusion.strategies.selectors.llada2_steps",
    "refusion.strategies.selectors.fast_dllm_v2",
    "refusion.strategies.selectors.d2f",
    "refusion.strategies.infillers.parallel_ar",
    "refusion.strategies.infillers.greedy_verify",
    "refusion.strategies.infillers.draft",
    "refusion.strategies.infillers.denoise",
    "refusion.strategies.reorderers.commit_order",
    "refusion.strategies.reorderers.reencode",
    "refusion.strategies.reorderers.fast_dllm",
    "refusion.strategies.reorderers.no_cache",
    "refusion.strategies.reorderers.dkv",
    "refusion.strategies.reorderers.periodic",
    "refusion.strategies.reorderers.block_causal",
    "refusion.strategies.reorderers.sub_block_cache",
    "refusion.strategies.revisers.none",
    "refusion.strategies.revisers.wino",
    "refusion.strategies.revisers.editing",
    "refusion.models.hf",
    "refusion.models.mdm",
    "refusion.models.block",
    "refusion.models.families.llada",
    "refusion.models.families.dream",
    "refusion.models.families.sdar",
    "refusion.models.families.refusion",
    "refusion.models.families.diffusion_gemma",
    "refusion.models.families.llada2",
    "refusion.models.families.fast_dllm_v2",
    "refusion.engines.repeat",
    "refusion.engines.branch",
    "refusion.engines.canvas",
    "refusion.engines.block",
    "refusion.engines.denoiser",
)


BUILTIN = "built-in"

#: the names :data:`DEFAULT_PLUGINS` register, by kind, known without importing them: the command line checks a
#: part name against them while it parses (:func:`listed_names`); a test keeps them equal to the registry's
BUILTIN_NAMES: dict[str, tuple[str, ...]] = {
    "partitioner": ("fixed", "semi-ar"),
    "selector": (
        "threshold",
        "leftmost",
        "topk",
        "margin",
        "entropy",
        "random",
        "factor",
        "llada-steps",
        "dream-steps",
        "dream-blocks",
        "sdar-steps",
        "wino",
        "entropy-bound",
        "llada2-steps",
        "credit",
        "d3llm",
        "fast-dllm-v2",
        "d2f",
    ),
    "infiller": ("parallel-ar", "greedy-verify", "draft", "denoise"),
    "reorderer": (
        "commit-order",
        "reencode",
        "prefix-cache",
        "dual-cache",
        "no-cache",
        "dkv",
        "periodic",
        "block-causal",
        "sub-block-cache",
    ),
    "reviser": ("none", "wino", "editing"),
    "model_adapter": ("hf-causal", "hf-mdm", "hf-block"),
    "model_family": ("llada", "dream", "sdar", "refusion", "diffusion-gemma", "llada2", "fast-dllm-v2"),
    "engine": ("repeat", "branch", "canvas", "block", "block-recompute", "denoiser"),
}

#: the environment variable that turns entry-point plugins off: ``all`` (or ``*``), or a comma-separated list of
#: entry-point names or distribution names (``REFUSION_DISABLE_PLUGINS=my_plugin,other-dist``)
DISABLE_ENV = "REFUSION_DISABLE_PLUGINS"


@attrs.frozen
class PluginFailure:
    """An entry-point plugin that failed to import: its name, entry point, distribution and the error it raised."""

    name: str
    value: str  # the entry point's object reference, ``"package.module"`` or ``"package.module:obj"``
    distribution: str
    version: str
    error: BaseException = attrs.field(eq=False)

    def describe(self) -> str:
        """``plugin 'x' (entry point 'mod' of distribution d 1.0) failed to import: ImportError: ...``"""
        return (
            f"plugin {self.name!r} (entry point {self.value!r} of distribution {self.distribution} {self.version}) "
            f"failed to import: {type(self.error).__name__}: {self.error}"
        )

    def remedy(self) -> str:
        """How to run without it."""
        return (
            f"set {DISABLE_ENV}={self.name} to skip it without a warning, {DISABLE_ENV}=all to skip every "
            f"entry-point plugin, or fix or uninstall {self.distribution}"
        )


def disabled_plugins(environ: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """The entry points :data:`DISABLE_ENV` turns off: ``None`` for all of them, else the names (entry-point or
    distribution names, compared case-insensitively with ``-`` and ``_`` alike); empty when it is unset."""
    text = (os.environ if environ is None else environ).get(DISABLE_ENV, "")
    names = frozenset(_normal(n) for n in text.split(",") if n.strip())
    return None if names & {"all", "*"} else names


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def listed_names(kind: str, group: str = ENTRY_POINT_GROUP) -> tuple[str, ...] | None:
    """Every name registered for ``kind``, found without importing any part module: the built-ins'
    (:data:`BUILTIN_NAMES`) when no entry-point plugin is on; ``None`` when one is (only importing it can tell
    what it registers)."""
    disabled = disabled_plugins()
    if disabled is not None:
        for dist in importlib.metadata.distributions():
            for ep in dist.entry_points:
                if ep.group == group and not {_normal(ep.name), _normal(dist.metadata["Name"] or "")} & disabled:
                    return None
    return BUILTIN_NAMES[kind]


class PluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers where each plugin came from.

    ``sources`` maps a plugin name to ``"built-in"``, ``"<distribution> <version>"``
    or ``"local"`` (registered in code); ``failures`` maps the name of each
    entry-point plugin that failed to import (and was skipped) to its
    :class:`PluginFailure`.
    """

    def __init__(self) -> None:
        super().__init__("refusion")
        self.sources: dict[str, str] = {}
        self.failures: dict[str, PluginFailure] = {}

    def register(self, plugin: object, name: str | None = None, *, source: str = "local") -> str | None:
        registered = super().register(plugin, name)
        if registered is not None:
            self.sources[registered] = source
        return registered


def make_plugin_manager(*, entry_points: bool = True, extra: tuple[object, ...] = ()) -> PluginManager:
    """A plugin manager with the built-ins, ``extra`` plugin objects and (optionally) the entry points that
    :data:`DISABLE_ENV` leaves on."""
    from refusion.plugins import hookspecs

    pm = PluginManager()
    pm.add_hookspecs(hookspecs)
    for module_name in DEFAULT_PLUGINS:
        pm.register(importlib.import_module(module_name), name=module_name, source=BUILTIN)
    for plugin in extra:
        pm.register(plugin)
    if entry_points:
        load_entry_points(pm)
    check_hooks(pm)
    return pm


def check_hooks(pm: PluginManager) -> None:
    """Refuse a plugin that implements a hook refusion does not define (a misspelt ``register_*``).

    pluggy's ``check_pending()`` finds them; the error names the plugin, where
    it came from, the unknown hook and the hooks that exist.
    """
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        unknown = sorted(
            name
            for name in vars(pm.hook)
            if not name.startswith("_")
            and not getattr(pm.hook, name).has_spec()
            and any(i.plugin is exc.plugin for i in getattr(pm.hook, name).get_hookimpls())
        )
        plugin = pm.get_name(exc.plugin) or repr(exc.plugin)
        known = sorted(name for name in vars(pm.hook) if not name.startswith("_") and getattr(pm.hook, name).has_spec())
        raise PluginError(
            f"Plugin {plugin!r} ({pm.sources.get(plugin, 'local')}) implements unknown hook(s) {', '.join(unknown)}; "
            f"refusion's hooks are: {', '.join(known)} (is the name misspelt?).",
            plugin=plugin,
            source=pm.sources.get(plugin),
        ) from exc


def load_entry_points(pm: PluginManager, group: str = ENTRY_POINT_GROUP) -> int:
    """Load every entry point of ``group`` that :data:`DISABLE_ENV` leaves on; returns how many were registered.

    One that fails to import is skipped with a :class:`~refusion.errors.RefusionWarning` naming the plugin, its
    distribution, the error and how to disable it, and kept in ``pm.failures`` (so that asking for a part only it
    could provide names its import error). Two distributions declaring one name are refused (:class:`PluginError`).
    """
    disabled = disabled_plugins()
    count = 0
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != group or pm.is_blocked(ep.name):
                continue
            dist_name = dist.metadata["Name"]
            if disabled is None or {_normal(ep.name), _normal(dist_name or "")} & disabled:
                continue
            if pm.has_plugin(ep.name) or ep.name in pm.failures:
                failed = pm.failures.get(ep.name)
                seen = pm.sources.get(ep.name) or (f"{failed.distribution} {failed.version}" if failed else "")
                if seen.split(" ")[0] == dist_name:
                    continue  # the same distribution seen twice on sys.path
                raise PluginError(
                    f"Entry point name {ep.name!r} of distribution {dist_name} {dist.version} is already taken by "
                    f"{seen.strip() or 'another plugin'}; rename one of them.",
                    plugin=ep.name,
                    source=dist_name,
                )
            try:
                plugin = ep.load()
            except Exception as exc:
                failure = PluginFailure(ep.name, ep.value, dist_name, dist.version, exc)
                pm.failures[ep.name] = failure
                said = failure.describe()
                warn_caller(f"{said[0].upper()}{said[1:]}; it is skipped ({failure.remedy()}).")
                continue
            pm.register(plugin, name=ep.name, source=f"{dist_name} {dist.version}")
            count += 1
    return count
