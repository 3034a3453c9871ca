"""A checkpoint loaded alone decodes with its family's own preset (its ``refusion.json`` first), everywhere.

Was: the default was ``paper`` whatever the family, so ``refusion generate --model LLADA_DIR "hello"`` failed
("infiller 'parallel-ar' needs a model with causal=True") and ``refusion serve --model LLADA_DIR`` answered every
request 400.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import refusion
from refusion.config import PRESETS
from refusion.errors import ConfigError
from refusion.sweep.run import base_preset
from tests.support.serving import ROOT, ServerProcess, free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "peers"
OWN = {"llada": "llada", "dream": "dream", "sdar": "sdar", "refusion": "paper"}


@pytest.mark.parametrize("family", sorted(OWN))
def test_load_model_records_the_family_preset(family):
    model = refusion.load_model(str(FIXTURES / family))
    assert model.preset == PRESETS[OWN[family]]
    assert base_preset(model, None) == PRESETS[OWN[family]]  # what `refusion sweep` starts from


def test_a_checkpoint_refusion_json_comes_before_its_family(tmp_path):
    folder = tmp_path / "llada"
    shutil.copytree(FIXTURES / "llada", folder)
    (folder / "refusion.json").write_text(json.dumps(PRESETS["fast-dllm"].with_params({"gen_length": 16}).to_dict()))
    assert refusion.load_model(str(folder)).preset.peer == "fast_dllm.generate"


@pytest.mark.parametrize("family", sorted(OWN))
def test_generate_without_a_preset_decodes_as_the_family_preset(family):
    model = refusion.load_model(str(FIXTURES / family))
    default = refusion.generate("hello", model, gen_length=16, seed=0)
    named = refusion.generate("hello", model, gen_length=16, seed=0, preset=OWN[family])
    assert default.region_tokens == named.region_tokens


@pytest.mark.parametrize("family", sorted(OWN))
def test_the_shell_decodes_every_family_with_no_preset(family, capsys):
    from refusion.cli import main

    assert main(["generate", "--model", str(FIXTURES / family), "--gen-length", "16", "hello"]) == 0
    printed = capsys.readouterr()
    assert " forwards" in printed.err and "Traceback" not in printed.err


def test_a_preset_that_cannot_run_names_those_that_can():
    with pytest.raises(ConfigError, match="a preset that runs on this model: llada, wino, dream, fast-dllm"):
        refusion.generate("hello", refusion.load_model(str(FIXTURES / "llada")), preset="paper", gen_length=8)


def test_serve_answers_a_plain_request_on_a_llada_checkpoint():
    server = ServerProcess("--model", str(FIXTURES / "llada")).start()
    try:
        name = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        reply = httpx.post(
            server.url + "/v1/completions", json={"model": name, "prompt": "hello", "max_tokens": 16}, timeout=120
        )
    finally:
        server.stop()
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] is not None


def test_serve_refuses_at_start_up_a_default_that_cannot_run():
    """A subprocess, so that a server that starts (the old behaviour) fails the test by its timeout."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "refusion.cli",
            "serve",
            "--model",
            str(FIXTURES / "llada"),
            "--preset",
            "paper",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "a preset that runs on this model: llada" in done.stderr
    assert "Traceback" not in done.stderr
