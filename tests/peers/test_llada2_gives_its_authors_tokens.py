"""LLaDA 2.x: its MoE checkpoints load on transformers' Glm4Moe with the authors' logits, and the ``llada2.1``
preset gives the tokens of the authors' LLaDA 2.1 ``generate`` (token-to-token editing).

Goldens: tests/fixtures/peers/llada2 (a tiny checkpoint built and saved by the authors' ``LLaDA2MoeModelLM``;
``tools/peer_fixtures/llada2.py`` makes and checks them with the authors' code, vendored by ZHZisZZ/dllm).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import refusion
from refusion.errors import ConfigError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "llada2"
GOLDEN = json.loads((FIXTURE / "golden.json").read_text())
LOGITS = load_file(str(FIXTURE / "logits.safetensors"))
#: the CPU kernel family the goldens were made on: bf16 tokens hold there (fixtures/peers/llada2/cpu.json)
MADE_ON = json.loads((FIXTURE / "cpu.json").read_text())["made_on"]
CPU = torch.backends.cpu.get_cpu_capability()
half_precision_here = pytest.mark.skipif(
    MADE_ON != CPU, reason=f"bfloat16 goldens were made on a {MADE_ON} CPU; this one runs {CPU} kernels"
)
BLOCK = GOLDEN["block_length"]


@functools.cache
def model(dtype: str = "bfloat16"):
    return refusion.load_model(str(FIXTURE), dtype=dtype, block_length=BLOCK)


def logits(adapter) -> torch.Tensor:
    ids = LOGITS["ids"]
    positions = torch.arange(ids.shape[1])
    with torch.no_grad():
        out = adapter.model(
            input_ids=ids, position_ids=positions[None], attention_mask=adapter.block_mask(positions, positions, 12)
        )
    return out.logits.float()


def test_float32_logits_equal_the_authors_class():
    assert (logits(model("float32")) - LOGITS["float32"]).abs().max() <= 1e-5


@half_precision_here
def test_bfloat16_logits_equal_the_authors_class_bit_for_bit():
    assert torch.equal(logits(model()), LOGITS["bfloat16"])


def test_the_checkpoint_is_recognised_with_its_ids_and_preset():
    adapter = model("float32")
    assert (adapter.family, adapter.mask_token_id, set(adapter.eos_token_ids)) == ("llada2", 3, {1})
    assert adapter.capabilities.block_length == BLOCK and adapter.preset.reviser.name == "editing"
    assert type(adapter.model).__name__ == "LLaDA2MoeAsGlm4Moe"
    assert adapter.model.config._experts_implementation == "grouped_mm"  # grouped by expert: no loop over tokens


@half_precision_here
@pytest.mark.parametrize("engine", [None, "block-recompute"])
@pytest.mark.parametrize("call", GOLDEN["calls"], ids=lambda c: "-".join(f"{v}" for v in c["kwargs"].values()))
def test_the_preset_gives_llada_2_1s_tokens(call, engine):
    result = refusion.generate(
        call["prompt_ids"],
        model(),
        preset="llada2.1",
        engine=engine,
        temperature=0.0,
        mask_id=3,
        eos_id=1,
        **call["kwargs"],
    )
    assert result.tokens.tolist() == call["tokens"]
    assert result.forwards == call["forwards"]


@pytest.mark.parametrize(
    "argument, value",
    [("temperature", 0.7), ("top_k", 5), ("eos_early_stop", True), ("num_to_transfer", 2), ("block_length", 32)],
)
def test_arguments_it_does_not_reproduce_are_refused_by_name(argument, value):
    with pytest.raises(ConfigError, match=argument):
        refusion.generate([4, 40], model("float32"), preset="llada2.1", **{argument: value})


def test_a_configuration_glm4moe_cannot_reproduce_is_refused_naming_the_field(tmp_path):
    import shutil

    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    config = json.loads((FIXTURE / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "use_bias": True}))
    with pytest.raises(ConfigError, match="use_bias"):
        refusion.load_model(str(tmp_path))
