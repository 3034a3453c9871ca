"""The ``d3llm`` preset gives d3LLM's own multi-block tokens (``generate_multi_block``: several blocks in flight on a
full-attention canvas, an entropy threshold across them), call for call and step for step, on the tiny LLaDA
checkpoint, in float32 and bfloat16 (the goldens: ``tests/fixtures/peers/d3llm``, made by
``tools/peer_fixtures/d3llm.py`` from d3LLM's code on its own ``LLaDAModelLM``); the blocks in flight are what make
them."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import refusion
from refusion.errors import ConfigError
from tests.support.kernels import cpu_kernel_family

D3LLM = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "d3llm"
GOLDEN = json.loads((D3LLM / "golden.json").read_text())
MADE_ON = json.loads((D3LLM / "cpu.json").read_text())["made_on"]
CALLS = GOLDEN["calls"]


@functools.cache
def model(dtype: str):
    return refusion.load_model(str(D3LLM / GOLDEN["checkpoint"]), dtype=getattr(torch, dtype))


def decode(call: dict, prompts=None, **overrides):
    prompt = GOLDEN["prompts"][call["prompt"]] if prompts is None else prompts
    return refusion.generate(prompt, model(call["dtype"]), preset="d3llm", **{**call["args"], **overrides})


@pytest.mark.parametrize("index", range(len(CALLS)), ids=lambda i: f"{CALLS[i]['dtype']}-{CALLS[i]['note'][:3]}-{i}")
def test_each_call_gives_d3llms_tokens_in_its_steps(index):
    call = CALLS[index]
    if call["dtype"] != "float32" and cpu_kernel_family() != MADE_ON:
        pytest.skip(f"the {call['dtype']} goldens were made on a {MADE_ON} CPU (other kernels round bf16 otherwise)")
    result = decode(call, record=True)
    assert result.region_tokens == call["tokens"]
    assert result.forwards == call["nfe"]
    assert [len(r.selected) for r in result.iterations] == call["decided_per_step"]


def test_the_goldens_exercise_blocks_in_flight_forced_progress_and_both_dtypes():
    assert {c["dtype"] for c in CALLS} == {"float32", "bfloat16"} and not GOLDEN["skipped"]
    assert any(2 in c["decided_per_step"] and c["args"].get("threshold", 0.5) <= 0.5 for c in CALLS)
    assert any(max(c["decided_per_step"]) >= 8 for c in CALLS)


def test_one_block_at_a_time_loses_d3llms_tokens():
    """With blocks added only when the last is full and activated only then, the window is one block."""
    calls = [c for c in CALLS if c["dtype"] == "float32" and c["args"].get("block_add_threshold", 0.5) < 1]
    sequential = {"block_add_threshold": 1.0, "decoded_token_threshold": 1.0}
    differ = sum(decode(c, **sequential).region_tokens != c["tokens"] for c in calls)
    assert differ >= len(calls) // 3, f"only {differ} of {len(calls)} calls changed"


def test_a_batch_of_prompts_gives_each_its_own_tokens():
    for note in {c["note"] for c in CALLS}:
        alone = sorted((c for c in CALLS if c["dtype"] == "float32" and c["note"] == note), key=lambda c: c["prompt"])
        batch = decode(alone[0], prompts=GOLDEN["prompts"])
        assert [r.region_tokens for r in batch] == [c["tokens"] for c in alone]


def test_d3llms_arguments_are_taken_by_name_and_the_unmappable_refused():
    from refusion.peers import translate

    m = model("float32")
    call = translate(
        "d3llm.generate_multi_block",
        {"max_new_tokens": 64, "block_size": 16, "threshold": 0.4, "steps": 7, "mask_id": 3, "early_stop": False},
        m,
    )
    assert call.params == {"block_size": 16, "threshold": 0.4} and call.gen_length == 64
    for bad in ({"temperature": 0.5}, {"remasking": "random"}, {"early_stop": True, "eos_token_id": 1}, {"mask_id": 9}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            translate("d3llm.generate_multi_block", bad, m)


@pytest.mark.parametrize("params", [{"partitioner": "semi-ar", "block_length": 8}, {"gen_length": 20}])
def test_several_serial_blocks_and_a_short_last_block_decode_every_position(params):
    result = refusion.generate(
        GOLDEN["prompts"][0], model("float32"), preset="d3llm", **{"gen_length": 24, "block_size": 8, **params}
    )
    assert len(result.region_tokens) == result.partition.gen_length and 3 not in result.region_tokens


def test_multi_token_slots_decode_every_position_in_as_many_steps_at_most():
    result = refusion.generate(
        GOLDEN["prompts"][0], model("float32"), preset="d3llm", gen_length=32, slot_size=4, block_size=8
    )
    assert 3 not in result.region_tokens and result.forwards <= 8


def test_the_functions_own_stand_ins_are_taken_as_it_reads_them():
    from refusion.peers import translate

    m = model("float32")
    call = translate(
        "d3llm.generate_multi_block",
        {"threshold": None, "block_add_threshold": 2, "early_stop": True, "eos_token_id": None},
        m,
    )
    assert call.params == {"threshold": 999.0, "block_add_threshold": 1.0}
