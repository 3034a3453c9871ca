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


# -- every form a refusion.json may name a class in, refused before any import, from inside the folder --------------
def _spec(**parts):
    return {"format": "refusion.decoder/1", "gen_length": 16, **parts}


#: form -> refusion.json naming the folder's module ``mod`` (``this``: the standard module, imported with a print)
PRESET_FORMS = {
    "earlier-selector": lambda mod: {"gen_length": 16, "selector": f"{mod}:X"},
    "earlier-selector-with-params": lambda mod: {"gen_length": 16, "selector": f"{mod}:X", "params": {"k": 1}},
    "earlier-reviser": lambda mod: {"gen_length": 16, "reviser": f"{mod}:Rev", "params": {}},
    "earlier-engine-param": lambda mod: {"gen_length": 16, "params": {"engine": f"{mod}:X"}},
    "spec-reviser": lambda mod: _spec(reviser={"name": f"{mod}:Rev", "params": {"post_fill_passes": 3}}),
    "spec-engine": lambda mod: _spec(engine=f"{mod}:X"),
    "record-class": lambda mod: {
        "sample": "greedy",
        **{kind: {"name": name} for kind, name in (("partitioner", "fixed"), ("infiller", "parallel-ar"))},
        **{kind: {"name": name} for kind, name in (("reorderer", "commit-order"), ("reviser", "none"))},
        "selector": {"name": "threshold", "class": f"{mod}:X"},
    },
}


@pytest.fixture
def hostile_folders(tmp_path):
    """One copy of the shipped model per form and module (its own ``mod_<form>.py``, or the standard ``this``),
    all under ``tmp_path/folders``; markers under ``tmp_path/markers``."""
    shipped = default_model_path()
    (tmp_path / "markers").mkdir()
    folders = []
    for form, preset in PRESET_FORMS.items():
        for module in (f"mod_{form.replace('-', '_')}", "this"):
            folder = tmp_path / "folders" / f"{form}-{module}"
            shutil.copytree(shipped, folder)
            marker_module(folder, module if module != "this" else "unused", tmp_path / "markers" / module)
            if module != "this":
                (folder / f"{module}.py").write_text(
                    (folder / f"{module}.py").read_text() + "class X:\n    pass\nclass Rev:\n    pass\n"
                )
            (folder / "refusion.json").write_text(json.dumps(preset(module)))
            folders.append(folder)
    return folders


# each folder loaded from inside it (the current directory is on sys.path, as under `python -c`): refused, naming
# `model` and the file, nothing imported; "this" must not be imported either (it prints the Zen of Python)
PYTHON_LOADS = """
import json, os, sys
import refusion
from refusion.errors import ConfigError
out = {}
for folder in sys.argv[1:]:
    os.chdir(folder)
    try:
        refusion.load_model(".")
        out[folder] = "loaded"
    except ConfigError as exc:
        out[folder] = [type(exc).__name__, exc.param, str(exc)]
out["this imported"] = "this" in sys.modules
print(json.dumps(out))
"""

CLI_LOADS = """
import json, os, sys
from refusion.cli import main
codes = {}
for folder in sys.argv[1:]:
    os.chdir(folder)
    codes[folder] = main(["generate", "ab", "--model", "."])
codes["this imported"] = "this" in sys.modules
print("CODES" + json.dumps(codes))
"""


def _refused_everywhere(folders, markers):
    assert not any(markers.iterdir()), sorted(p.name for p in markers.iterdir())  # no module was imported


def test_a_checkpoint_naming_a_module_in_any_form_imports_nothing_from_python(hostile_folders, tmp_path):
    done = run(PYTHON_LOADS, tmp_path, *map(str, hostile_folders))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out.pop("this imported") is False and "Beautiful is better" not in done.stdout
    for folder, result in out.items():
        assert result != "loaded", folder
        kind, param, message = result
        assert kind == "ImportRefused" and param == "model", (folder, result)
        assert "refusion.json" in message and "trust_remote_code=True" in message, message
    _refused_everywhere(hostile_folders, tmp_path / "markers")


def test_a_checkpoint_naming_a_module_in_any_form_imports_nothing_from_the_command_line(hostile_folders, tmp_path):
    done = run(CLI_LOADS, tmp_path, *map(str, hostile_folders))  # the CLI adds the current directory to sys.path
    assert done.returncode == 0, done.stderr
    codes = json.loads(done.stdout.split("CODES")[-1])
    assert codes.pop("this imported") is False and "Beautiful is better" not in done.stdout
    assert set(codes.values()) == {2}, codes
    assert done.stderr.count("names a class by module path") == len(hostile_folders), done.stderr
    assert "Traceback" not in done.stderr
    _refused_everywhere(hostile_folders, tmp_path / "markers")


def test_reading_a_spec_with_imports_refused_imports_nothing_by_any_path(tmp_path, monkeypatch):
    """The guard under the raw check: whatever part of the spec reader reaches a module path is refused there."""
    from refusion.config import DecoderSpec
    from refusion.config.trust import no_imports
    from refusion.decoding.decoder import Decoder
    from refusion.errors import ImportRefused

    marker_module(tmp_path, "guarded_mod", tmp_path / "imported")
    (tmp_path / "guarded_mod.py").write_text((tmp_path / "guarded_mod.py").read_text() + "class X:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for form, preset in PRESET_FORMS.items():
        with no_imports(where="test file", opt_in="Trust it."):
            try:
                Decoder.from_spec(DecoderSpec.from_dict(preset("guarded_mod"), where="test file"))
            except ImportRefused as exc:
                assert "guarded_mod:X" in str(exc) or "guarded_mod:Rev" in str(exc), (form, exc)
                assert "Trust it." in str(exc)
            else:
                raise AssertionError(f"{form}: a module path was built with imports refused")
        assert not (tmp_path / "imported").exists(), form
    assert "guarded_mod" not in sys.modules
