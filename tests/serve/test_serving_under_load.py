"""A bounded load test of ``refusion serve``: concurrent streams, some abandoned, in waves."""

import asyncio
import json

import httpx
import pytest

import refusion
from refusion.api import load_model
from refusion.training.tasks import held_out
from tests.support.serving import metric, one_torch_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODEL = "refusion-default"
OPTIONS = [  # (request fields, refusion.generate keywords)
    ({}, {}),
    ({"max_tokens": 16, "selector": "topk", "params": {"k": 2}}, {"gen_length": 16, "selector": "topk", "k": 2}),
    ({"max_tokens": 24, "temperature": 0.8, "seed": 3}, {"gen_length": 24, "temperature": 0.8, "seed": 3}),
    ({"max_tokens": 8}, {"gen_length": 8}),
]
SLOW = {"max_tokens": 64, "selector": "leftmost", "infiller": "greedy-verify", "params": {"stop_at_eos": False}}


@pytest.fixture(scope="module")
def server(serve_process):
    return serve_process


def jobs(count=64, cancelled=4):
    """``count`` requests with mixed prompts and options; the first ``cancelled`` are long and abandoned."""
    examples = held_out(count // 6 + 1)
    out = []
    for i in range(count):
        prompt = examples[i % len(examples)].prompt
        if i < cancelled:
            out.append((f"copy {'abcdefghij' * 2}=", SLOW, None))
        else:
            out.append((prompt, *OPTIONS[i % len(OPTIONS)]))
    return out


async def stream(client, url, prompt, fields, abandon):
    body = {"model": MODEL, "prompt": prompt, "stream": True, **fields}
    text, tokens, done = [], None, False
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            text.append(chunk["choices"][0]["text"])
            if chunk["choices"][0]["finish_reason"] is not None:
                tokens = chunk["refusion"]["tokens"]
            if abandon:
                return None  # leaves the block: the connection closes mid-stream
    assert done
    return "".join(text), tokens


async def wave(url, work):
    limits = httpx.Limits(max_connections=len(work), max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*(stream(client, url, p, f, o is None) for p, f, o in work))


def expected(model, work):
    """Offline answers ``(text, tokens)`` by (prompt, options): one batch per option set."""
    answers = {}
    for options in OPTIONS:
        prompts = sorted({p for p, _, o in work if o is options[1]})
        length = options[1].get("gen_length", 32)
        for prompt, result in zip(prompts, refusion.generate(prompts, model, **options[1])):
            tokens = result.tokens.tolist()[:length]
            answers[prompt, str(options[1])] = (model.tokenizer.decode(tokens, skip_special_tokens=True), tokens)
    return answers


def test_waves_of_concurrent_streams_complete_exactly_and_free_every_row(server):
    model = load_model()
    work = jobs()
    answers = expected(model, work)
    rss, before = [], httpx.get(server.url + "/metrics").text
    for _ in range(3):
        results = asyncio.run(wave(server.url, work))
        for (prompt, _, options), got in zip(work, results):
            if options is None:
                assert got is None
            else:
                assert got == answers[prompt, str(options)], prompt
        health = httpx.get(server.url + "/health").json()
        assert health["live_rows"] == 0 and health["waiting"] == 0
        rss.append(server.rss())
    after = httpx.get(server.url + "/metrics").text

    def count(outcome):
        return metric(after, "refusion_requests_total", endpoint="completions", outcome=outcome) - metric(
            before, "refusion_requests_total", endpoint="completions", outcome=outcome
        )

    assert count("cancelled") >= 1  # at least one abandoned stream was still decoding
    assert count("stop") + count("length") + count("cancelled") == 3 * 64 and count("error") == 0
    assert metric(after, "refusion_live_rows") == 0
    assert rss[2] - rss[0] < 32 * 2**20, rss  # warm after the first wave: later waves do not keep memory
