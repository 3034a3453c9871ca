"""The server in-process: full queue and shutdown answers, decode failures, stop strings, graceful shutdown."""

import json
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.api import load_model
from refusion.generator import Generator
from refusion.serve import create_app
from refusion.serve.text import StreamText
from tests.support.serving import free_port, one_torch_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BODY = {"model": "refusion", "prompt": "rev hello="}


@pytest.fixture(scope="module")
def model():
    return load_model()


def test_a_full_queue_answers_503_with_retry_after(model):
    generator = Generator(model, max_rows=1, max_queue=1)
    generator.submit("copy abc=")  # nobody steps this generator: the queue stays full
    client = TestClient(create_app(generator, retry_after=7, manage_generator=False))
    response = client.post("/v1/completions", json=BODY)
    assert response.status_code == 503 and response.headers["retry-after"] == "7"
    assert response.json()["error"]["code"] == "queue_full"
    assert 'refusion_requests_total{endpoint="completions",outcome="rejected"} 1.0' in client.get("/metrics").text


def test_refused_requests_are_counted_by_outcome(model):
    client = TestClient(create_app(Generator(model), manage_generator=False))
    assert client.post("/v1/completions", json={**BODY, "temperature": -1}).status_code == 400
    assert client.post("/v1/completions", json={**BODY, "model": "elsewhere"}).status_code == 404
    assert client.post("/v1/chat/completions", json={"model": "refusion"}).status_code == 400  # no messages
    text = client.get("/metrics").text
    assert 'refusion_requests_total{endpoint="completions",outcome="invalid"} 1.0' in text
    assert 'refusion_requests_total{endpoint="completions",outcome="not_found"} 1.0' in text
    assert 'refusion_requests_total{endpoint="chat",outcome="invalid"} 1.0' in text


def test_a_closing_server_refuses_new_requests_and_reports_it_on_health(model):
    generator = Generator(model)
    generator.close()
    client = TestClient(create_app(generator, manage_generator=False))
    assert (
        client.post(
            "/v1/chat/completions", json={"model": "refusion", "messages": [{"role": "user", "content": "rev abc="}]}
        ).status_code
        == 503
    )
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "closing"


def test_a_decode_failure_is_a_500_plain_and_an_error_event_streamed(model):
    generator = Generator(model)

    def broken(*args):
        raise RuntimeError("device lost")

    generator.engine.run_network = broken  # every forward, a program's call or a whole-batch loop's
    with TestClient(create_app(generator)) as client:
        response = client.post("/v1/completions", json=BODY)
        assert response.status_code == 500 and "device lost" in response.json()["error"]["message"]
        events = [
            line
            for line in client.post("/v1/completions", json={**BODY, "stream": True}).text.splitlines()
            if line.startswith("data: ")
        ]
        assert "device lost" in json.loads(events[0][6:])["error"]["message"] and events[-1] == "data: [DONE]"
        assert client.get("/health").json()["live_rows"] == 0


def test_unknown_routes_and_methods_get_openai_error_bodies(model):
    client = TestClient(create_app(Generator(model), manage_generator=False))
    assert client.get("/v1/nothing").json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/completions").status_code == 405
    bad_json = client.post("/v1/completions", content=b"{", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"


@settings(max_examples=40)
@given(
    tokens=st.lists(st.integers(0, 47), max_size=30),
    cuts=st.lists(st.integers(1, 5), min_size=1),
    stops=st.lists(st.text("abcde=", min_size=1, max_size=3), max_size=2),
    max_tokens=st.integers(1, 40),
)
def test_streamed_deltas_add_up_to_the_answer_cut_at_eos_max_tokens_and_the_first_stop(
    model, tokens, cuts, stops, max_tokens
):
    tokenizer, eos = model.tokenizer, model.eos_token_ids
    text = StreamText(tokenizer, eos, max_tokens=max_tokens, stops=tuple(stops))
    shown, i, k = [], 0, 0
    while i < len(tokens) and not text.done:
        step = cuts[k % len(cuts)]
        shown.append(text.feed(tokens[i : i + step]))
        i, k = i + step, k + 1
    shown.append(text.finish())
    answer = []
    for token in tokens[:max_tokens]:
        answer.append(token)
        if token in eos:
            break
    full = tokenizer.decode(answer, skip_special_tokens=True)
    cut = min([full.find(s) for s in stops if s in full], default=len(full))
    assert "".join(shown) == full[:cut]
    assert text.finish_reason in ("stop", "length")


def test_shutdown_lets_a_live_stream_finish(model):
    import uvicorn

    generator = Generator(model)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(generator), host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=30
        )
    )
    thread = threading.Thread(target=server.run)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    while not server.started:
        time.sleep(0.05)
    body = {
        **BODY,
        "stream": True,
        "prompt": "copy abcdefghijabcdefghij=",
        "max_tokens": 64,
        "selector": "leftmost",
        "infiller": "greedy-verify",
        "params": {"stop_at_eos": False},
    }
    lines = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                if not lines:
                    server.should_exit = True  # what uvicorn does on SIGTERM / SIGINT
                lines.append(line)
    thread.join(60)
    assert not thread.is_alive() and lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")
    assert generator.closing and not generator.running


def test_a_client_gone_before_its_answer_cancels_the_request_and_frees_its_row(model):
    import asyncio

    from refusion.serve.options import RequestPlan
    from refusion.serve.session import LiveRequest, pieces

    generator = Generator(model, max_rows=1)
    plan = RequestPlan(model.tokenizer("rev abc=", add_special_tokens=False)["input_ids"], None, 32, None, (), {})

    async def abandoned():
        live = LiveRequest(generator, plan, asyncio.get_running_loop())
        generator.step()  # admitted: it holds the row
        got = [p async for p in pieces(live, poll=0, disconnected=lambda: asyncio.sleep(0, True))]
        return live, got

    live, got = asyncio.run(abandoned())
    generator.step()
    assert got == [] and live.request.status == "cancelled" and generator.live_rows == 0
