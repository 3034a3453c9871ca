"""A live ``refusion serve`` driven by the official openai client and httpx answers as offline decoding does."""

import json

import httpx
import openai
import pytest

import refusion
from refusion.api import load_model
from tests.support.serving import metric, one_torch_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODEL = "refusion-default"

# (request fields, the keywords of refusion.generate that decode the same tokens)
CASES = [
    ({}, {}),
    ({"max_tokens": 12, "selector": "topk", "params": {"k": 2}}, {"gen_length": 12, "selector": "topk", "k": 2}),
    (
        {"temperature": 0.9, "top_p": 0.95, "seed": 7, "max_tokens": 16},
        {"temperature": 0.9, "top_p": 0.95, "seed": 7, "gen_length": 16},
    ),
    (
        {"preset": "fast-dllm", "max_tokens": 24, "params": ["slot_threshold=0.5"]},
        {"preset": "fast-dllm", "gen_length": 24, "slot_threshold": 0.5},
    ),
]
PROMPTS = ["rev helloworld=", "copy abcdefghij=", "add 591+925=", "sort wdw="]


@pytest.fixture(scope="module")
def server(serve_process):
    return serve_process


@pytest.fixture(scope="module")
def model():
    return load_model()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def offline(model, prompt, options):
    result = refusion.generate(prompt, model, **options, record=True)
    length = options.get("gen_length", 32)
    return result.tokens.tolist()[:length], model.tokenizer.decode(
        result.tokens.tolist()[:length], skip_special_tokens=True
    )


def split(fields):
    """openai's keyword arguments and refusion's own fields (sent as extra_body)."""
    known = {"max_tokens", "temperature", "top_p", "seed", "stop"}
    return {k: v for k, v in fields.items() if k in known}, {k: v for k, v in fields.items() if k not in known}


@pytest.mark.parametrize("case", range(len(CASES)))
def test_completions_equal_offline_decoding_plain_and_streamed(client, model, case):
    fields, options = CASES[case]
    kwargs, extra = split(fields)
    for prompt in PROMPTS[:2]:
        tokens, text = offline(model, prompt, options)
        whole = client.completions.create(model=MODEL, prompt=prompt, extra_body=extra, **kwargs)
        assert whole.choices[0].text == text
        assert whole.refusion["tokens"] == tokens
        assert whole.usage.completion_tokens == len(tokens) and whole.refusion["forwards"] >= 1
        assert whole.choices[0].finish_reason == ("stop" if tokens and tokens[-1] in model.eos_token_ids else "length")
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, stream=True, extra_body=extra, **kwargs))
        assert "".join(c.choices[0].text for c in chunks) == text
        assert chunks[-1].refusion["tokens"] == tokens and chunks[-1].choices[0].finish_reason is not None


@pytest.mark.parametrize("case", [0, 2])
def test_chat_completions_equal_offline_decoding_plain_and_streamed(client, model, case):
    fields, options = CASES[case]
    kwargs, extra = split(fields)
    for prompt in PROMPTS[2:]:
        tokens, text = offline(model, prompt, options)
        messages = [{"role": "user", "content": prompt}]
        whole = client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra, **kwargs)
        assert whole.choices[0].message.content == text and whole.refusion["tokens"] == tokens
        stream = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            stream=True,
            extra_body=extra,
            stream_options={"include_usage": True},
            **kwargs,
        )
        chunks = list(stream)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        assert chunks[-1].usage.completion_tokens == len(tokens) and not chunks[-1].choices


def test_a_stop_string_cuts_the_text_and_ends_the_request(client, model):
    _, text = offline(model, "copy abcdefghij=", {})
    assert "efg" in text
    whole = client.completions.create(model=MODEL, prompt="copy abcdefghij=", stop=["efg", "zz"])
    streamed = client.completions.create(model=MODEL, prompt="copy abcdefghij=", stop="efg", stream=True)
    assert whole.choices[0].text == text[: text.index("efg")] == "".join(c.choices[0].text for c in streamed)
    assert whole.choices[0].finish_reason == "stop"


def test_stream_steps_report_every_committed_slot_and_the_prefix(server, model):
    body = {
        "model": MODEL,
        "prompt": "rev helloworld=",
        "stream": True,
        "stream_steps": True,
        "max_tokens": 16,
        "selector": "topk",
        "params": {"k": 1},
    }
    events = []
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    steps = [c["refusion"] for c in chunks if "step" in c.get("refusion", {})]
    assert [s["step"] for s in steps] == list(range(len(steps)))
    result = refusion.generate("rev helloworld=", model, gen_length=16, selector="topk", k=1, record=True)
    assert [[c["slot"] for c in s["commits"]] for s in steps] == [
        [i for i, _ in s.committed] for s in result.iterations
    ]
    assert [s["prefix_length"] for s in steps] == sorted(s["prefix_length"] for s in steps)


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "refusion_requests_total",
        "refusion_queue_depth",
        "refusion_live_rows",
        "refusion_forwards_total",
        "refusion_tokens_per_forward",
        "refusion_request_latency_seconds_bucket",
        "refusion_time_to_first_token_seconds_bucket",
        "process_resident_memory_bytes",
    ):
        assert name in text, name
    assert metric(text, "refusion_generated_tokens_total") > 0 and metric(text, "refusion_forwards_total") > 0


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"prompt": "x", "selector": "nope"}, 400, "selector"),
        ({"prompt": "x", "params": {"bogus": 1}}, 400, "params.bogus"),
        ({"prompt": "x", "params": {"slot_threshold": 2.0}}, 400, "params.slot_threshold"),
        ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
        ({"prompt": "x", "max_tokens": 1000}, 400, "max_tokens"),
        ({"prompt": "x" * 200}, 400, "prompt"),
        ({"prompt": [5, 99999]}, 400, "prompt"),
        ({"prompt": "x", "temperature": -1}, 400, "temperature"),
        ({"prompt": "x", "n": 2}, 400, "n"),
        ({"prompt": "x", "logprobs": 3}, 400, "logprobs"),
        ({}, 400, "prompt"),
        ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ],
)
def test_bad_requests_get_an_openai_error_naming_the_field(server, body, status, param):
    response = httpx.post(server.url + "/v1/completions", json={"model": MODEL, **body}, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError, match="selector"):
        client.completions.create(model=MODEL, prompt="x", extra_body={"selector": "nope"})
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=MODEL, messages=[])


def test_requests_sharing_a_prompt_prefix_reuse_its_pages_and_answer_as_offline(server, client, model):
    """The server reuses prompt prefixes by default; /metrics counts the tokens looked up and found (in tokens)."""
    before = httpx.get(server.url + "/metrics").text
    prompts = ["copy abcdefghijklmnopq=", "copy abcdefghijklmnopr="]  # 22 shared tokens: one full 16-token page
    for prompt in prompts:
        tokens, text = offline(model, prompt, {})
        whole = client.completions.create(model=MODEL, prompt=prompt)
        assert whole.choices[0].text == text and whole.refusion["tokens"] == tokens
    after = httpx.get(server.url + "/metrics").text
    grew = {
        name: metric(after, name) - metric(before, name)
        for name in ("refusion_prefix_cache_queries_total", "refusion_prefix_cache_hits_total")
    }
    assert grew["refusion_prefix_cache_queries_total"] >= 2 * 22  # every prompt token but the last, both requests
    assert grew["refusion_prefix_cache_hits_total"] >= 16  # the second found the first's full page
    assert metric(after, "refusion_prefix_cache_pages_used") >= 1
    assert metric(after, "refusion_prefix_cache_pages_total") >= metric(after, "refusion_prefix_cache_pages_used")
    # keys/values on pages: between requests only the prefix cache's pages are held, within the budget
    used, total = metric(after, "refusion_kv_pages_used"), metric(after, "refusion_kv_pages_total")
    assert used == metric(after, "refusion_prefix_cache_pages_used") and 0 < used <= total
