"""The plugin registry: built-ins, third-party plugins, entry points and every error path."""

import inspect
import json
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from refusion.config import DecoderSpec
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError, PluginError, RefusionWarning, RegistrationError, UnknownNameError
from refusion.plugins import hookspecs
from refusion.plugins.manager import DEFAULT_PLUGINS, DISABLE_ENV, hookimpl, make_plugin_manager
from refusion.plugins.registry import HOOKS, Registry, registry, reset_registry
from refusion.strategies.base import SlotSelector
from tests.support.helpers import tiny
from tests.support.plugins import sample_plugin

HOOK_NAMES = sorted(n for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("register_"))


def with_plugins(*plugins):
    reg = Registry(make_plugin_manager(entry_points=False, extra=plugins))
    reset_registry(reg)
    return reg


def test_builtins_are_registered_under_their_names():
    reg = registry()
    assert set(reg.names("selector")) == {
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
    }
    assert set(reg.names("infiller")) == {"parallel-ar", "greedy-verify", "draft", "denoise"}
    assert reg.names("reviser") == ("none", "wino", "editing")
    assert set(reg.names("reorderer")) == {
        "commit-order",
        "reencode",
        "no-cache",
        "prefix-cache",
        "dual-cache",
        "dkv",
        "periodic",
        "block-causal",
        "sub-block-cache",
    }
    assert reg.names("partitioner") == ("fixed", "semi-ar")
    assert set(reg.names("model_adapter")) == {"hf-block", "hf-causal", "hf-mdm"}
    assert reg.names("model_family") == (
        "llada",
        "dream",
        "sdar",
        "refusion",
        "diffusion-gemma",
        "llada2",
        "fast-dllm-v2",
    )
    assert all(r.source == "built-in" for r in reg)
    assert len(DEFAULT_PLUGINS) == len({r.plugin for r in reg})


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownNameError) as err:
        registry().get("selector", "best")
    assert "Unknown selector 'best'" in str(err.value)
    assert (
        "dream-blocks, dream-steps, entropy, entropy-bound, factor, fast-dllm-v2, leftmost, llada-steps, "
        "llada2-steps, margin, random, sdar-steps, threshold, topk"
    ) in str(err.value)


def test_every_hookspec_is_wired_to_a_kind():
    assert sorted(HOOKS.values()) == HOOK_NAMES


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_every_hook_registers_a_part(kind):
    reg = with_plugins(sample_plugin)
    names = {
        "selector": "rightmost",
        "partitioner": "one-block",
        "infiller": "lossless",
        "reorderer": "exact",
        "reviser": "mask-repeats",
        "model_adapter": "sample-adapter",
        "engine": "recompute",
        "model_family": "sample-family",
    }
    entry = reg.entry(kind, names[kind])
    assert entry.source == "local"
    assert entry.cls.__module__ == "tests.support.plugins.sample_plugin"


def test_every_hook_is_documented_with_its_signature():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "plugin_hooks.md").read_text()
    for name in HOOK_NAMES:
        signature = f"{name}{inspect.signature(getattr(hookspecs, name))}"
        assert signature.replace("'", "") in docs.replace("'", ""), signature


def test_a_plugin_part_decodes_by_name():
    with_plugins(sample_plugin)
    decoder = Decoder.from_names(selector="rightmost", infiller="lossless", reorderer="exact", slot_size=2)
    result = decoder.decode(tiny(), [1, 2, 3], 8, record=True)
    assert [s.selected for s in result.iterations][:2] == [(1,), (0,)]  # rightmost slot of each block first


def test_duplicate_names_are_refused():
    class Again(SlotSelector):
        name = "threshold"

        def select(self, plan):
            return [0]

    class Plugin:
        @hookimpl
        def register_selectors(self, register):
            register(Again)

    with pytest.raises(RegistrationError, match="'threshold' is registered twice"):
        with_plugins(Plugin())


@pytest.mark.parametrize(
    "bad, message",
    [(int, "does not subclass SlotSelector"), (SlotSelector, "does not implement: select"), ("x", "does not subclass")],
)
def test_invalid_classes_are_refused(bad, message):
    class Plugin:
        @hookimpl
        def register_selectors(self, register):
            register(bad)

    with pytest.raises(RegistrationError, match=message):
        with_plugins(Plugin())


def test_a_class_without_its_own_name_is_refused():
    from refusion.strategies.selectors.leftmost import Leftmost

    class Unnamed(Leftmost):
        pass

    class Plugin:
        @hookimpl
        def register_selectors(self, register):
            register(Unnamed)

    with pytest.raises(RegistrationError, match="without a `name`"):
        with_plugins(Plugin())


def test_a_hook_that_raises_is_reported_with_the_plugin_name():
    class Broken:
        @hookimpl
        def register_infillers(self, register):
            raise RuntimeError("boom")

    pm = make_plugin_manager(entry_points=False)
    pm.register(Broken(), name="broken-plugin")
    with pytest.raises(PluginError, match="Plugin 'broken-plugin'.*register_infillers: boom"):
        Registry(pm)


def _fake_distribution(tmp_path, monkeypatch, module_source, name="refusion-fake", ep="fake = refusion_fake_plugin"):
    (tmp_path / "refusion_fake_plugin.py").write_text(textwrap.dedent(module_source))
    info = tmp_path / f"{name.replace('-', '_')}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[refusion]\n{ep}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "refusion_fake_plugin", raising=False)


def test_entry_point_plugins_are_loaded_with_their_distribution(tmp_path, monkeypatch):
    _fake_distribution(
        tmp_path,
        monkeypatch,
        """
        from refusion.plugins import hookimpl
        from refusion.strategies.selectors.leftmost import Leftmost

        class First(Leftmost):
            name = "first"

        @hookimpl
        def register_selectors(register):
            register(First)
    """,
    )
    reg = Registry(make_plugin_manager(entry_points=True))
    entry = reg.entry("selector", "first")
    assert entry.source == "refusion-fake 1.2.3"
    assert entry.plugin == "fake"


BROKEN = "raise ImportError('missing dependency xyz')\n"
FIRST = """
from refusion.plugins import hookimpl
from refusion.strategies.selectors.leftmost import Leftmost

class First(Leftmost):
    name = "first"

@hookimpl
def register_selectors(register):
    register(First)
"""


def test_an_entry_point_that_fails_to_import_is_skipped_with_a_warning_naming_it_and_how_to_disable_it(
    tmp_path, monkeypatch
):
    _fake_distribution(tmp_path, monkeypatch, BROKEN)
    with pytest.warns(RefusionWarning) as caught:
        reg = Registry(make_plugin_manager(entry_points=True))
    (warning,) = [w for w in caught if "it is skipped" in str(w.message)]
    message = str(warning.message)
    assert (
        message.startswith("Plugin 'fake'") and "refusion-fake 1.2.3" in message and "missing dependency xyz" in message
    )
    assert f"{DISABLE_ENV}=fake" in message and warning.filename == __file__
    assert reg.get("selector", "threshold") is not None and not reg.pm.has_plugin("fake")
    assert set(reg.pm.failures) == {"fake"}


def test_the_shipped_model_loads_and_decodes_beside_a_plugin_that_fails_to_import(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, monkeypatch, BROKEN)
    with pytest.warns(RefusionWarning, match="Plugin 'fake' .* failed to import"):
        reset_registry(Registry(make_plugin_manager(entry_points=True)))
    import refusion

    assert refusion.generate("rev abc=").text == "cba"


def test_asking_for_a_part_only_the_failing_plugin_provides_fails_with_its_import_error(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, monkeypatch, BROKEN)
    with pytest.warns(RefusionWarning):
        reset_registry(Registry(make_plugin_manager(entry_points=True)))
    with pytest.raises(UnknownNameError) as err:
        Decoder.from_names(selector="first")
    message = str(err.value)
    assert "Unknown selector 'first'" in message and "threshold" in message  # the known names, as before
    assert "plugin 'fake'" in message and "refusion-fake 1.2.3" in message and "missing dependency xyz" in message
    assert isinstance(err.value.__cause__, ImportError) and err.value.param == "selector"


@pytest.mark.parametrize("setting", ["fake", "refusion_fake", "Refusion-Fake", "other, fake", "all", "*"])
def test_the_environment_variable_disables_entry_point_plugins_by_name_distribution_or_all(
    tmp_path, monkeypatch, setting
):
    _fake_distribution(tmp_path, monkeypatch, BROKEN)
    monkeypatch.setenv(DISABLE_ENV, setting)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a disabled plugin is not even imported: no warning
        pm = make_plugin_manager(entry_points=True)
    assert not pm.failures and not pm.has_plugin("fake")


def test_a_plugin_the_environment_variable_does_not_name_stays_on(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, monkeypatch, FIRST)
    monkeypatch.setenv(DISABLE_ENV, "another-plugin,other-dist")
    assert Registry(make_plugin_manager(entry_points=True)).entry("selector", "first").plugin == "fake"


def test_build_accepts_names_classes_instances_and_import_paths():
    from refusion.strategies.selectors.topk import TopKConfidence

    reg = registry()
    assert reg.build("selector", "topk", k=3) == TopKConfidence(k=3)
    assert reg.build("selector", TopKConfidence, k=2) == TopKConfidence(k=2)
    assert reg.build("selector", "refusion.strategies.selectors.topk:TopKConfidence") == TopKConfidence()
    instance = TopKConfidence(k=4)
    assert reg.build("selector", instance) is instance
    with pytest.raises(ConfigError, match="ready-made"):
        reg.build("selector", instance, k=1)


def test_parameters_are_routed_to_the_part_that_declares_them():
    spec = DecoderSpec.of_parts(selector="topk").with_params({"k": 3, "slot_size": 4, "token_threshold": 0.5})
    decoder = Decoder.from_spec(spec)
    assert decoder.selector.k == 3 and decoder.partitioner.slot_size == 4
    assert decoder.infiller.token_threshold == 0.5


def test_unknown_and_misdirected_parameters_are_explained():
    with pytest.raises(ConfigError) as err:
        Decoder.from_names(slot_sise=4)
    assert "Unknown parameter `slot_sise`" in str(err.value) and "slot_size" in str(err.value)
    with pytest.raises(ConfigError, match="`selector.token_threshold`: selector 'threshold' has no parameter"):
        Decoder.from_names(**{"selector.token_threshold": 0.5})


def test_cli_lists_plugins_as_json(capsys):
    from refusion.cli import main

    assert main(["plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {(r["kind"], r["name"]) for r in rows}
    assert ("selector", "threshold") in names and ("model_adapter", "hf-causal") in names
    threshold = next(r for r in rows if r["name"] == "threshold")
    assert threshold["parameters"] == {"slot_threshold": 0.9, "inclusive": False, "ties": "lowest", "block_length": 0}
    assert threshold["source"] == "built-in"


def test_two_distributions_with_the_same_entry_point_name_are_refused(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, monkeypatch, "")
    other = tmp_path / "second"
    other.mkdir()
    (other / "refusion_other-2.0.dist-info").mkdir()
    (other / "refusion_other-2.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: refusion-other\nVersion: 2.0\n"
    )
    (other / "refusion_other-2.0.dist-info" / "entry_points.txt").write_text(
        "[refusion]\nfake = refusion_fake_plugin\n"
    )
    monkeypatch.syspath_prepend(str(other))
    with pytest.raises(PluginError, match="Entry point name 'fake' .* is already taken"):
        make_plugin_manager(entry_points=True)


def test_a_part_registered_in_process_decodes_by_name_as_its_class_does():
    import refusion
    from refusion.strategies.selectors.topk import TopKConfidence

    @refusion.register
    class TopTwo(TopKConfidence):
        name = "top-two"

    assert registry().entry("selector", "top-two").source == "local"
    by_name = refusion.generate("rev hello=", selector="top-two", k=2)
    by_class = refusion.generate("rev hello=", selector=TopKConfidence(k=2))
    assert by_name.tokens.tolist() == by_class.tokens.tolist()


def test_registering_in_process_is_checked_like_any_plugin_and_replaces_only_on_request():
    import refusion
    from refusion.strategies.selectors.leftmost import Leftmost

    class NotAPart:
        name = "nothing"

    class Again(Leftmost):
        name = "threshold"

    with pytest.raises(RegistrationError, match="subclasses none of refusion's part interfaces"):
        refusion.register(NotAPart)
    with pytest.raises(RegistrationError, match="does not implement: select"):
        refusion.register(type("Abstract", (SlotSelector,), {"name": "abstract"}))
    with pytest.raises(RegistrationError, match="'threshold' is registered twice"):
        refusion.register(Again, replace=True)  # a built-in is never replaced

    first = refusion.register(type("Mine", (Leftmost,), {"name": "mine"}))
    second = type("Mine", (Leftmost,), {"name": "mine"})  # a notebook cell run again
    with pytest.raises(RegistrationError, match="'mine' is registered twice"):
        refusion.register(second)
    assert registry().get("selector", "mine") is first
    assert refusion.register(replace=True)(second) is second and registry().get("selector", "mine") is second
    with pytest.raises(RegistrationError, match="does not implement"):  # a refused replacement keeps the earlier
        refusion.register(type("Mine", (SlotSelector,), {"name": "mine"}), replace=True)
    assert registry().get("selector", "mine") is second
