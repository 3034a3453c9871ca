"""The plugin manager: built-in parts as default plugins, third parties via entry points.

Built-ins register themselves in the module that defines them (a module-level
``@hookimpl`` function); :data:`DEFAULT_PLUGINS` lists those modules. Third
parties declare ``[project.entry-points.refusion]`` in their pyproject; entry
points are loaded when the registry is first built, never at import time.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import pluggy

from refusion.errors import PluginError

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
    "refusion.strategies.selectors.llada2_steps",
    "refusion.strategies.infillers.parallel_ar",
    "refusion.strategies.infillers.greedy_verify",
    "refusion.strategies.infillers.draft",
    "refusion.strategies.infillers.denoise",
    "refusion.strategies.reorderers.commit_order",
    "refusion.strategies.reorderers.reencode",
    "refusion.strategies.reorderers.fast_dllm",
    "refusion.strategies.reorderers.no_cache",
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
    "refusion.engines.repeat",
    "refusion.engines.branch",
    "refusion.engines.canvas",
    "refusion.engines.block",
    "refusion.engines.denoiser",
)


BUILTIN = "built-in"


class PluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers where each plugin came from.

    ``sources`` maps a plugin name to ``"built-in"``, ``"<distribution> <version>"``
    or ``"local"`` (registered in code).
    """

    def __init__(self) -> None:
        super().__init__("refusion")
        self.sources: dict[str, str] = {}

    def register(self, plugin: object, name: str | None = None, *, source: str = "local") -> str | None:
        registered = super().register(plugin, name)
        if registered is not None:
            self.sources[registered] = source
        return registered


def make_plugin_manager(*, entry_points: bool = True, extra: tuple[object, ...] = ()) -> PluginManager:
    """A plugin manager with the built-ins, ``extra`` plugin objects and (optionally) entry points."""
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
    """Load every entry point of ``group``; an import failure names the plugin and its distribution."""
    count = 0
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != group or pm.is_blocked(ep.name):
                continue
            dist_name = dist.metadata["Name"]
            if pm.has_plugin(ep.name):
                if pm.sources.get(ep.name, "").split(" ")[0] == dist_name:
                    continue  # the same distribution seen twice on sys.path
                raise PluginError(
                    f"Entry point name {ep.name!r} of distribution {dist_name} {dist.version} is already taken by "
                    f"{pm.sources.get(ep.name, 'another plugin')}; rename one of them.",
                    plugin=ep.name,
                    source=dist_name,
                )
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"Plugin {ep.name!r} (entry point {ep.value!r} of distribution {dist_name} {dist.version}) "
                    f"failed to import: {exc}",
                    plugin=ep.name,
                    source=dist_name,
                ) from exc
            pm.register(plugin, name=ep.name, source=f"{dist_name} {dist.version}")
            count += 1
    return count
