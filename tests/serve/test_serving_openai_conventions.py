"""The server follows the conventions clients of the OpenAI API and vLLM expect (issue 30): OpenAI's fields with
neutral values are accepted and others refused naming the field, bodies must be JSON, a NaN is named by its field,
vLLM's tokenizer endpoints answer, and a client that hangs up mid-body is one INFO line, not a traceback."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest
from fastapi.testclient import TestClient

from refusion.api import load_model
from refusion.generator import Generator
from refusion.serve import create_app
from tests.support.serving import free_port, metric, one_torch_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BODY = {"model": "refusion", "prompt": "rev hello=", "max_tokens": 8}
CHAT = {"model": "refusion", "messages": [{"role": "user", "content": "rev hello="}], "max_tokens": 8}
#: what LangChain's OpenAI wrapper sends by default (its `_default_params`), and lm-eval's local-completions
LANGCHAIN = {
    "frequency_penalty": 0,
    "logprobs": None,
    "max_tokens": 8,
    "n": 1,
    "presence_penalty": 0,
    "seed": None,
    "temperature": 0.7,
    "top_p": 1,
}


@pytest.fixture(scope="module")
def model():
    return load_model()


@pytest.fixture(scope="module")
def client(model):
    with TestClient(create_app(Generator(model))) as client:
        yield client


def error_of(response, status):
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {**BODY, **LANGCHAIN, "prompt": ["rev hello="]}),
        (
            "/v1/completions",
            {
                **BODY,
                "temperature": 0,
                "top_p": 1,
                "echo": False,
                "best_of": 1,
                "logit_bias": {},
                "suffix": "",
                "frequency_penalty": 0.0,
                "presence_penalty": 0.0,
                "user": "u",
            },
        ),
        ("/v1/completions", {**BODY, "temperature": 0, "stop": ["\n", "<|endoftext|>"], "seed": 1234}),  # lm-eval's
        (
            "/v1/chat/completions",
            {
                **CHAT,
                "logprobs": False,
                "top_logprobs": 0,
                "response_format": {"type": "text"},
                "tools": [],
                "tool_choice": "none",
                "parallel_tool_calls": True,
                "logit_bias": None,
            },
        ),
    ],
)
def test_stock_clients_neutral_fields_are_accepted(client, path, body):
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    "path, field, value",
    [
        ("/v1/completions", "frequency_penalty", 0.5),
        ("/v1/completions", "presence_penalty", -1.0),
        ("/v1/completions", "logit_bias", {"5": 10}),
        ("/v1/completions", "logprobs", 1),
        ("/v1/completions", "logprobs", 0),
        ("/v1/completions", "echo", True),
        ("/v1/completions", "best_of", 2),
        ("/v1/completions", "suffix", "the end"),
        ("/v1/chat/completions", "logprobs", True),
        ("/v1/chat/completions", "top_logprobs", 2),
        ("/v1/chat/completions", "response_format", {"type": "json_object"}),
        ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
        ("/v1/chat/completions", "tool_choice", "required"),
    ],
)
def test_a_field_the_server_cannot_honour_is_refused_naming_it(client, path, field, value):
    body = {**(BODY if path == "/v1/completions" else CHAT), field: value}
    error = error_of(client.post(path, json=body), 400)
    assert error["param"] == field and error["code"] == "unsupported_value" and f"`{field}`" in error["message"]


def test_top_p_1_is_neutral_at_temperature_0_and_other_values_are_not(client):
    assert client.post("/v1/completions", json={**BODY, "temperature": 0, "top_p": 1}).status_code == 200
    assert (
        error_of(client.post("/v1/completions", json={**BODY, "temperature": 0, "top_p": 0.5}), 400)["param"] == "top_p"
    )


def test_a_body_must_be_declared_json(client):
    before = metric(client.get("/metrics").text, "refusion_requests_total", endpoint="completions", outcome="invalid")
    error = error_of(
        client.post("/v1/completions", content=json.dumps(BODY), headers={"content-type": "text/plain"}), 415
    )
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]
    after = metric(client.get("/metrics").text, "refusion_requests_total", endpoint="completions", outcome="invalid")
    assert after == before + 1
    for declared in ("application/json; charset=utf-8", "application/vnd.api+json"):
        assert (
            client.post("/v1/completions", content=json.dumps(BODY), headers={"content-type": declared}).status_code
            == 200
        )


@pytest.mark.parametrize(
    "raw, param",
    [
        (b'{"model": "refusion", "prompt": "x", "temperature": NaN}', "temperature"),
        (b'{"model": "refusion", "prompt": "x", "top_p": -Infinity}', "top_p"),
        (b'{"model": "refusion", "prompt": "x", "params": {"k": Infinity}}', "params.k"),
        (b'{"model": "refusion", "prompt": "x", "params": ["k=2", NaN]}', "params[1]"),
    ],
)
def test_a_nan_or_infinity_is_refused_naming_its_field(client, raw, param):
    error = error_of(client.post("/v1/completions", content=raw, headers={"content-type": "application/json"}), 400)
    assert error["param"] == param and "not a JSON number" in error["message"]


def test_the_tokenizer_endpoints_answer_as_vllms_do(client, model):
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|endoftext|>" and info["model_max_length"] == 128
    tokens = client.post("/tokenize", json={"prompt": "rev ab=", "add_special_tokens": False}).json()
    assert tokens["tokens"] == model.tokenizer("rev ab=", add_special_tokens=False)["input_ids"]
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 128
    assert client.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "rev ab="}
    assert error_of(client.post("/detokenize", json={"tokens": [10**6]}), 400)["param"] == "tokens"
    assert error_of(client.post("/tokenize", json={"prompt": "x" * 5000}), 400)["param"] == "prompt"
    assert error_of(client.post("/tokenize", json={"prompt": "x", "model": "other"}), 404)["param"] == "model"


def test_a_client_hanging_up_mid_body_is_one_info_line_not_a_traceback(model, caplog):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(Generator(model)), host="127.0.0.1", port=port, log_config=None, log_level="info")
    )
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        with caplog.at_level(logging.INFO):
            for _ in range(20):
                with socket.create_connection(("127.0.0.1", port)) as sock:
                    sock.sendall(
                        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b'Content-Length: 1000\r\n\r\n{"model": '
                    )
                time.sleep(0.02)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and sum("hung up" in r.getMessage() for r in caplog.records) < 20:
                time.sleep(0.05)
    finally:
        server.should_exit = True
        thread.join(30)
    hung_up = [r for r in caplog.records if "hung up" in r.getMessage()]
    assert len(hung_up) == 20 and all(r.levelno == logging.INFO and r.exc_info is None for r in hung_up)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
