"""The ``wino`` preset gives WINO's own tokens (Feng-Hong/WINO-DLLM ``decoding_wino``), call for call, on the tiny
LLaDA checkpoint built by LLaDA's class, in float32 and in bfloat16 (the goldens: ``tests/fixtures/peers/wino``,
made by ``tools/peer_fixtures/wino.py`` from WINO's code on WINO's own ``LLaDAModelLM``)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import refusion
from tests.support.kernels import cpu_kernel_family

WINO = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "wino"
GOLDEN = json.loads((WINO / "golden.json").read_text())
#: the CPU kernel family the goldens were made on: half-precision tokens hold there (fixtures/peers/wino/cpu.json)
MADE_ON = json.loads((WINO / "cpu.json").read_text())["made_on"]


@functools.cache
def model(dtype: str):
    return refusion.load_model(str(WINO / GOLDEN["checkpoint"]), dtype=getattr(torch, dtype))


def decode(call: dict, **overrides):
    args = dict(call["args"])
    gen_length = args.pop("gen_length")
    if call.get("seed") is not None:
        args["seed"] = call["seed"]
    prompt = GOLDEN["prompts"][call["prompt"]]
    return refusion.generate(
        prompt, model(call["dtype"]), preset="wino", gen_length=gen_length, record=True, **{**args, **overrides}
    )


@pytest.mark.parametrize("index", range(len(GOLDEN["calls"])), ids=lambda i: f"{GOLDEN['calls'][i]['dtype']}-{i}")
def test_each_call_gives_wino_s_tokens_in_as_many_forwards(index):
    call = GOLDEN["calls"][index]
    if call["dtype"] != "float32" and cpu_kernel_family() != MADE_ON:
        pytest.skip(f"the {call['dtype']} goldens were made on a {MADE_ON} CPU (other kernels round bf16 otherwise)")
    result = decode(call)
    assert result.region_tokens == call["tokens"]
    assert result.forwards == call["steps"]  # one forward per WINO step, the verification rows included


def test_the_goldens_exercise_wide_steps_remasks_sampling_and_both_dtypes():
    calls = GOLDEN["calls"]
    assert {c["dtype"] for c in calls} == {"float32", "bfloat16"}
    assert any(max(c["accepted_per_step"]) > 1 for c in calls)
    assert sum(any(c["remasked_per_step"]) for c in calls) >= 4
    assert any(c.get("seed") is not None and c["args"]["temperature"] > 0 for c in calls)


def test_wino_s_peer_arguments_are_taken_by_name_and_a_foreign_mask_id_refused():
    from refusion.errors import ConfigError
    from refusion.peers import translate

    call = translate("wino.decoding_wino", {"threshold": 0.7, "threshold_back": 0.8, "mask_id": 3}, model("float32"))
    assert call.params == {"threshold": 0.7, "threshold_back": 0.8}
    with pytest.raises(ConfigError, match="mask_id"):
        translate("wino.decoding_wino", {"mask_id": 5}, model("float32"))
