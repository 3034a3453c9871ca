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
#: the CPU kernel family the goldens were made on: bf16 tokens hold there (fixtures/peers/llada2/cpu.json), and
#: the first calls' tokens regenerated on another family (``regenerated_on``)
RECORD = json.loads((FIXTURE / "cpu.json").read_text())
MADE_ON = RECORD["made_on"]
CPU = cpu_kernel_family()
half_precision_here = pytest.mark.skipif(
    MADE_ON != CPU, reason=f"bfloat16 goldens were made on a {MADE_ON} CPU; this one runs {CPU} kernels"
)
BLOCK = GOLDEN["block_length"]


def authors(call: dict) -> tuple[list[int], int]:
    """``(tokens, forwards)`` of the authors' call on this CPU's kernel family; skips where none were made."""
    if MADE_ON == CPU:
        return call["tokens"], call["forwards"]
    index, again = GOLDEN["calls"].index(call), RECORD.get("regenerated_on", {}).get(CPU)
    if again is None or index >= again["calls"]:
        pytest.skip(f"bfloat16 goldens were made on a {MADE_ON} CPU; this one runs {CPU} kernels")
    key = str(index)
    return again["tokens"].get(key, call["tokens"]), again["forwards"].get(key, call["forwards"])


def verbatim(call: dict, **extra):
    """refusion.generate with the preset named after the call's function and the authors' keywords as written
    (the fixture's model as loaded: blocks of 8, EOS 1, mask 3)."""
    kwargs = {"mask_id": 3, **call["kwargs"]}  # the first calls were recorded without it
    return refusion.generate(
        call["prompt_ids"], model(), preset=PRESETS[call["function"]], seed=call.get("seed", 0), **kwargs, **extra
    )


def calls_with(function: str, **wanted) -> list:
    return [
        pytest.param(c, id=label(c))
        for c in GOLDEN["calls"]
        if c["function"] == function and all(c["kwargs"].get(k, None) == v for k, v in wanted.items())
    ]


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


def early_return(call: dict) -> bool:
    """LLaDA 2.0's ``eos_early_stop=True``: it returns in the middle of the block as soon as the answer up to its
    first EOS is decoded; refusion finishes that block (the same tokens: those before the EOS are final)."""
    return call["function"] == "llada2.generate" and bool(call["kwargs"].get("eos_early_stop"))


@pytest.mark.parametrize("engine", [None, "block-recompute"])
@pytest.mark.parametrize("call", GOLDEN["calls"], ids=label)
def test_the_presets_give_the_authors_tokens(call, engine):
    """Greedy and seeded sampling, edits (LLaDA 2.1, sampled edits too), EOS, answers ending inside a block, the
    authors' keywords as written; on the cached and the recomputing engine."""
    tokens, forwards = authors(call)
    result = verbatim(call, engine=engine)
    assert result.tokens.tolist() == tokens
    if early_return(call):
        assert result.forwards >= forwards
    else:
        assert result.forwards == forwards


@pytest.mark.parametrize(
    "argument, value",
    [
        ("block_length", 16),
        ("minimal_topk", 4),
        ("minimal_topk", 2),
        ("steps", 12),
        ("eos_early_stop", True),
        ("eos_id", 13),
        ("eos_id", 7),
    ],
)
def test_each_argument_of_the_authors_generate_is_taken_as_written(argument, value):
    """Was refused (``block_length`` other than the loaded model's, ``eos_early_stop``, an ``eos_id`` the
    checkpoint does not declare, more steps than the block) or ignored (``minimal_topk``)."""
    cases = [c for c in GOLDEN["calls"] if c["kwargs"].get(argument) == value]
    assert cases, f"no golden call passes {argument}={value!r}"
    for call in cases:
        tokens, forwards = authors(call)
        result = verbatim(call)
        assert result.tokens.tolist() == tokens
        assert result.forwards >= forwards if early_return(call) else result.forwards == forwards


def test_a_mask_id_the_checkpoint_does_not_declare_is_the_canvas_filler():
    """The authors fill the canvas with the call's ``mask_id``: a model loaded with another one decodes with the
    call's (was: 'load the model with `mask_token_id=`')."""
    call = next(c for c in GOLDEN["calls"] if c["function"] == "llada2.generate" and "mask_id" in c["kwargs"])
    tokens, _ = authors(call)
    other = refusion.load_model(str(FIXTURE), dtype="bfloat16", block_length=BLOCK, mask_token_id=5)
    result = refusion.generate(call["prompt_ids"], other, preset="llada2", seed=call["seed"], **call["kwargs"])
    assert result.tokens.tolist() == tokens


def test_an_eos_id_on_a_checkpoint_that_declares_none_stops_there():
    call = next(c for c in GOLDEN["calls"] if c["function"] == "llada21.generate" and c["kwargs"]["eos_id"] == 13)
    tokens, _ = authors(call)
    silent = refusion.load_model(str(FIXTURE), dtype="bfloat16", block_length=BLOCK, eos_token_id=[])
    assert not silent.eos_token_ids
    result = refusion.generate(
        call["prompt_ids"], silent, preset="llada2.1", seed=call["seed"], **{"mask_id": 3, **call["kwargs"]}
    )
    assert result.tokens.tolist() == tokens


@pytest.mark.parametrize("function", ["llada2.generate", "llada21.generate"])
def test_answers_ending_inside_a_block_are_cut_at_gen_length(function):
    """Was: the whole padded last block (59 tokens for a 5-token prompt and gen_length 32); the authors return
    ``x[:, :prompt_length + gen_length]``."""
    off_grid = [
        c
        for c in GOLDEN["calls"]
        if c["function"] == function
        and (len(c["prompt_ids"]) + c["kwargs"]["gen_length"]) % c["kwargs"]["block_length"]
    ]
    assert len(off_grid) >= 3
    for call in off_grid:
        tokens, _ = authors(call)
        result = verbatim(call)
        assert result.tokens.tolist() == tokens
        assert len(result.tokens) <= call["kwargs"]["gen_length"] < result.partition.gen_length
    ends = [c for c in off_grid if len(c["tokens"]) == c["kwargs"]["gen_length"]]
    assert ends, "no off-grid call whose answer runs to gen_length"


def test_ties_between_equal_confidences_go_as_the_authors_topk_breaks_them():
    """LLaDA 2.1 sampled with ``top_p`` and ``threshold`` 1.0: every step falls back to ``torch.topk`` over the
    block, where many confidences are exactly equal; breaking them by position gives other tokens."""
    ties = [c for c in GOLDEN["calls"] if c["function"] == "llada21.generate" and c["kwargs"].get("threshold") == 1.0]
    assert ties
    by_position = 0
    for call in ties:
        tokens, _ = authors(call)
        assert verbatim(call).tokens.tolist() == tokens
        by_position += verbatim(call, ties="lowest").tokens.tolist() != tokens
    assert by_position, "the goldens do not tell the authors' tie order from the lowest position"


def test_the_threshold_selector_ranks_the_model_block_only_with_its_length():
    """Was: ``ties="model-block"`` on the ``threshold`` selector raised ZeroDivisionError."""
    from refusion.decoding.decoder import Decoder

    with pytest.raises(ConfigError, match="block_length"):
        Decoder.from_names(selector="threshold", ties="model-block")
    selector = Decoder.from_names(
        partitioner="semi-ar", selector="threshold", ties="model-block", block_length=BLOCK, slot_size=1
    ).selector
    assert (selector.ties, selector.block_length) == ("model-block", BLOCK)


def test_edits_are_counted_in_the_trace(tmp_path):
    from refusion.measure.trace import read_trace

    call = next(
        c for c in GOLDEN["calls"] if c["function"] == "llada21.generate" and c["kwargs"]["editing_threshold"] == 0.0
    )
    kwargs = dict(call["kwargs"])
    trace = tmp_path / "trace.jsonl"
    result = refusion.generate(call["prompt_ids"], model(), preset="llada2.1", trace=trace, **kwargs)
    edited = sum(len(r.revised) for r in result.iterations)
    assert edited > 0
    assert sum(len(r.revised) for r in read_trace(trace)[0].iterations) == edited


@pytest.mark.parametrize(
    "preset, arguments, named",
    [
        ("llada2.1", {"num_to_transfer": 2}, "num_to_transfer"),
        ("llada2", {"minimal_topk": 2}, "minimal_topk"),  # it caps the steps by gen_length: none given
        ("llada2", {"minimal_topk": 40, "gen_length": 16}, "minimal_topk"),  # 0 steps: the authors divide by it
        ("llada2", {"minimal_topk": 0, "gen_length": 16}, "minimal_topk"),
        ("llada2", {"eos_early_stop": "yes"}, "eos_early_stop"),
    ],
)
def test_arguments_no_mapping_can_reproduce_are_refused_by_name(preset, arguments, named):
    with pytest.raises(ConfigError, match=named):
        refusion.generate([4, 40], model("float32"), preset=preset, **arguments)


def test_a_running_decoder_refuses_another_block_saying_why():
    """A generator or server decodes on the model it loaded: a call's other `block_length` cannot reach it."""
    from refusion.api import build_decoder

    with pytest.raises(ConfigError, match="block_length") as info:
        build_decoder(model("float32"), preset="llada2", block_length=16)
    assert "refusion.generate" in str(info.value)


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
