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
from pathlib import Path

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


# -- the new families (issue 46): their routing, rotary and canvas fields, and the generation config they read -----
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "peers"


def _text_config(**fields):
    def damage(path):
        config = json.loads((path / "config.json").read_text())
        config["text_config"].update(fields)
        (path / "config.json").write_text(json.dumps(config))

    return damage


def _generation(data: bytes):
    def damage(path):
        (path / "generation_config.json").write_bytes(data)

    return damage


def _generation_fields(**fields):
    def damage(path):
        config = json.loads((path / "generation_config.json").read_text())
        (path / "generation_config.json").write_text(json.dumps({**config, **fields}))

    return damage


# (family fixture, name, damage, text the message must contain); every one names the file and the field
FAMILY_CASES = [
    ("llada2", "groups not dividing the experts", _config(n_group=3), "config.json field `n_group` must be a divisor"),
    ("llada2", "no groups", _config(n_group=0), "config.json field `n_group` must be an integer in [1, 8]"),
    ("llada2", "one expert per group", _config(n_group=8), "config.json field `n_group` must be a divisor"),
    (
        "llada2",
        "more chosen groups than groups",
        _config(topk_group=5),
        "field `topk_group` must be an integer in [1, 4]",
    ),
    ("llada2", "no chosen group", _config(topk_group=0), "field `topk_group` must be an integer in [1, 4]"),
    ("llada2", "chosen groups too small", _config(topk_group=1, num_experts_per_tok=3), "field `topk_group` must be"),
    ("llada2", "no expert per token", _config(num_experts_per_tok=0), "field `num_experts_per_tok` must be"),
    ("llada2", "more experts per token than experts", _config(num_experts_per_tok=9), "`num_experts_per_tok`"),
    ("llada2", "experts per token as text", _config(num_experts_per_tok="2"), "`num_experts_per_tok`"),
    ("llada2", "no experts", _config(num_experts=0), "field `num_experts` must be an integer"),
    ("llada2", "rotary twice the head", _config(partial_rotary_factor=2.0), "field `partial_rotary_factor` must be"),
    ("llada2", "no rotary", _config(partial_rotary_factor=0), "field `partial_rotary_factor` must be"),
    ("llada2", "rotary of one dimension", _config(partial_rotary_factor=1 / 16), "`partial_rotary_factor`"),
    ("llada2", "negative dense layers", _config(first_k_dense_replace=-1), "field `first_k_dense_replace`"),
    ("llada2", "no expert width", _config(moe_intermediate_size=0), "field `moe_intermediate_size`"),
    ("llada2", "a negative routed scaling", _config(routed_scaling_factor=-1), "field `routed_scaling_factor`"),
    ("llada2", "generation config not UTF-8", _generation(b"\xff\xfe\x00{}"), "generation_config.json"),
    ("llada2", "generation config not JSON", _generation(b"{eos_token_id: 1"), "not valid JSON"),
    ("llada2", "generation config a list", _generation(b"[1, 2]"), "generation_config.json must hold a JSON object"),
    ("llada2", "generation EOS as text", _generation_fields(eos_token_id="1"), "generation_config.json field `eos"),
    (
        "llada2",
        "generation EOS beyond the vocabulary",
        _generation_fields(eos_token_id=[1, 999]),
        "token id in [0, 128)",
    ),
    ("llada2", "config EOS as text", _config(eos_token_id="1"), "config.json field `eos_token_id`"),
    ("diffusion_gemma", "more experts per token than experts", _text_config(top_k_experts=5), "`text_config.top_k"),
    ("diffusion_gemma", "no experts", _text_config(num_experts=0), "field `text_config.num_experts` must be"),
    ("diffusion_gemma", "no window", _text_config(sliding_window=0), "field `text_config.sliding_window` must be"),
    ("diffusion_gemma", "empty canvas", _config(canvas_length=0), "config.json field `canvas_length` must be"),
    ("diffusion_gemma", "canvas past the positions", _config(canvas_length=10**9), "field `canvas_length` must be"),
    ("diffusion_gemma", "canvas as text", _config(canvas_length="16"), "field `canvas_length` must be"),
    ("diffusion_gemma", "text config a list", _config(text_config=[1]), "field `text_config` must be an object"),
    ("diffusion_gemma", "generation config not UTF-8", _generation(b"\xff{}"), "generation_config.json"),
    (
        "diffusion_gemma",
        "denoising steps for ever",
        _generation_fields(max_denoising_steps=10**9),
        "generation_config.json field `max_denoising_steps` must be an integer in [1, 1024]",
    ),
    ("diffusion_gemma", "no denoising step", _generation_fields(max_denoising_steps=0), "`max_denoising_steps`"),
    ("diffusion_gemma", "answer of no tokens", _generation_fields(max_new_tokens=0), "field `max_new_tokens` must be"),
    ("diffusion_gemma", "answer as text", _generation_fields(max_new_tokens="16"), "field `max_new_tokens` must be"),
    ("diffusion_gemma", "sampler config a list", _generation_fields(sampler_config=[1]), "field `sampler_config`"),
    (
        "diffusion_gemma",
        "negative entropy bound",
        _generation_fields(sampler_config={"entropy_bound": -1}),
        "field `sampler_config.entropy_bound` must be",
    ),
]


@pytest.mark.parametrize(
    "family, damage, named", [(c[0], *c[2:]) for c in FAMILY_CASES], ids=[f"{c[0]}: {c[1]}" for c in FAMILY_CASES]
)
def test_a_damaged_new_family_checkpoint_is_refused_naming_the_file_and_field(tmp_path, family, damage, named):
    path = tmp_path / "checkpoint"
    shutil.copytree(FIXTURES / family, path)
    damage(path)
    with pytest.raises(ConfigError) as info:
        refusion.load_model(str(path))
    assert info.value.param == "model"
    assert named in str(info.value), str(info.value)
    assert str(path) in str(info.value)
    assert "could not be loaded as a checkpoint" not in str(info.value)  # refused by name, not by the loader


@pytest.mark.parametrize("family", ["llada2", "diffusion_gemma"])
def test_the_undamaged_new_family_copies_load_with_their_generation_settings(tmp_path, family):
    path = tmp_path / "checkpoint"
    shutil.copytree(FIXTURES / family, path)
    model = refusion.load_model(str(path))
    assert model.eos_token_ids == frozenset({1})  # from generation_config.json
