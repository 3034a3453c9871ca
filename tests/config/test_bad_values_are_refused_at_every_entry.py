"""A bad value is refused where it enters, naming itself, the same way from the Python API, the server and a batch
row: values of the wrong type (never a raw TypeError or an HTTP 500), loop counts past their limits, a peer's
length argument under its own name, a preset on a model it does not run on under `preset`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import refusion
from refusion.batch import run_batch
from refusion.cli import main
from refusion.errors import ConfigError
from refusion.generator import Generator
from refusion.serve import create_app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "peers"
PROMPT = [5, 6, 7]

#: (case, model fixture (None: the shipped model), preset, request parameters, the field the error names)
CASES = [
    ("llada2 steps as text", "llada2", "llada2", {"steps": "8"}, "steps"),
    ("llada2 steps as a list", "llada2", "llada2", {"steps": [1]}, "steps"),
    ("llada2 steps as a float", "llada2", "llada2", {"steps": 2.5}, "steps"),
    ("llada2 minimal_topk 0", "llada2", "llada2", {"minimal_topk": 0}, "minimal_topk"),
    ("llada2.1 minimal_topk -1", "llada2", "llada2.1", {"minimal_topk": -1}, "minimal_topk"),
    ("llada2.1 minimal_topk text", "llada2", "llada2.1", {"minimal_topk": "x"}, "minimal_topk"),
    (
        "llada2.1 edits for ever",
        "llada2",
        "llada2.1",
        {"max_post_steps": 10**9, "editing_threshold": 0},
        "max_post_steps",
    ),
    ("llada2 selector steps for ever", "llada2", "llada2", {"selector.steps": 10**9}, "steps"),
    ("llada2 a block of a billion", "llada2", "llada2", {"selector.block_length": 10**9}, "block_length"),
    ("llada steps for ever", "llada", "llada", {"steps": 10**9}, "steps"),
    ("sdar steps for ever", "sdar", "sdar", {"denoising_steps": 10**9}, "denoising_steps"),
    ("dream steps for ever", "dream", "dream", {"steps": 10**9, "max_new_tokens": 16}, "steps"),
    ("denoising for ever", "diffusion_gemma", "diffusion-gemma", {"max_denoising_steps": 10**9}, "max_denoising_steps"),
    ("calls per token for ever", None, None, {"calls_per_token": 10**9}, "calls_per_token"),
    ("dream max_new_tokens 0", "dream", "dream", {"max_new_tokens": 0}, "max_new_tokens"),
    ("dream max_new_tokens -1", "dream", "dream", {"max_new_tokens": -1}, "max_new_tokens"),
    ("dream max_new_tokens text", "dream", "dream", {"max_new_tokens": "16"}, "max_new_tokens"),
    ("gemma max_new_tokens 0", "diffusion_gemma", "diffusion-gemma", {"max_new_tokens": 0}, "max_new_tokens"),
    ("paper on llada2", "llada2", "paper", {}, "preset"),
    ("diffusion-gemma on refusion", None, "diffusion-gemma", {}, "preset"),
    ("llada2 on refusion", None, "llada2", {}, "preset"),
    ("llada on diffusion-gemma", "diffusion_gemma", "llada", {}, "preset"),
]
IDS = [case[0] for case in CASES]


@pytest.fixture(scope="module")
def models():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = {name: refusion.load_model(str(FIXTURES / name)) for name in {c[1] for c in CASES} - {None}}
    loaded[None] = refusion.load_model()
    return loaded


@pytest.mark.parametrize("fixture, preset, params, field", [c[1:] for c in CASES], ids=IDS)
def test_the_python_api_refuses_it_naming_the_field(models, fixture, preset, params, field):
    with pytest.raises(ConfigError) as caught:
        refusion.generate(PROMPT, models[fixture], preset=preset, **params)
    assert caught.value.param == field, caught.value
    assert f"`{field}`" in str(caught.value), caught.value


@pytest.mark.parametrize("part", ["reviser", "selector", "infiller"])
@pytest.mark.parametrize("value", [42, int, print, 2.5])
def test_a_part_that_is_not_a_part_is_refused_naming_its_kind(models, part, value):
    with pytest.raises(ConfigError) as caught:
        refusion.generate(PROMPT, models[None], **{part: value})
    assert caught.value.param == part and f"`{part}` must be a registered name" in str(caught.value)


@pytest.mark.parametrize(
    "option, value",
    [("eos_token_id", "1"), ("eos_token_id", True), ("eos_token_id", 1.0), ("eos_token_id", [1, "2"])]
    + [("mask_token_id", "3"), ("mask_token_id", -1), ("block_length", "32")],
)
def test_load_model_refuses_adapter_options_of_the_wrong_type_before_loading(option, value, monkeypatch):
    from refusion.models.families import base

    monkeypatch.setattr(base, "from_pretrained", lambda *a, **k: pytest.fail("weights were read"))
    with pytest.raises(ConfigError) as caught:
        refusion.load_model(str(FIXTURES / "llada2"), **{option: value})
    assert caught.value.param == option and f"`{option}`" in str(caught.value)


# -- the server: a 400 naming the request field, never a 500 ---------------------------------------------------------
@pytest.fixture(scope="module")
def clients(models):
    opened = {}
    try:
        for name, model in models.items():
            opened[name] = TestClient(create_app(Generator(model))).__enter__()
        yield opened
    finally:
        for client in opened.values():
            client.__exit__(None, None, None)


@pytest.mark.parametrize("fixture, preset, params, field", [c[1:] for c in CASES], ids=IDS)
def test_the_server_answers_400_naming_the_request_field(clients, fixture, preset, params, field):
    body = {"model": "refusion", "prompt": PROMPT, "max_tokens": 16, "params": params}
    if preset is not None:
        body["preset"] = preset
    response = clients[fixture].post("/v1/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    sent = next((key for key in params if key == field or key.endswith(f".{field}")), field)  # `selector.steps`
    assert error["param"] == (field if field == "preset" else f"params.{sent}"), error


# -- a batch row: an error row naming the field, the other rows decode ------------------------------------------------
@pytest.mark.parametrize("fixture", sorted({c[1] for c in CASES}, key=str))
def test_a_batch_row_with_it_is_an_error_row_naming_the_field(models, fixture, tmp_path):
    cases = [c for c in CASES if c[1] == fixture]
    rows = [{"id": case, "prompt": PROMPT, "params": params} for case, _, _, params, _ in cases]
    for row, (_, _, preset, _, _) in zip(rows, cases):
        if preset is not None:
            row["preset"] = preset
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_batch(source, tmp_path / "out.jsonl", model=models[fixture], progress=False, gen_length=16)
    out = {row["id"]: row for row in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    for case, _, _, _, field in cases:
        assert out[case]["error"] is not None and out[case]["error"].startswith(f"{field}: "), out[case]


# -- the command line ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["serve", "batch"])
@pytest.mark.parametrize("size", ["9" * 400, "9" * 400 + "GiB", "1" + "0" * 19 + "TiB", "1e9", "0.5"])
def test_a_kv_memory_flag_out_of_range_is_one_line_naming_the_flag(command, size, capsys, tmp_path):
    argv = [command, "--kv-memory", size] + ([str(tmp_path / "in.jsonl"), str(tmp_path / "out")] * (command == "batch"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--kv-memory" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
