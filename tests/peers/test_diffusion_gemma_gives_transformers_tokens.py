"""DiffusionGemma decodes to transformers' own ``generate`` tokens, draw for draw, with the same seed.

Golden tokens: tests/fixtures/peers/diffusion_gemma (a tiny checkpoint built by transformers'
``DiffusionGemmaForBlockDiffusion``; ``tools/peer_fixtures/diffusion_gemma.py`` makes and checks them).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import refusion
from refusion.errors import ConfigError
from tests.support.kernels import cpu_kernel_family

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "diffusion_gemma"
GOLDEN = json.loads((FIXTURE / "golden.json").read_text())
#: the CPU kernel family the goldens were made on: bf16 tokens hold there (fixtures/peers/diffusion_gemma/cpu.json)
MADE_ON = json.loads((FIXTURE / "cpu.json").read_text())["made_on"]
CPU = cpu_kernel_family()
PAD = 0


@functools.cache
def model(dtype: str = "float32", eos: int | None = None):
    options = {} if eos is None else {"eos_token_id": eos}
    return refusion.load_model(str(FIXTURE), dtype=dtype, **options)


def expected(call: dict, eos: set[int]) -> list[int]:
    """transformers' answer as refusion reports it: cut after the first EOS (transformers pads the rest)."""
    tokens = call["tokens"]
    hit = next((i for i, t in enumerate(tokens) if t in eos), None)
    return tokens if hit is None else tokens[: hit + 1]


def calls(dtype: str) -> list:
    found = [c for c in GOLDEN["calls"] if c["dtype"] == dtype]
    marks = []
    if dtype != "float32" and MADE_ON != CPU:
        marks = [pytest.mark.skip(reason=f"{dtype} goldens were made on a {MADE_ON} CPU; this one runs {CPU} kernels")]
    return [pytest.param(c, id=f"{c['case']}-{c['seed']}", marks=marks) for c in found]


def decode(call: dict, **extra):
    kwargs = dict(call["kwargs"])
    eos = kwargs.pop("eos_token_id", None)
    adapter = model(call["dtype"], eos)
    if "entropy_bound" in kwargs:  # transformers' own spelling: an EntropyBoundSamplerConfig (here its dict)
        kwargs["sampler_config"] = {"entropy_bound": kwargs.pop("entropy_bound")}
    return refusion.generate(call["prompt_ids"], adapter, seed=call["seed"], **kwargs, **extra), adapter


@pytest.mark.parametrize("call", calls("float32") + calls("bfloat16"))
def test_the_family_preset_gives_transformers_tokens(call):
    result, adapter = decode(call)
    assert result.tokens.tolist() == expected(call, set(adapter.eos_token_ids))
    # transformers' tokens per forward: answer tokens (pad excluded) per denoiser pass
    valid = sum(t != PAD for t in call["tokens"])
    assert valid / result.num_iterations == pytest.approx(call["tokens_per_forward"], abs=1e-5)


def test_naming_the_preset_with_transformers_arguments_gives_the_same_tokens():
    call = next(c for c in GOLDEN["calls"] if c["case"] == "three-canvases" and c["dtype"] == "float32")
    result, adapter = decode(call, preset="diffusion-gemma", return_dict_in_generate=True)
    assert result.tokens.tolist() == expected(call, set(adapter.eos_token_ids))


def test_a_batch_gives_each_prompt_its_tokens_alone():
    chosen = [c for c in GOLDEN["calls"] if c["dtype"] == "float32" and not c["kwargs"]]
    results = refusion.generate([c["prompt_ids"] for c in chosen], model(), seeds=[c["seed"] for c in chosen])
    assert [r.tokens.tolist() for r in results] == [expected(c, {1}) for c in chosen]


def test_a_batch_holds_each_rows_keys_and_values_once(monkeypatch):
    from refusion.engines.denoiser import DenoiserEngine

    shared: list[bool] = []
    original = DenoiserEngine._denoise_batch

    def checking(engine, denoises):
        out = original(engine, denoises)
        batch = {
            t.untyped_storage().data_ptr() for layer in engine._batch[1].layers for t in (layer.keys, layer.values)
        }
        for state, _ in denoises:
            layers = [layer for layer in state.cache.layers if getattr(layer, "is_initialized", False)]
            shared.extend(
                t.untyped_storage().data_ptr() in batch for layer in layers for t in (layer.keys, layer.values)
            )
        return out

    monkeypatch.setattr(DenoiserEngine, "_denoise_batch", checking)
    chosen = [c for c in GOLDEN["calls"] if c["dtype"] == "float32" and not c["kwargs"]]
    results = refusion.generate([c["prompt_ids"] for c in chosen], model(), seeds=[c["seed"] for c in chosen])
    assert [r.tokens.tolist() for r in results] == [expected(c, {1}) for c in chosen]
    assert shared and all(shared)


def test_the_checkpoint_generation_config_sets_the_defaults():
    spec = model().preset
    assert (spec.gen_length, spec.infiller.params["max_denoising_steps"], spec.selector.params["entropy_bound"]) == (
        32,
        8,
        0.1,
    )


def test_naming_the_family_preset_takes_the_checkpoint_generation_defaults_as_no_preset_does():
    from refusion.api import decoder_spec

    named, default = decoder_spec(model(), preset="diffusion-gemma"), decoder_spec(model())
    registered = refusion.PRESETS["diffusion-gemma"]

    def steps(spec):
        return spec.infiller.params.get("max_denoising_steps")

    assert (registered.gen_length, steps(registered)) != (default.gen_length, steps(default))
    assert named == default
    assert steps(decoder_spec(model(), preset="diffusion-gemma", max_denoising_steps=3)) == 3
    call = next(c for c in GOLDEN["calls"] if c["dtype"] == "float32" and not c["kwargs"])
    plain = refusion.generate(call["prompt_ids"], model(), seed=call["seed"])
    chosen = refusion.generate(call["prompt_ids"], model(), seed=call["seed"], preset="diffusion-gemma")
    assert (chosen.tokens.tolist(), chosen.forwards) == (plain.tokens.tolist(), plain.forwards)


def test_tokens_are_sealed_canvas_by_canvas():
    call = next(c for c in GOLDEN["calls"] if c["case"] == "three-canvases" and c["dtype"] == "float32")
    result, _ = decode(call, record=True)
    canvases = [r.committed for r in result.iterations if r.committed]
    assert [len(c) for c in canvases] == [16, 16, 16]
    assert all(not r.committed for r in result.iterations if r is not result.iterations[-1] and not r.committed)
    assert result.num_iterations == len(result.iterations) == 12  # 4 steps per canvas, no early stop


@pytest.mark.parametrize(
    "argument, value, says",
    [
        ("cache_implementation", "static", "dynamic cache"),
        ("max_length", 40, "max_new_tokens"),
        ("eos_token_id", 7, "eos_token_id=[7]"),
        ("decoder_input_ids", torch.zeros(1, 16, dtype=torch.long), "noise"),
    ],
)
def test_transformers_arguments_it_cannot_honour_are_refused_by_name(argument, value, says):
    with pytest.raises(ConfigError, match=argument) as info:
        refusion.generate([4, 45], model(), preset="diffusion-gemma", **{argument: value})
    assert says in str(info.value)


def test_a_reviser_and_guidance_are_refused_before_any_work():
    with pytest.raises(ConfigError, match="reviser"):
        refusion.generate([4, 45], model(), reviser="wino")
    with pytest.raises(ConfigError, match="cfg_scale"):
        refusion.generate([4, 45], model(), cfg_scale=1.0)
    with pytest.raises(ConfigError, match="t_max"):
        refusion.generate([4, 45], model(), t_min=0.9, t_max=0.5)


def test_a_generator_streams_the_answer_canvas_by_canvas():
    call = next(c for c in GOLDEN["calls"] if c["case"] == "three-canvases" and c["dtype"] == "float32")
    generator = refusion.Generator(model(), max_denoising_steps=4)
    request = generator.submit(call["prompt_ids"], gen_length=48, seed=call["seed"])
    pieces = [event.prefix_tokens for event in request if event.prefix_tokens]
    assert [len(p) for p in pieces] == [16, 16, 16]
    assert [t for p in pieces for t in p] == expected(call, {1}) == request.result.tokens.tolist()


def test_serve_and_batch_decode_it(tmp_path):
    import openai

    from tests.support.serving import ServerProcess

    prompts = ["Hi", "2+2="]
    offline = [refusion.generate(p, model(), seed=5, gen_length=32) for p in prompts]
    server = ServerProcess("--model", str(FIXTURE)).start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for prompt, alone in zip(prompts, offline):
            chunks = list(
                client.completions.create(model="diffusion_gemma", prompt=prompt, seed=5, max_tokens=32, stream=True)
            )
            assert chunks[-1].refusion["tokens"] == alone.tokens.tolist()
            assert "".join(c.choices[0].text for c in chunks) == alone.text
    finally:
        server.stop()
    rows = tmp_path / "in.jsonl"
    rows.write_text(
        "".join(json.dumps({"id": i, "prompt": p, "seed": 5, "max_tokens": 32}) + "\n" for i, p in enumerate(prompts))
    )
    from refusion.cli import main

    assert main(["batch", str(rows), "--model", str(FIXTURE), "--out", str(tmp_path / "out.jsonl")]) == 0
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [w["tokens"] for w in written] == [r.tokens.tolist() for r in offline]


@pytest.mark.parametrize("selector, params", [("threshold", {"slot_threshold": 0.3}), ("topk", {"k": 4})])
def test_the_field_rules_decide_acceptance_on_its_canvases(selector, params):
    result = refusion.generate([4, 45], model(), selector=selector, seed=2, record=True, **params, gen_length=16)
    accepted = [len(r.selected) for r in result.iterations]
    if selector == "topk":
        assert set(accepted) == {4}  # four positions accept their draw per step, the rest are re-noised
    assert len(result.tokens) <= 16 and result.num_iterations <= 8


@pytest.mark.parametrize("selector", ["llada-steps", "dream-steps", "sdar-steps", "dream-blocks", "wino"])
def test_mask_schedules_are_refused_on_its_canvases_naming_the_rules_that_apply(selector):
    with pytest.raises(ConfigError, match="entropy-bound, threshold"):
        refusion.generate([4, 45], model(), selector=selector)


def test_without_renoising_unaccepted_positions_keep_their_tokens():
    kept = refusion.generate([4, 45], model(), seed=4, renoise=False, gen_length=16, record=True)
    noised = refusion.generate([4, 45], model(), seed=4, gen_length=16, record=True)
    assert kept.tokens.tolist() != noised.tokens.tolist()  # the canvas each step sees differs from the second step on
    assert kept.num_iterations <= 8 and len(kept.tokens) <= 16


def test_a_trace_of_its_decode_reads_back(tmp_path):
    from refusion.measure.trace import read_trace

    call = next(c for c in GOLDEN["calls"] if c["case"] == "three-canvases" and c["dtype"] == "float32")
    result, _ = decode(call, trace=tmp_path / "trace.jsonl")
    back = read_trace(tmp_path / "trace.jsonl")[0]
    assert back.tokens.tolist() == result.tokens.tolist() and back.num_iterations == result.num_iterations
