"""The example plugin package installs, registers through its entry point and decodes by name."""

import subprocess
import sys
from pathlib import Path

import pytest

from refusion.decoding.decoder import Decoder
from refusion.plugins.manager import make_plugin_manager
from refusion.plugins.registry import Registry, reset_registry
from refusion.testing import check_part
from tests.support.helpers import tiny

TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "plugin_template"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(TEMPLATE),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return target


def test_installed_plugin_is_found_and_decodes_by_name(installed, monkeypatch):
    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.delitem(sys.modules, "refusion_window_selector", raising=False)
    registry = Registry(make_plugin_manager(entry_points=True))
    reset_registry(registry)
    entry = registry.entry("selector", "window")
    assert entry.source.replace("_", "-") == "refusion-window-selector 0.1.0"
    assert entry.parameters() == {"width": 2, "threshold": 0.9}
    decoder = Decoder.from_names(selector="window", width=1, threshold=0.5, slot_size=2, serial_num_blocks=1)
    result = decoder.decode(tiny(vocab=16, seed=3), [1, 2], 8, record=True)
    assert [s.selected for s in result.iterations] == [(0,), (1,), (2,), (3,)]  # a window of one slot is left to right
    check_part(registry.build("selector", "window"), trials=2)


def test_cli_lists_the_plugin_with_its_package(installed, monkeypatch, capsys):
    import json

    from refusion.cli import main

    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.delitem(sys.modules, "refusion_window_selector", raising=False)
    reset_registry(None)  # the CLI builds the process registry, entry points included
    assert main(["plugins", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["window"]["source"].replace("_", "-") == "refusion-window-selector 0.1.0"
    assert rows["window"]["package"] == "refusion_window_selector"
