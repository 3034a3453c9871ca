"""The ``d2f`` and ``d2f-dream`` presets give D2F's own tokens (``_generate_block_single``: several blocks in
flight, block-causal attention, finished blocks cached), call for call and step for step, on the tiny LLaDA and
Dream checkpoints, in float32 and bfloat16 (the goldens: ``tests/fixtures/peers/d2f`` and ``d2f_dream``, made by
``tools/peer_fixtures/d2f.py`` from D2F's code on its own ``LLaDAModelLM`` and ``DreamModel``); the pipelined blocks
and the block-causal attention are what make them."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import refusion
from refusion.errors import ConfigError
from tests.support.kernels import cpu_kernel_family

PEERS = Path(__file__).resolve().parents[1] / "fixtures" / "peers"
#: golden folder -> the preset that reproduces it (D2F's LLaDA decoder; its Dream decoder, logit shift 1)
PRESETS = {"d2f": "d2f", "d2f_dream": "d2f-dream"}
GOLDENS = {folder: json.loads((PEERS / folder / "golden.json").read_text()) for folder in PRESETS}
MADE_ON = {folder: json.loads((PEERS / folder / "cpu.json").read_text())["made_on"] for folder in PRESETS}
GOLDEN, CALLS = GOLDENS["d2f"], GOLDENS["d2f"]["calls"]  # the LLaDA goldens, for the tests below that use one
EVERY = [(folder, i) for folder, golden in GOLDENS.items() for i in range(len(golden["calls"]))]


@functools.cache
def model(dtype: str, folder: str = "d2f"):
    return refusion.load_model(str(PEERS / folder / GOLDENS[folder]["checkpoint"]), dtype=getattr(torch, dtype))


def decode(call: dict, prompts=None, folder: str = "d2f", **overrides):
    """The call as written (the preset takes D2F's own arguments), with refusion's ``overrides``."""
    prompt = GOLDENS[folder]["prompts"][call["prompt"]] if prompts is None else prompts
    return refusion.generate(
        prompt, model(call["dtype"], folder), preset=PRESETS[folder], **{**call["args"], **overrides}
    )


def fed_per_forward(result) -> list[int]:
    return [n for r in result.iterations for n in r.fed_tokens]


def expected_fed(call: dict, folder: str = "d2f") -> list[int]:
    """D2F's canvas holds the blocks added so far; refusion's the whole answer, whose blocks not yet added are
    masks that, attending block-causally, change nothing before them: it feeds them too. On Dream (logit shift 1)
    a forward that starts after the cached prefix also feeds the prefix's last position again (D2F keeps its
    output from the forward that cached it)."""
    shift = int(folder == "d2f_dream")
    whole = len(GOLDENS[folder]["prompts"][call["prompt"]]) + len(call["tokens"])
    return [
        fed + whole - canvas + (shift if fed < canvas else 0)
        for fed, canvas in zip(call["fed_per_forward"], call["canvas_per_forward"])
    ]


FLOAT32 = [(folder, i) for folder, i in EVERY if GOLDENS[folder]["calls"][i]["dtype"] == "float32"]


@pytest.mark.parametrize("folder, index", FLOAT32, ids=lambda x: str(x))
def test_each_float32_call_gives_d2fs_tokens_in_its_steps_over_its_cache(folder, index):
    call = GOLDENS[folder]["calls"][index]
    result = decode(call, folder=folder, record=True)
    assert result.region_tokens == call["tokens"]
    assert result.forwards == call["forwards"]
    assert [len(r.selected) for r in result.iterations] == call["decided_per_step"]
    assert fed_per_forward(result) == expected_fed(call, folder)


#: bfloat16 calls that agree, by golden folder: (in tokens and positions decided per step, in tokens) of 18 (a named
#: exception, docs/models.md). refusion gives the same bfloat16 tokens with its cache and without it
#: (``cache_finished=False``), so the difference lies in the forward's arithmetic: D2F's models add a float32 mask
#: to their attention scores over the cached keys they concatenate, refusion's attention reads a block-causal span;
#: a probability near a threshold rounds to either side
BF16_AGREEMENT = {"d2f": (13, 14), "d2f_dream": (14, 14)}


@pytest.mark.parametrize("folder", list(PRESETS))
def test_bfloat16_calls_give_d2fs_tokens_but_a_few(folder):
    if cpu_kernel_family() != MADE_ON[folder]:
        pytest.skip(f"the bfloat16 goldens were made on a {MADE_ON[folder]} CPU (other kernels round bf16 otherwise)")
    calls = [c for c in GOLDENS[folder]["calls"] if c["dtype"] == "bfloat16"]
    steps = tokens = 0
    for call in calls:
        result = decode(call, folder=folder, record=True)
        tokens += result.region_tokens == call["tokens"]
        steps += (
            result.region_tokens == call["tokens"]
            and [len(r.selected) for r in result.iterations] == call["decided_per_step"]
        )
    assert (steps, tokens) >= BF16_AGREEMENT[folder], f"{steps}, {tokens} of {len(calls)}"


def test_the_goldens_exercise_blocks_in_flight_caching_and_both_dtypes():
    for golden in GOLDENS.values():
        assert {c["dtype"] for c in golden["calls"]} == {"float32", "bfloat16"} and not golden["skipped"]
    assert any(max(c["decided_per_step"]) >= 4 for c in CALLS)  # several positions, several blocks, one step
    assert all(c["fed_per_forward"][-1] < c["fed_per_forward"][0] + len(c["tokens"]) for c in CALLS)  # cached
    assert any(c["canvas_per_forward"][k] < c["canvas_per_forward"][-1] for c in CALLS for k in range(2))


def test_one_block_at_a_time_or_full_attention_loses_d2fs_tokens():
    """With blocks added only when the last is full, or with the model attending over the whole canvas (reorderer
    ``no-cache``), a third of the calls or more give other tokens or take other steps."""
    calls = [c for c in CALLS if c["dtype"] == "float32" and c["args"]["block_add_threshold"] < 1]
    for change in ({"block_add_threshold": 1.0, "decoded_token_threshold": 1.0}, {"reorderer": "no-cache"}):
        results = [decode(c, record=True, **change) for c in calls]
        differ = sum(
            r.region_tokens != c["tokens"] or [len(x.selected) for x in r.iterations] != c["decided_per_step"]
            for r, c in zip(results, calls)
        )
        assert differ >= len(calls) // 3, f"{change}: only {differ} of {len(calls)} calls changed"


def test_without_the_cache_the_same_tokens_come_from_whole_canvases():
    """Attending block-causally, a finished block's cached keys/values are exact: switching the cache off feeds
    the whole canvas at every forward and gives the same tokens in the same steps (float32)."""
    for call in (c for c in CALLS if c["dtype"] == "float32"):
        result = decode(call, record=True, cache_finished=False)
        assert result.region_tokens == call["tokens"] and result.forwards == call["forwards"]
        assert len(set(fed_per_forward(result))) == 1


def test_a_batch_of_prompts_gives_each_its_own_tokens():
    for note in {c["note"] for c in CALLS}:
        alone = sorted((c for c in CALLS if c["dtype"] == "float32" and c["note"] == note), key=lambda c: c["prompt"])
        batch = decode(alone[0], prompts=GOLDEN["prompts"])
        assert [r.region_tokens for r in batch] == [c["tokens"] for c in alone]


def test_d2fs_settings_are_taken_by_name_with_its_classs_defaults_and_the_unmappable_refused():
    from refusion.peers import translate

    m = model("float32")
    call = translate("d2f.generate_block", {"max_new_tokens": 30, "block_size": 8, "max_length": 4096}, m)
    assert call.gen_length == 24  # whole blocks, as the function adds them
    assert call.params == {
        "block_size": 8,
        "block_add_threshold": 0.5,
        "decoded_token_threshold": 0.9,
        "skip_threshold": 1.0,
    }
    bad_calls = (
        {"temperature": 0.2},
        {"top_k": 5},
        {"top_p": 0.9},
        {"sampling_strategy": "margin_confidence"},
        {"block_add_threshold": 1.5},
        {"max_new_tokens": 3, "block_size": 4},
        {"mask_token_id": 9},
    )
    for bad in bad_calls:
        name = next(iter(bad)) if "max_new_tokens" not in bad else "max_new_tokens"
        with pytest.raises(ConfigError, match=f"`{name}`.* of D2F's _generate_block_single"):
            translate("d2f.generate_block", bad, m)


def test_each_preset_runs_on_its_models_logit_shift_only():
    from refusion.models.mdm import tiny_bidirectional

    dream_like = tiny_bidirectional(vocab_size=24, max_positions=256, logit_shift=1)
    with pytest.raises(ConfigError, match="logit_shift"):
        refusion.generate([1, 2], dream_like, preset="d2f", gen_length=16, block_size=8)
    with pytest.raises(ConfigError, match="logit_shift"):
        refusion.generate([1, 2], model("float32"), preset="d2f-dream", gen_length=16, block_size=8)
    assert len(refusion.generate([1, 2], dream_like, preset="d2f-dream", gen_length=16, block_size=8).tokens) > 0
