"""The model shipped inside the package: loads offline and answers fixed prompts."""

import os
import subprocess
import sys

import pytest

import refusion
from refusion.models.default import default_model_path
from refusion.training.tasks import Example, is_correct

FIXED = [
    Example("copy", "copy hello=", "hello"),
    Example("reverse", "rev abcdef=", "fedcba"),
    Example("repeat", "rep 3 ab=", "ababab"),
    Example("sort", "sort dcba=", "abcd"),
    Example("add", "add 158+267=", "524"),
]


@pytest.fixture(scope="module")
def model():
    return refusion.load_model(None, dtype="float32")


def test_the_default_model_ships_with_weights_and_tokenizer():
    path = default_model_path()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training.json", "refusion.json"):
        assert (path / name).exists(), name
    assert (path / "model.safetensors").stat().st_size < 8 * 2**20


@pytest.mark.parametrize("example", FIXED, ids=[e.prompt for e in FIXED])
def test_paper_decoding_answers_fixed_prompts(model, example):
    result = refusion.generate(example.prompt, model)  # the model's own refusion.json settings
    assert is_correct(example, result.text), result.text


@pytest.mark.parametrize("example", FIXED[:3], ids=[e.prompt for e in FIXED[:3]])
def test_lossless_decoding_answers_fixed_prompts(model, example):
    result = refusion.generate(example.prompt, model, preset="ar", gen_length=32)
    assert is_correct(example, result.text), result.text


def test_parallel_decoding_needs_fewer_forwards_than_tokens(model):
    result = refusion.generate(
        "copy abcdefghijklmnop=",
        model,
        gen_length=32,
        slot_size=4,
        serial_num_blocks=1,
        slot_threshold=0.7,
        token_threshold=0.5,
    )
    assert result.text == "abcdefghijklmnop"
    assert result.forwards < len(result.tokens)


def test_cli_generates_offline_with_the_default_model():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "refusion.cli", "generate", "rev helloworld="],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "dlrowolleh"
    assert "Loading weights" not in out.stderr
