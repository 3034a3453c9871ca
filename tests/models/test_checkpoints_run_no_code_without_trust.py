"""A checkpoint folder never runs or imports code of its own without ``trust_remote_code=True``, by any path, and
nothing ever asks on standard input whether it may (issue 30).

Each hostile checkpoint holds a marker module that writes a file when it is
imported; the loads run in a subprocess whose standard input answers ``y``
(what a user pressing Enter on transformers' "Do you wish to run the custom
code? [y/N]" would not even be asked).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from refusion.models.default import default_model_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "peers"
PROMPT = "Do you wish to run the custom code"


def marker_module(folder: Path, name: str, marker: Path) -> None:
    """``folder/name.py``: writes ``marker`` when imported, and defines a config class and a selector-like class."""
    (folder / f"{name}.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
        "class Sel:\n    pass\n"
    )


def run(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, input="y\ny\ny\n", capture_output=True, text=True, timeout=240
    )


@pytest.fixture
def tokenizer_checkpoint(tmp_path, request):
    """A LLaDA checkpoint (recognised from its auto_map) whose tokenizer_config.json names a transformers auto class
    and whose config.json's auto_map points AutoConfig at the folder's own marker module."""
    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "llada", folder)
    marker = tmp_path / "imported"
    marker_module(folder, "configuration_evil", marker)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"]["AutoConfig"] = "configuration_evil.EvilConfig"
    (folder / "config.json").write_text(json.dumps(config))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["tokenizer_class"] = request.param
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder, marker


@pytest.mark.parametrize("tokenizer_checkpoint", ["AutoModelForCausalLM", "AutoTokenizer", "AutoConfig"], indirect=True)
def test_a_tokenizer_class_that_is_not_a_tokenizer_runs_no_code(tokenizer_checkpoint):
    folder, marker = tokenizer_checkpoint
    done = run(
        "import sys, refusion; m = refusion.load_model(sys.argv[1]); print(type(m.tokenizer).__name__)",
        folder.parent,
        str(folder),
    )
    assert PROMPT not in done.stdout + done.stderr, done.stdout + done.stderr
    assert not marker.exists(), "the checkpoint's module was imported"
    assert done.returncode == 0, done.stderr  # the vocabulary is read from tokenizer.json instead
    assert "Tokenizer" in done.stdout or "Backend" in done.stdout


def test_the_tokenizer_loader_takes_only_transformers_tokenizer_classes():
    from refusion.models.files import tokenizer_class

    assert tokenizer_class("TokenizersBackend") is not None and tokenizer_class("Qwen2Tokenizer") is not None
    for name in ("AutoTokenizer", "AutoModelForCausalLM", "PreTrainedModel", "os", "", None, 5, "__class__"):
        assert tokenizer_class(name) is None, name


@pytest.fixture
def preset_checkpoint(tmp_path):
    """A copy of the shipped model whose refusion.json names its selector by a path into the folder's own module."""
    folder = tmp_path / "ckpt"
    shutil.copytree(default_model_path(), folder)
    marker = tmp_path / "imported"
    marker_module(folder, "ckpt_selector", marker)
    preset = json.loads((folder / "refusion.json").read_text())
    preset["selector"] = {"name": "ckpt_selector:Sel", "params": {}}
    (folder / "refusion.json").write_text(json.dumps(preset))
    return folder, marker


CLI = "import sys; from refusion.cli import main; sys.exit(main(sys.argv[1:]))"


def test_a_preset_naming_a_module_path_is_refused_from_inside_the_folder(preset_checkpoint):
    folder, marker = preset_checkpoint
    done = run(CLI, folder, "generate", "rev ab=", "--model", ".")  # -c: the current directory is on sys.path
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refusion.json" in done.stderr and "`selector` = 'ckpt_selector:Sel'" in done.stderr, done.stderr
    assert "trust_remote_code=True" in done.stderr and not marker.exists()


def test_the_python_api_refuses_the_preset_before_loading_weights(preset_checkpoint, monkeypatch):
    import refusion
    from refusion.errors import ConfigError

    folder, marker = preset_checkpoint
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(ConfigError) as info:
        refusion.load_model(str(folder))
    assert info.value.param == "model" and "ckpt_selector:Sel" in str(info.value) and not marker.exists()
    sys.modules.pop("ckpt_selector", None)


def test_trust_remote_code_lets_the_checkpoint_name_its_own_parts(preset_checkpoint):
    folder, marker = preset_checkpoint
    run(CLI, folder, "generate", "rev ab=", "--model", ".", "--trust-remote-code")
    assert marker.exists()  # trusted: the preset's part was imported (it is not a real selector, so decoding fails)


@pytest.mark.parametrize("family", ["llada", "refusion"])
def test_no_hub_kernels_are_fetched_on_any_load_path(family, monkeypatch):
    """transformers 5.x fetches and runs hub kernels (``kernels-community/rotary``) on a GPU unless told not to: the
    stock-class path and the family path both tell it (a lent H200 refused them: "could not verify publisher trust")."""
    import transformers

    import refusion

    seen = []
    for cls in (transformers.LlamaForCausalLM, transformers.Qwen3ForCausalLM, transformers.AutoModelForCausalLM):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, **kwargs):
            seen.append(kwargs.get("use_kernels"))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    path = FIXTURES / family if family == "llada" else default_model_path()
    refusion.load_model(str(path))
    assert seen and all(flag is False for flag in seen), seen
