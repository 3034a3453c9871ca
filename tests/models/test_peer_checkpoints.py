"""Published checkpoint families load with ``refusion.load_model(path)`` alone and reproduce their authors' code.

The fixtures (tests/fixtures/peers/, made by tools/peer_fixtures/make.py in a
transformers-4 environment) are tiny random checkpoints built and saved by
each family's own model class (LLaDA's ``LLaDAModelLM``, Dream's
``DreamModel``, SDAR's ``SDARForCausalLM``, ReFusion's ``Qwen3ForCausalLM``)
with the peer model's logits and the tokens of every peer decoding function
called with its own arguments. Here refusion loads them without any peer code
and must give the same logits (1e-5, float32) and the same tokens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import refusion
from refusion.errors import ConfigError
from refusion.peers import peer_functions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "peers"
FAMILIES = ("llada", "dream", "sdar", "refusion")
ADAPTERS = {"llada": "HFMaskedDiffusionLM", "dream": "HFMaskedDiffusionLM", "sdar": "HFBlockDiffusionLM",
            "refusion": "HFCausalLM"}


def golden(family: str) -> dict:
    return json.loads((FIXTURES / family / "golden.json").read_text())


@pytest.fixture(scope="module")
def models():
    return {family: refusion.load_model(str(FIXTURES / family)) for family in FAMILIES}


def calls() -> list:
    return [pytest.param(family, call, id=f"{family}-{i}-{call['function']}-p{call['prompt']}")
            for family in FAMILIES for i, call in enumerate(golden(family)["calls"])]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_is_recognised_from_config_json_alone(family, models):
    model, expected = models[family], golden(family)
    assert type(model).__name__ == ADAPTERS[family]
    assert model.family == family
    assert model.mask_token_id == expected["mask_token_id"]
    assert set(expected["eos_token_ids"]) <= set(model.eos_token_ids)
    assert model.tokenizer is not None and model.tokenizer.decode([70, 71]) == "ab"
    caps = model.capabilities
    assert (caps.causal, caps.logit_shift, caps.block_length) == {
        "llada": (False, 0, 0), "dream": (False, 1, 0), "sdar": (False, 0, 4), "refusion": (True, 0, 0)}[family]


def forward_logits(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids])
    positions = torch.arange(len(ids))
    mask = model.block_mask(positions, positions, len(ids)) if hasattr(model, "block_mask") else torch.ones_like(x)
    with torch.no_grad():
        return model.forward(x, positions[None], mask, None)[0].float()


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_the_authors_class_in_float32(family, models):
    expected = golden(family)["logits"]
    tensors = load_file(str(FIXTURES / family / expected["file"]))
    for case in expected["cases"]:
        got = forward_logits(models[family], case["input_ids"])
        assert (got - tensors[case["key"]]).abs().max() < 1e-5, case["key"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_lazy_lm_head_projects_like_the_network(family, models):
    model = models[family]
    assert model.head is not None, "no separable LM head found"
    ids = torch.tensor([golden(family)["prompts"][1]])
    positions = torch.arange(ids.shape[1])
    mask = model.block_mask(positions, positions, ids.shape[1]) if hasattr(model, "block_mask") else torch.ones_like(ids)
    with torch.no_grad():
        scores = model.scores(ids, positions[None], mask, None)
        assert torch.allclose(scores.logits, model.forward(ids, positions[None], mask, None), atol=1e-5)


def peer_arguments(call: dict, prompt: list[int]) -> dict:
    args = dict(call["args"])
    if args.get("attention_mask") == "ones_like(prompt)":
        args["attention_mask"] = torch.ones(1, len(prompt), dtype=torch.long)
    return args


@pytest.mark.parametrize("family, call", calls())
def test_each_peer_function_gives_its_tokens_through_its_preset(family, call, models):
    """The preset named after the peer function, called with the peer's own argument names and values."""
    prompt = golden(family)["prompts"][call["prompt"]]
    preset = peer_functions()[call["function"]].preset
    args = peer_arguments(call, prompt)
    if call.get("seed") is not None:
        args["seed"] = call["seed"]
    result = refusion.generate(prompt, models[family], preset=preset, **args)
    got = result.extra["all_tokens"]
    want = call["tokens"]
    assert len(got) == len(want)
    if result.stopped_at_eos and min(got) < 0:  # stopped after the block with the EOS: compare what was decoded
        decoded = [i for i, t in enumerate(got) if t >= 0]
        assert [got[i] for i in decoded] == [want[i] for i in decoded]
    else:
        assert got == want


def test_the_goldens_exercise_multi_token_steps():
    """Guard against fixtures so flat that no threshold ever fires (then a decoder ignoring thresholds would pass)."""
    fast = [c for c in golden("llada")["calls"] if c["function"].startswith("fast_dllm") and c["args"]["threshold"]]
    assert any(c["nfe"] < c["args"]["gen_length"] for c in fast)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_and_device_map_loads(family):
    path = str(FIXTURES / family)
    ids = golden(family)["logits"]["cases"][0]["input_ids"]
    want = load_file(str(FIXTURES / family / "logits.safetensors"))["logits.0"]
    half = refusion.load_model(path, dtype="bfloat16")
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert (forward_logits(half, ids) - want).abs().max() < 0.1 * want.abs().max()
    mapped = refusion.load_model(path, device_map="cpu")
    assert (forward_logits(mapped, ids) - want).abs().max() < 1e-5


def test_sharded_checkpoints_load():
    assert (FIXTURES / "sdar" / "model.safetensors.index.json").is_file()
    assert not (FIXTURES / "sdar" / "model.safetensors").exists()


def poisoned_copy(tmp_path: Path, family: str, module: str) -> tuple[Path, Path]:
    """A copy of a fixture with a ``module``.py that writes a marker file when imported."""
    folder = tmp_path / family
    shutil.copytree(FIXTURES / family, folder)
    marker = tmp_path / "EXECUTED"
    (folder / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').write('checkpoint code ran')\n")
    return folder, marker


@pytest.mark.parametrize("family, module", [("llada", "modeling_llada"), ("dream", "modeling_dream"),
                                            ("sdar", "modeling_sdar"), ("refusion", "modeling_qwen3_refusion")])
def test_no_code_from_the_checkpoint_folder_runs(tmp_path, family, module):
    folder, marker = poisoned_copy(tmp_path, family, module)
    model = refusion.load_model(str(folder), trust_remote_code=False)
    refusion.generate(golden(family)["prompts"][0], model, gen_length=16, preset=FIXTURE_PRESETS[family])
    assert not marker.exists()


FIXTURE_PRESETS = {"llada": "llada", "dream": "dream", "sdar": "sdar", "refusion": "paper"}


def test_an_unknown_custom_architecture_names_the_families_and_the_flag(tmp_path):
    folder, marker = poisoned_copy(tmp_path, "refusion", "modeling_mystery")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="mystery", architectures=["MysteryLM"],
                  auto_map={"AutoModelForCausalLM": "modeling_mystery.MysteryLM"})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as err:
        refusion.load_model(str(folder))
    message = str(err.value)
    assert "llada" in message and "dream" in message and "sdar" in message and "trust_remote_code=True" in message
    assert not marker.exists()


def test_the_cli_never_waits_on_standard_input_for_remote_code(tmp_path):
    folder, marker = poisoned_copy(tmp_path, "refusion", "modeling_mystery")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="mystery", auto_map={"AutoModelForCausalLM": "modeling_mystery.MysteryLM"})
    (folder / "config.json").write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "-m", "refusion.cli", "generate", "--model", str(folder), "ab"],
                          stdin=subprocess.PIPE, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--trust-remote-code" in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()


@pytest.mark.parametrize("family, preset", [("llada", "llada"), ("llada", "fast-dllm-dual"), ("dream", "dream"),
                                            ("dream", "fast-dllm-dream"), ("sdar", "sdar"), ("refusion", "paper")])
def test_generate_from_the_shell(family, preset, capsys):
    from refusion.cli import main

    assert main(["generate", "--model", str(FIXTURES / family), "--preset", preset, "--gen-length", "16", "hello",
                 "-p", "block_length=8" if preset in ("llada", "fast-dllm-dual", "fast-dllm-dream") else "seed=0"]) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() and " forwards" in printed.err and "Traceback" not in printed.err


@pytest.mark.parametrize("preset, args, message", [
    ("llada", dict(logits_eos_inf=True), "`logits_eos_inf`=True of LLaDA's generate is not supported"),
    ("llada", dict(mask_id=5), "`mask_id`=5 of LLaDA's generate is not supported: the model's mask token is 3"),
    ("llada", dict(attention_mask=torch.tensor([[0, 1, 1]])), "`attention_mask`"),
    ("fast-dllm", dict(step_callback=print), "`step_callback`"),
    ("fast-dllm", dict(threshold=0.9, remasking="random"), "`remasking`='random'"),
])
def test_peer_arguments_refusion_does_not_take_are_refused_by_name(preset, args, message, models):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        refusion.generate([70, 71, 72], models["llada"], preset=preset, gen_length=8, **args)


@pytest.mark.parametrize("family, preset, args, message", [
    ("dream", "dream", dict(alg_temp=0.5), "`alg_temp`=0.5"),
    ("dream", "dream", dict(max_length=20), "`max_length`=20"),
    ("dream", "dream", dict(alg="confidence_threshold"), "fast-dllm-dream"),
    ("sdar", "sdar", dict(remasking_strategy="entropy_bounded"), "`remasking_strategy`='entropy_bounded'"),
    ("sdar", "sdar", dict(block_length=8), "--model-block-length"),
    ("sdar", "sdar", dict(stopping_criteria_idx=[7]), "`stopping_criteria_idx`"),
])
def test_other_peer_arguments_are_refused_by_name(family, preset, args, message, models):
    with pytest.raises(ConfigError, match=message):
        refusion.generate([70, 71, 72], models[family], preset=preset, gen_length=8, **args)


def test_every_peer_function_argument_is_handled_by_its_translator():
    """Each argument a peer function takes is either mapped or refused, never an unknown-parameter error."""
    for function in peer_functions().values():
        assert function.arguments, function.name
        assert refusion.config.preset(function.preset).peer == function.name or function.preset == "paper"


def test_a_custom_tokenizer_class_is_read_without_its_code(tmp_path):
    """Dream publishes ``DreamTokenizer`` (remote code); refusion reads its vocabulary with transformers' classes."""
    folder, marker = poisoned_copy(tmp_path, "dream", "tokenization_dream")
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.update(tokenizer_class="DreamTokenizer", auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    model = refusion.load_model(str(folder))
    assert model.tokenizer.decode([70, 71]) == "ab" and not marker.exists()
    (folder / "tokenizer.json").unlink()  # nothing left to read without the code: the model loads, prompts are ids
    with pytest.warns(refusion.errors.RefusionWarning, match="tokenizer could not be loaded"):
        model = refusion.load_model(str(folder))
    assert model.tokenizer is None and not marker.exists()


def test_own_code_runs_only_when_trusted(tmp_path):
    """An architecture outside the families loads with its own code when the user passes trust_remote_code=True."""
    folder, marker = poisoned_copy(tmp_path, "refusion", "modeling_mystery")
    (folder / "configuration_mystery.py").write_text(
        "from transformers import Qwen3Config\n\n\nclass MysteryConfig(Qwen3Config):\n    model_type = 'mystery'\n")
    (folder / "modeling_mystery.py").write_text(
        (folder / "modeling_mystery.py").read_text()
        + "from transformers import Qwen3ForCausalLM\nfrom .configuration_mystery import MysteryConfig\n\n\n"
        "class MysteryLM(Qwen3ForCausalLM):\n    config_class = MysteryConfig\n")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="mystery", architectures=["MysteryLM"],
                  auto_map={"AutoConfig": "configuration_mystery.MysteryConfig",
                            "AutoModelForCausalLM": "modeling_mystery.MysteryLM"})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="trust_remote_code=True"):
        refusion.load_model(str(folder))
    assert not marker.exists()
    model = refusion.load_model(str(folder), trust_remote_code=True, adapter="hf-causal")
    assert marker.exists() and type(model.model).__name__ == "MysteryLM"
    prompt = golden("refusion")["prompts"][0]
    trusted = refusion.generate(prompt, model, gen_length=16)
    assert trusted.tokens.tolist() == refusion.generate(prompt, refusion.load_model(str(FIXTURES / "refusion")),
                                                        gen_length=16).tokens.tolist()
