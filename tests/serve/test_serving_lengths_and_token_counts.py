"""The answer's length and its count: a default ``max_tokens`` the client never sent is shortened to fit the model
(and the response says so), one it sent is refused; ``usage`` and ``refusion.tokens`` count the tokens of the text
returned, not those decoded past a stop string."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

import refusion
from refusion.api import load_model
from refusion.errors import RefusionWarning
from refusion.generator import Generator
from refusion.serve import create_app
from refusion.serve.responses import MAX_TOKENS_HEADER
from refusion.serve.text import StreamText
from tests.support.serving import one_torch_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    return load_model()


@pytest.fixture(scope="module")
def client(model):
    with TestClient(create_app(Generator(model))) as client:
        yield client


def long_prompt(model, room: int) -> str:
    """A prompt that leaves ``room`` positions of the model for the answer."""
    text = "rev " + "a" * (model.max_positions - room - 5) + "="
    assert len(model.tokenizer.encode(text)) == model.max_positions - room
    return text


def events(response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


def test_a_request_without_max_tokens_gets_the_default_shortened_to_fit_with_a_note(client, model):
    default = client.app.state.server.batcher.gen_length
    room = default - 10
    prompt = long_prompt(model, room)
    response = client.post("/v1/completions", json={"model": "refusion", "prompt": prompt})
    assert response.status_code == 200, response.text
    body = response.json()
    assert response.headers[MAX_TOKENS_HEADER] == str(room) and body["refusion"]["max_tokens"] == room
    note = body["refusion"]["note"]
    assert "`max_tokens` not given" in note and f"default {default}" in note and f"at most {room} tokens" in note
    assert body["usage"]["completion_tokens"] <= room
    with pytest.warns(RefusionWarning, match=f"so {room} tokens are generated"):
        offline = refusion.generate(prompt, model)
    assert body["refusion"]["tokens"] == offline.tokens.tolist()  # what refusion.generate chooses, token for token


def test_a_streamed_request_without_max_tokens_says_its_shortened_length_in_the_header_and_last_chunk(client, model):
    room = client.app.state.server.batcher.gen_length - 10
    chat = {"model": "refusion", "stream": True, "messages": [{"role": "user", "content": long_prompt(model, room)}]}
    response = client.post("/v1/chat/completions", json=chat)
    assert response.status_code == 200 and response.headers[MAX_TOKENS_HEADER] == str(room)
    last = [e for e in events(response) if e["choices"] and e["choices"][0]["finish_reason"]][-1]
    assert last["refusion"]["max_tokens"] == room and "at most" in last["refusion"]["note"]


def test_a_max_tokens_the_client_sent_is_refused_when_it_does_not_fit_naming_it(client, model):
    default = client.app.state.server.batcher.gen_length
    prompt = long_prompt(model, default - 10)
    response = client.post("/v1/completions", json={"model": "refusion", "prompt": prompt, "max_tokens": default})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "max_tokens" and f"max_tokens <= {default - 10}" in error["message"]


def test_a_default_that_fits_is_kept_and_carries_no_note(client):
    response = client.post("/v1/completions", json={"model": "refusion", "prompt": "rev hello="})
    default = client.app.state.server.batcher.gen_length
    assert response.headers[MAX_TOKENS_HEADER] == str(default)
    assert response.json()["refusion"]["max_tokens"] == default and "note" not in response.json()["refusion"]


def test_usage_and_refusion_tokens_count_only_the_tokens_of_the_text_before_a_stop_string(client, model):
    full = client.post("/v1/completions", json={"model": "refusion", "prompt": "rev hello=", "max_tokens": 12}).json()
    text = full["choices"][0]["text"]
    assert len(text) >= 2, "the shipped model reverses 'hello'"
    stop = text[1]  # the answer's second character: the client is shown one character
    for stream in (False, True):
        request = {"model": "refusion", "prompt": "rev hello=", "max_tokens": 12, "stop": [stop], "stream": stream}
        if stream:
            request["stream_options"] = {"include_usage": True}
            chunks = events(client.post("/v1/completions", json=request))
            shown = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
            tokens = next(c["refusion"]["tokens"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
            usage = chunks[-1]["usage"]
        else:
            body = client.post("/v1/completions", json=request).json()
            shown, tokens, usage = body["choices"][0]["text"], body["refusion"]["tokens"], body["usage"]
        assert shown == text[: text.index(stop)]
        assert usage["completion_tokens"] == len(tokens) < len(full["refusion"]["tokens"])
        assert model.tokenizer.decode(tokens, skip_special_tokens=True).startswith(shown)
        assert not model.tokenizer.decode(tokens[:-1], skip_special_tokens=True).startswith(shown) or not tokens


@settings(max_examples=40)
@given(
    tokens=st.lists(st.integers(0, 47), max_size=30),
    step=st.integers(1, 6),
    stops=st.lists(st.text("abcde=", min_size=1, max_size=3), max_size=2),
)
def test_the_tokens_kept_after_a_stop_string_are_the_fewest_that_make_the_text_shown(model, tokens, step, stops):
    tokenizer = model.tokenizer
    text = StreamText(tokenizer, model.eos_token_ids, max_tokens=64, stops=tuple(stops))
    shown = []
    for i in range(0, len(tokens), step):
        shown.append(text.feed(tokens[i : i + step]))
        if text.done:
            break
    shown.append(text.finish())
    answer = "".join(shown)

    def decoded(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    assert decoded(text.tokens).startswith(answer)
    if text.tokens and any(s in decoded(tokens) for s in stops):  # cut at a stop string: nothing past the answer
        assert not decoded(text.tokens[:-1]).startswith(answer)
