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
    ("config with a 5000-digit number", _config_bytes(b'{"vocab_size": ' + b"9" * 5000 + b"}"), "number cannot be read"),
    ("config a list", _config_bytes(b"[1, 2]"), "must hold a JSON object"),
    ("config not JSON", _config_bytes(b"{'vocab_size': 3}"), "not valid JSON"),
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
