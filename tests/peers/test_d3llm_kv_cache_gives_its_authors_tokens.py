"""The ``d3llm-kv`` preset gives d3LLM's own tokens with its delayed, periodically refreshed KV cache
(``generate_multi_block_kv_cache``), call for call, step for step and fed token for fed token, on the tiny LLaDA
checkpoint, in float32 and bfloat16 (the goldens: ``tests/fixtures/peers/d3llm_kv``, made by
``tools/peer_fixtures/d3llm.py --kv-cache`` from d3LLM's code on its own ``LLaDAModelLM``); the cache policy
(reorderer ``periodic``) is what makes them."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import refusion
from refusion.errors import ConfigError
from tests.support.kernels import cpu_kernel_family

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "d3llm_kv"
GOLDEN = json.loads((FOLDER / "golden.json").read_text())
MADE_ON = json.loads((FOLDER / "cpu.json").read_text())["made_on"]
CALLS = GOLDEN["calls"]


@functools.cache
def model(dtype: str):
    return refusion.load_model(str(FOLDER / GOLDEN["checkpoint"]), dtype=getattr(torch, dtype))


def decode(call: dict, prompts=None, **overrides):
    """The call as written (the preset takes d3LLM's own arguments), with refusion's ``overrides``."""
    prompt = GOLDEN["prompts"][call["prompt"]] if prompts is None else prompts
    return refusion.generate(prompt, model(call["dtype"]), preset="d3llm-kv", **{**call["args"], **overrides})


def fed_per_forward(result) -> list[int]:
    return [n for r in result.iterations for n in r.fed_tokens]


@pytest.mark.parametrize("index", range(len(CALLS)), ids=lambda i: f"{CALLS[i]['dtype']}-{CALLS[i]['note'][:3]}-{i}")
def test_each_call_gives_d3llms_tokens_steps_and_fed_tokens(index):
    call = CALLS[index]
    if call["dtype"] != "float32" and cpu_kernel_family() != MADE_ON:
        pytest.skip(f"the {call['dtype']} goldens were made on a {MADE_ON} CPU (other kernels round bf16 otherwise)")
    result = decode(call, record=True)
    assert result.region_tokens == call["tokens"]
    assert result.forwards == call["nfe"]
    assert [len(r.selected) for r in result.iterations] == call["decided_per_step"]
    assert fed_per_forward(result) == call["fed_per_forward"]


def test_the_goldens_exercise_delays_refreshes_partial_forwards_and_both_dtypes():
    assert {c["dtype"] for c in CALLS} == {"float32", "bfloat16"} and not GOLDEN["skipped"]
    lengths = {c["prompt"]: len(GOLDEN["prompts"][c["prompt"]]) + len(c["tokens"]) for c in CALLS}
    assert all(min(c["fed_per_forward"]) < lengths[c["prompt"]] for c in CALLS if c["note"][1] != "o")
    assert {c["args"]["cache_delay_iter"] for c in CALLS if "cache_delay_iter" in c["args"]} == {0, 1, 2}


def test_without_the_cache_policy_d3llms_tokens_are_lost():
    """The same calls with reorderer ``no-cache`` feed the whole canvas every forward, and most give other tokens."""
    calls = [c for c in CALLS if c["dtype"] == "float32" and c["note"][1] != "o"]
    results = [decode(c, reorderer="no-cache", record=True) for c in calls]
    assert all(len(set(fed_per_forward(r))) == 1 for r in results)  # the whole canvas, every forward
    differ = sum(r.region_tokens != c["tokens"] for r, c in zip(results, calls))
    assert differ >= len(calls) // 2, f"only {differ} of {len(calls)} calls changed"


def test_the_functions_defaults_cache_nothing_and_give_the_plain_multi_block_tokens():
    plain = json.loads((FOLDER.parent / "d3llm" / "golden.json").read_text())["calls"]
    defaults = {(c["prompt"], c["dtype"]): c["tokens"] for c in plain if c["note"].startswith("(a)")}
    for call in (c for c in CALLS if c["note"].startswith("(o)")):
        assert call["tokens"] == defaults[call["prompt"], call["dtype"]]
        assert decode(call).region_tokens == call["tokens"] if call["dtype"] == "float32" else True


def test_a_batch_of_prompts_gives_each_its_own_tokens():
    for note in {c["note"] for c in CALLS}:
        alone = sorted((c for c in CALLS if c["dtype"] == "float32" and c["note"] == note), key=lambda c: c["prompt"])
        batch = decode(alone[0], prompts=GOLDEN["prompts"])
        assert [r.region_tokens for r in batch] == [c["tokens"] for c in alone]


def test_the_kv_cache_arguments_are_taken_by_name_with_the_functions_defaults():
    from refusion.peers import translate

    m = model("float32")
    name = "d3llm.generate_multi_block_kv_cache"
    call = translate(name, {"max_new_tokens": 64, "block_size": 16, "lazy_cache_refresh_num": 3}, m)
    assert call.params == {"block_size": 16, "cache_delay_iter": 10000, "refresh_interval": 10000}
    call = translate(name, {"cache_delay_iter": 1, "refresh_interval": 3, "threshold": None}, m)
    assert call.params == {"cache_delay_iter": 1, "refresh_interval": 3, "threshold": 999.0}
    for bad in ({"temperature": 0.5}, {"remasking": "random"}, {"early_stop": True, "eos_token_id": 1}):
        with pytest.raises(ConfigError, match=f"{next(iter(bad))}.*generate_multi_block_kv_cache"):
            translate(name, bad, m)


def test_a_model_with_a_logit_shift_is_refused_before_any_work():
    from refusion.models.mdm import tiny_bidirectional

    dream_like = tiny_bidirectional(vocab_size=24, max_positions=256, logit_shift=1)
    with pytest.raises(ConfigError, match="d3llm-kv.*logit_shift=0"):
        refusion.generate([1, 2], dream_like, preset="d3llm-kv", gen_length=16, block_size=8)
    with pytest.raises(ConfigError, match="periodic"):
        refusion.generate([1, 2], dream_like, preset="dream", reorderer="periodic", gen_length=16)
