"""`refusion serve` defaults to the shipped model on 127.0.0.1:8000; server-wide decoding defaults hold per request."""

import pytest
from fastapi.testclient import TestClient

import refusion
from refusion.api import build_decoder, load_model
from refusion.cli import build_parser
from refusion.generator import Generator
from refusion.serve import ServeDefaults, create_app
from tests.support.serving import one_torch_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_serve_without_arguments_is_the_shipped_model_on_loopback_port_8000():
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.model, args.max_rows, args.max_queue) == ("127.0.0.1", 8000, None, 16, 256)
    assert args.func.__name__ == "run_serve"


def test_server_defaults_apply_to_every_request_and_a_request_overrides_them():
    model = load_model()
    defaults = ServeDefaults(parts={"selector": "topk"}, params={"k": 2}, gen_length=12)
    decoder, _ = build_decoder(model, selector="topk", k=2)
    generator = Generator(model, decoder, gen_length=12)
    with TestClient(create_app(generator, model_name="m", defaults=defaults)) as client:
        plain = client.post("/v1/completions", json={"model": "m", "prompt": "rev hello="}).json()
        assert (
            plain["refusion"]["tokens"]
            == refusion.generate("rev hello=", model, selector="topk", k=2, gen_length=12).tokens.tolist()
        )
        own = client.post(
            "/v1/completions",
            json={"model": "m", "prompt": "rev hello=", "params": {"k": 1}, "seed": 5, "temperature": 0.7},
        ).json()
        assert (
            own["refusion"]["tokens"]
            == refusion.generate(
                "rev hello=", model, selector="topk", k=1, seed=5, temperature=0.7, gen_length=12
            ).tokens.tolist()
        )


def test_serve_takes_its_default_preset_from_a_preset_file(tmp_path, monkeypatch):
    import json

    import refusion.serve
    from refusion.cli import main

    path = tmp_path / "preset.json"
    path.write_text(json.dumps({"gen_length": 16, "selector": "topk", "params": {"k": 2, "slot_size": 4}}))
    seen = {}
    monkeypatch.setattr(refusion.serve, "serve", lambda model, **kw: seen.update(kw))
    assert main(["serve", "--preset-file", str(path)]) == 0
    preset = seen["defaults"].preset
    assert preset == refusion.load_preset(path) and preset.selector.params["k"] == 2
