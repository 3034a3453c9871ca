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
from tests.support.kernels import cpu_kernel_family

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "llada2"
GOLDEN = json.loads((FIXTURE / "golden.json").read_text())
LOGITS = load_file(str(FIXTURE / "logits.safetensors"))
#: the CPU kernel family the goldens were made on: bf16 tokens hold there (fixtures/peers/llada2/cpu.json)
MADE_ON = json.loads((FIXTURE / "cpu.json").read_text())["made_on"]
CPU = cpu_kernel_family()
half_precision_here = pytest.mark.skipif(
    MADE_ON != CPU, reason=f"bfloat16 goldens were made on a {MADE_ON} CPU; this one runs {CPU} kernels"
)
BLOCK = GOLDEN["block_length"]


@functools.cache
def model(dtype: str = "bfloat16", eos: int | None = None):
    options = {} if eos is None else {"eos_token_id": eos}
    return refusion.load_model(str(FIXTURE), dtype=dtype, block_length=BLOCK, **options)


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
    assert adapter.capabilities.block_length == BLOCK and adapter.preset.selector.name == "llada2-steps"
    assert type(adapter.model).__name__ == "LLaDA2MoeAsGlm4Moe"
    assert adapter.model.config._experts_implementation == "grouped_mm"  # grouped by expert: no loop over tokens


PRESETS = {"llada2.generate": "llada2", "llada21.generate": "llada2.1"}


def label(call: dict) -> str:
    return call["function"] + "-" + "-".join(f"{v}" for v in call["kwargs"].values() if v is not None)


@half_precision_here
@pytest.mark.parametrize("engine", [None, "block-recompute"])
@pytest.mark.parametrize("call", GOLDEN["calls"], ids=label)
def test_the_presets_give_the_authors_tokens(call, engine):
    """Greedy and seeded sampling, edits (LLaDA 2.1, sampled edits too), EOS; on the cached and the recomputing
    engine."""
    kwargs = dict(call["kwargs"])
    result = refusion.generate(
        call["prompt_ids"],
        model("bfloat16", kwargs["eos_id"]),
        preset=PRESETS[call["function"]],
        engine=engine,
        seed=call.get("seed", 0),
        mask_id=3,
        **kwargs,
    )
    assert result.tokens.tolist() == call["tokens"]
    assert result.forwards == call["forwards"]


def test_edits_are_counted_in_the_trace(tmp_path):
    from refusion.measure.trace import read_trace

    call = next(
        c for c in GOLDEN["calls"] if c["function"] == "llada21.generate" and c["kwargs"]["editing_threshold"] == 0.0
    )
    kwargs = dict(call["kwargs"])
    trace = tmp_path / "trace.jsonl"
    adapter = model("bfloat16", kwargs["eos_id"])
    result = refusion.generate(call["prompt_ids"], adapter, preset="llada2.1", trace=trace, **kwargs)
    edited = sum(len(r.revised) for r in result.iterations)
    assert edited > 0
    assert sum(len(r.revised) for r in read_trace(trace)[0].iterations) == edited


@pytest.mark.parametrize(
    "preset, argument, value",
    [
        ("llada2.1", "eos_early_stop", True),
        ("llada2.1", "num_to_transfer", 2),
        ("llada2.1", "block_length", 32),
        ("llada2", "eos_early_stop", True),
        ("llada2", "steps", 9),
        ("llada2", "eos_id", 7),
    ],
)
def test_arguments_it_does_not_reproduce_are_refused_by_name(preset, argument, value):
    with pytest.raises(ConfigError, match=argument):
        refusion.generate([4, 40], model("float32"), preset=preset, **{argument: value})


def test_a_llada_2_1_config_decodes_with_the_editing_preset_by_default(tmp_path):
    import shutil

    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    config = json.loads((FIXTURE / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "llada21_moe"}))
    assert refusion.load_model(str(tmp_path)).preset.reviser.name == "editing"


def test_a_configuration_glm4moe_cannot_reproduce_is_refused_naming_the_field(tmp_path):
    import shutil

    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    config = json.loads((FIXTURE / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "use_bias": True}))
    with pytest.raises(ConfigError, match="use_bias"):
        refusion.load_model(str(tmp_path))
