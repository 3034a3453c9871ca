"""The ``credit`` preset gives dInfer's own CreditDecoding tokens (``CreditThresholdParallelDecoder`` driven by its
``BlockWiseDiffusionLLM``), call for call, on the tiny LLaDA checkpoint built by LLaDA's class, in float32 and in
bfloat16 (the goldens: ``tests/fixtures/peers/credit``, made by ``tools/peer_fixtures/credit.py`` from dInfer's code
on Fast-dLLM's ``LLaDAModelLM``); its memory is what makes them, and it lives with the row."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import attrs
import pytest
import torch

import refusion
from refusion.errors import ConfigError, PluginError
from refusion.strategies.selectors.credit import Credit
from tests.support.kernels import cpu_kernel_family

CREDIT = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "credit"
GOLDEN = json.loads((CREDIT / "golden.json").read_text())
MADE_ON = json.loads((CREDIT / "cpu.json").read_text())["made_on"]
CALLS = GOLDEN["calls"]


@functools.cache
def model(dtype: str):
    return refusion.load_model(str(CREDIT / GOLDEN["checkpoint"]), dtype=getattr(torch, dtype))


def decode(call: dict, prompts=None, **overrides):
    args = {**call["args"], "block_length": call["block_length"], **overrides}
    prompt = GOLDEN["prompts"][call["prompt"]] if prompts is None else prompts
    return refusion.generate(prompt, model(call["dtype"]), preset="credit", gen_length=call["gen_length"], **args)


def _skip_half_off_family(call):
    if call["dtype"] != "float32" and cpu_kernel_family() != MADE_ON:
        pytest.skip(f"the {call['dtype']} goldens were made on a {MADE_ON} CPU (other kernels round bf16 otherwise)")


@pytest.mark.parametrize("index", range(len(CALLS)), ids=lambda i: f"{CALLS[i]['dtype']}-{CALLS[i]['note'][:3]}-{i}")
def test_each_call_gives_dinfers_tokens_in_its_useful_forwards(index):
    call = CALLS[index]
    _skip_half_off_family(call)
    result = decode(call)
    assert result.region_tokens == call["tokens"]
    # dInfer's block runner may unroll a forward past a block that just filled; refusion stops at the fill
    assert result.forwards == call["useful_forwards"]


def test_the_goldens_exercise_several_tokens_per_step_many_steps_per_block_and_both_dtypes():
    assert {c["dtype"] for c in CALLS} == {"float32", "bfloat16"}
    assert any(max(c["accepted_per_forward"]) > 1 and len(c["accepted_per_forward"]) > 4 for c in CALLS)
    assert any(c["forwards"] > c["useful_forwards"] for c in CALLS)  # an unrolled forward seen, and not copied
    assert any(c["args"].get("use_float64") for c in CALLS) and not GOLDEN["skipped"]


@pytest.mark.parametrize("off", [{"decay_beta": 0.0}, {"credit_alpha": 0.0}], ids=["no-memory", "no-credit"])
def test_switching_the_memory_off_loses_dinfers_tokens(off):
    calls = [c for c in CALLS if c["dtype"] == "float32"]
    differ = sum(decode(c, **off).region_tokens != c["tokens"] for c in calls)
    assert differ >= 3, f"only {differ} of {len(calls)} calls changed with {off}"


def test_a_batch_of_prompts_gives_each_its_own_tokens():
    for call in [c for c in CALLS if c["dtype"] == "float32" and c["prompt"] == 0]:
        batch = decode(call, prompts=GOLDEN["prompts"])
        alone = [c for c in CALLS if c["dtype"] == "float32" and c["note"] == call["note"]]
        assert [r.region_tokens for r in batch] == [c["tokens"] for c in sorted(alone, key=lambda c: c["prompt"])]


def test_the_credit_lives_in_the_rows_memory_one_matrix_per_open_block():
    call = next(c for c in CALLS if c["dtype"] == "float32" and c["block_length"] < c["gen_length"])
    seen = []

    @attrs.frozen
    class Watching(Credit):
        name = "credit-watching-test"
        rescores = True

        def rescore(self, plan, logits):
            out = super().rescore(plan, logits)
            block, start, credit = plan.memory[self.name]
            seen.append((block, start, tuple(credit.shape), id(plan.memory)))
            return out

    selector = Watching(threshold=call["args"]["threshold"])
    result = refusion.generate(
        GOLDEN["prompts"][call["prompt"]],
        model("float32"),
        preset="credit",
        selector=selector,
        gen_length=call["gen_length"],
        block_length=call["block_length"],
    )
    assert result.region_tokens == call["tokens"]
    blocks = {b for b, *_ in seen}
    assert blocks == set(range(call["gen_length"] // call["block_length"]))
    assert {shape for *_, shape, _ in seen} == {(call["block_length"], model("float32").vocab_size)}
    assert len({m for *_, m in seen}) == 1  # one row, one memory


def test_dinfers_arguments_are_taken_by_name_and_the_unmappable_refused():
    from refusion.peers import translate

    m = model("float32")
    call = translate(
        "dinfer.credit",
        {"threshold": 0.7, "credit_alpha": 1.0, "use_float64": True, "early_stop": True, "mask_id": 3, "eos_id": 1},
        m,
    )
    assert call.params == {"threshold": 0.7, "credit_alpha": 1.0, "precision": "float64", "stop_at_eos": "block"}
    with pytest.raises(ConfigError, match="temperature"):
        translate("dinfer.credit", {"temperature": 0.5}, m)
    assert translate("dinfer.credit", {"remasking": "random"}, m).params == {}  # the decoder never reads it
    with pytest.raises(ConfigError, match="mask_id"):
        translate("dinfer.credit", {"mask_id": 5}, m)


def test_a_rescoring_selector_runs_per_sequence_in_the_batched_forms_and_is_refused_on_a_denoiser():
    from refusion.api import build_decoder
    from refusion.decoding.forms.lossless import shared_reason
    from refusion.engines import open_engine

    shipped = refusion.load_model()
    decoder, _ = build_decoder(shipped, selector="credit", slot_size=4)
    assert "rescores" in shared_reason(decoder, open_engine(shipped, decoder), False)
    gemma = refusion.load_model(str(CREDIT.parent / "diffusion_gemma"))
    with pytest.raises(ConfigError, match="rescores") as err:
        refusion.generate("a", gemma, selector="credit", gen_length=8)
    assert err.value.param == "selector"


@attrs.frozen
class BadShape(Credit):
    name = "credit-bad-shape-test"
    rescores = True

    def rescore(self, plan, logits):
        return logits[:, :5]


def test_a_rescore_of_the_wrong_shape_fails_naming_the_selector():
    call = CALLS[0]
    with pytest.raises(PluginError, match="credit-bad-shape-test"):
        decode(call, selector=BadShape())


def test_a_subclass_that_overrides_rescore_without_declaring_it_is_not_rescored():
    @attrs.frozen
    class Quiet(Credit):
        name = "credit-quiet-test"

        def rescore(self, plan, logits):
            raise AssertionError("not declared: never called")

    assert Credit.rescores and not Quiet.rescores
    call = next(c for c in CALLS if c["dtype"] == "float32")
    decode(call, selector=Quiet(threshold=call["args"]["threshold"]))  # the plain threshold rule, no call


def test_the_threshold_is_compared_in_the_confidences_own_dtype_float64_with_use_float64():
    from types import SimpleNamespace

    plan = SimpleNamespace(first_confidence=torch.tensor([0.95, 0.89999999], dtype=torch.float64))
    assert Credit(threshold=0.9).select(plan) == [0]  # in float32 0.89999999 would round up to 0.9 and pass
    plan = SimpleNamespace(first_confidence=torch.tensor([0.95, 0.89999999], dtype=torch.float32))
    assert Credit(threshold=0.9).select(plan) == [0, 1]


def test_dinfers_runner_and_iterator_arguments_are_taken_or_refused_saying_why():
    from refusion.peers import translate

    m = model("float32")
    call = translate("dinfer.credit", {"maximum_unroll": 2, "expected_tpf": 4, "start_block_align": True}, m)
    assert call.params == {"align": "absolute"}
    for bad, reason in (({"use_shift": True}, "next position"), ({"cache_factory": object()}, "reorderers")):
        with pytest.raises(ConfigError, match=reason):
            translate("dinfer.credit", bad, m)
