"""A damaged or hostile checkpoint directory is a ConfigError naming the checkpoint, never a raw library error.

Each case copies the shipped model and breaks one file the way downloads,
disks and hostile uploads do; ``load_model`` must refuse it with
``param == "model"`` and a message naming what is wrong, before transformers
builds a network from nonsense sizes.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

import refusion
from refusion.errors import ConfigError
from refusion.models.default import default_model_path


def _weights(change):
    def damage(path):
        file = path / "model.safetensors"
        file.write_bytes(change(file.read_bytes()))

    return damage


def _config(**fields):
    def damage(path):
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, **fields}))

    return damage


def _tensors(change):
    """Rewrite the weights file with ``change(tensors)`` (a dict of name -> tensor)."""

    def damage(path):
        from safetensors.torch import load_file, save_file

        file = path / "model.safetensors"
        save_file(change(load_file(file)), file, metadata={"format": "pt"})

    return damage


def _as_int32(tensors):
    return {name: (t * 100).to(torch.int32) for name, t in tensors.items()}


def _narrow_embedding(tensors):
    return {**tensors, "model.embed_tokens.weight": tensors["model.embed_tokens.weight"][:40].clone()}


def _config_bytes(data):
    def damage(path):
        (path / "config.json").write_bytes(data)

    return damage


# (name, damage, text the message must contain)
CASES = [
    ("truncated weights", _weights(lambda b: b[: len(b) // 2]), "SafetensorError"),
    ("weights of random bytes", _weights(lambda b: os.urandom(4096)), "SafetensorError"),
    ("empty weights", _weights(lambda b: b""), "SafetensorError"),
    ("weights missing", lambda p: (p / "model.safetensors").unlink(), "could not be loaded as a checkpoint"),
    ("weights for another width", _config(hidden_size=64), "could not be loaded as a checkpoint (RuntimeError"),
    ("negative vocabulary", _config(vocab_size=-5), "`vocab_size` must be an integer in [1, "),
    ("vocabulary as text", _config(vocab_size="abc"), "got 'abc'"),
    ("astronomical width", _config(hidden_size=10**12), "`hidden_size`"),
    ("no layers", _config(num_hidden_layers=0), "`num_hidden_layers`"),
    ("a million layers", _config(num_hidden_layers=10**6), "`num_hidden_layers`"),
    ("fractional heads", _config(num_attention_heads=2.5), "`num_attention_heads`"),
    ("negative positions", _config(max_position_embeddings=-1), "`max_position_embeddings`"),
    ("boolean heads", _config(num_key_value_heads=True), "`num_key_value_heads`"),
    ("model type a number", _config(model_type=5), "`model_type` must be text"),
    ("architectures a string", _config(architectures="Qwen3ForCausalLM"), "`architectures` must be a list"),
    ("config not UTF-8", _config_bytes(b"\xff\xfe{}"), "not UTF-8 text"),
    ("config nested 100000 deep", _config_bytes(b"[" * 100_000), "nested too deeply"),
    (
        "config with a 5000-digit number",
        _config_bytes(b'{"vocab_size": ' + b"9" * 5000 + b"}"),
        "number cannot be read",
    ),
    ("config a list", _config_bytes(b"[1, 2]"), "must hold a JSON object"),
    ("config not JSON", _config_bytes(b"{'vocab_size': 3}"), "not valid JSON"),
    # issue 30: weights that are not numbers, token ids beyond the vocabulary, the report quiet loading hid
    ("weights stored as int32", _tensors(_as_int32), "stores the weight `model.embed_tokens.weight` as I32"),
    ("EOS id beyond the vocabulary", _config(eos_token_id=10**9), "`eos_token_id` must be a token id in [0, 48)"),
    ("an EOS list with a negative id", _config(eos_token_id=[1, -3]), "`eos_token_id` must be a token id"),
    ("mask id beyond the vocabulary", _config(mask_token_id=48), "`mask_token_id` must be a token id in [0, 48)"),
    (
        "embedding of another vocabulary",
        _tensors(_narrow_embedding),
        "model.embed_tokens.weight: MISMATCH (Reinit due to size mismatch - ckpt: torch.Size([40, 128]) vs "
        "model:torch.Size([48, 128]))",
    ),
]


@pytest.mark.parametrize("damage, named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_damaged_checkpoint_is_refused_naming_it(tmp_path, damage, named):
    path = tmp_path / "checkpoint"
    shutil.copytree(default_model_path(), path)
    damage(path)
    with pytest.raises(ConfigError) as info:
        refusion.load_model(str(path))
    assert info.value.param == "model"
    assert named in str(info.value), str(info.value)
    assert str(path) in str(info.value)


def test_the_undamaged_copy_loads(tmp_path):
    path = tmp_path / "checkpoint"
    shutil.copytree(default_model_path(), path)
    assert refusion.generate("rev helloworld=", refusion.load_model(str(path))).text == "dlrowolleh"


def test_a_hub_id_the_hub_cannot_serve_is_refused_at_once(monkeypatch):
    """Neither local nor cached and the hub unreachable (here: a host name that cannot resolve): one ConfigError
    naming `model` at once, instead of huggingface_hub's five retries over about 20 seconds."""
    import time

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.refusion-test.invalid")
    for variable in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        refusion.load_model("no-such-org/no-such-model")
    assert time.monotonic() - started < 8  # the retries alone take over 20 s
    assert info.value.param == "model" and "cannot be reached" in str(info.value)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set"):
        refusion.load_model("no-such-org/no-such-model")
