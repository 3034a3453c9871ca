"""The server under hostile requests: nothing imported from the network, bounded bodies and prompts, no 500s,
special-token text refused, and `refusion serve` options checked before the server starts."""

import asyncio
import copy
import json
import socket
import sys
import threading
import time
import types

import httpx
import pytest
from fastapi.testclient import TestClient

from refusion.api import load_model
from refusion.cli import main
from refusion.errors import APIError, BodyTooLarge
from refusion.generator import Generator
from refusion.serve import ServeDefaults, ServePolicy, create_app
from refusion.serve.body_limit import BodyLimit
from refusion.serve.options import plan_request
from refusion.serve.schema import ChatCompletionRequest
from tests.support.serving import one_torch_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BODY = {"model": "refusion", "prompt": "rev hello="}
CHAT = {"model": "refusion", "messages": [{"role": "user", "content": "rev hello="}]}


@pytest.fixture(scope="module")
def model():
    return load_model()


@pytest.fixture(scope="module")
def client(model):
    with TestClient(create_app(Generator(model))) as client:
        yield client


def error_of(response, status=None):
    """The OpenAI error of ``response`` (asserting a 4xx, or ``status``, with a JSON error body)."""
    assert 400 <= response.status_code < 500 if status is None else response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"], error
    return error


# -- nothing is imported from the network ---------------------------------------------------------------------------


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    """The name of a module on sys.path that records being imported (and is removed from sys.modules after)."""
    name = f"refusion_test_recorder_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        f"import pathlib\npathlib.Path({str(tmp_path / 'imported')!r}).touch()\nclass Part:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"selector": "{name}:Part"}, "selector"),
        ({"params": {"engine": "{name}:Part"}}, "params.engine"),
        ({"params": ["engine={name}:Part"]}, "params.engine"),
        ({"params": {"selector": "{name}:Part"}}, "params.selector"),
    ],
)
def test_a_part_named_by_module_path_is_refused_and_never_imported(model, recorder, tmp_path, fields, param):
    fields = json.loads(json.dumps(fields).replace("{name}", recorder))
    with TestClient(create_app(Generator(model))) as client:
        error = error_of(client.post("/v1/completions", json={**BODY, **fields}), 400)
    assert error["param"] == param and error["code"] == "import_refused" and "--allow-imports" in error["message"]
    assert recorder not in sys.modules and not (tmp_path / "imported").exists()


def test_allow_imports_lets_a_trusted_deployment_name_module_paths(model, recorder, tmp_path):
    with TestClient(create_app(Generator(model), policy=ServePolicy(allow_imports=True))) as client:
        error = error_of(client.post("/v1/completions", json={**BODY, "selector": f"{recorder}:Part"}), 400)
    assert error["param"] == "selector" and "is not a" in error["message"]  # imported, then checked
    assert recorder in sys.modules and (tmp_path / "imported").exists()


# -- hostile bodies are 4xx with an OpenAI error, never 500 ---------------------------------------------------------


def raw(text):
    return text.encode() if isinstance(text, str) else text


HOSTILE = [  # (endpoint, body: a dict sent as JSON or raw bytes, status (None: anything but 5xx), param or None)
    ("completions", b"[]", 400, None),
    ("completions", b"1", 400, None),
    ("completions", b"null", 400, None),
    ("completions", b'"text"', 400, None),
    ("completions", b"", 400, None),
    ("completions", b"{", 400, None),
    ("completions", b"\xff\xfe\x00{", 400, None),
    ("completions", b'{"model": ' + b"[" * 20000 + b"]" * 20000 + b"}", 400, None),  # deep nesting
    ("completions", raw('{"model": "refusion", "prompt": "x", "max_tokens": 1' + "0" * 5000 + "}"), 400, None),
    ("completions", b'{"model": "refusion", "prompt": "x", "temperature": NaN}', 400, None),
    ("completions", b'{"model": "refusion", "prompt": "x", "top_p": Infinity}', 400, None),
    ("completions", b'{"model": "refusion", "prompt": "x", "params": {"slot_threshold": -Infinity}}', 400, None),
    ("completions", b'{"model": "refusion", "prompt": "\\ud800"}', 400, "prompt"),  # a lone surrogate
    ("completions", {**BODY, "max_tokens": 10**30}, 400, "max_tokens"),
    ("completions", {**BODY, "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {**BODY, "max_tokens": "ten"}, 400, "max_tokens"),
    ("completions", {**BODY, "seed": 10**30}, 400, "seed"),
    ("completions", {**BODY, "top_k": 10**30}, None, None),
    ("completions", {**BODY, "n": 10**30}, 400, "n"),
    ("completions", {**BODY, "stream": "yes"}, 400, "stream"),
    ("completions", {**BODY, "stop": ["a"] * 17}, 400, "stop"),
    ("completions", {**BODY, "model": 5}, 400, "model"),
    ("completions", {**BODY, "model": "\ud800"}, 404, "model"),
    ("completions", {**BODY, "prompt": 5}, 400, "prompt"),
    ("completions", {**BODY, "prompt": {"a": 1}}, 400, "prompt"),
    ("completions", {**BODY, "prompt": []}, 400, "prompt"),
    ("completions", {**BODY, "prompt": [10**30]}, 400, "prompt"),
    ("completions", {**BODY, "prompt": [-1]}, 400, "prompt"),
    ("completions", {**BODY, "prompt": ["a", "b"]}, 400, "prompt"),
    ("completions", {**BODY, "prompt": "x" * 5000}, 400, "prompt"),  # over 8 characters per model position
    ("completions", {**BODY, "prompt": "rev <|endoftext|>="}, 400, "prompt"),
    ("completions", {**BODY, "sample": "abc"}, 400, "sample"),
    ("completions", {**BODY, "params": {"sample": "abc"}}, 400, "params.sample"),
    ("completions", {**BODY, "params": "k=2"}, 400, "params"),
    ("completions", {**BODY, "params": {"k": [1, 2]}}, 400, None),
    ("completions", {**BODY, "params": {"cfg_scale": 2.0}}, 400, "params.cfg_scale"),  # a causal model: no guidance
    ("completions", {**BODY, "params": {"engine": "canvas"}}, 400, "params.engine"),
    ("completions", {**BODY, "params": {"gen_length": 100000}}, 400, "params.gen_length"),
    ("completions", {**BODY, "params": {"calls_per_token": 10**30}}, None, None),
    ("completions", {**BODY, "params": {"slot_size": -1}}, 400, "params.slot_size"),
    ("completions", {**BODY, "selector": "topk", "params": {"k": 10**30}}, None, None),
    ("completions", {**BODY, "preset": "../../etc/passwd"}, 400, "preset"),
    ("completions", {**BODY, "selector": "os:system"}, 400, "selector"),
    ("chat", {**CHAT, "messages": "hi"}, 400, "messages"),
    ("chat", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]}, 400, None),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "y" * 600}] * 2}, 400, "messages"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "rev <|mask|>="}]}, 400, "messages[0].content"),
    ("chat", {**CHAT, "max_completion_tokens": -1}, 400, "max_completion_tokens"),
]


@pytest.mark.parametrize("case", range(len(HOSTILE)), ids=lambda i: f"{HOSTILE[i][0]}-{i}")
def test_hostile_bodies_get_a_4xx_openai_error_never_a_500(client, case):
    endpoint, body, status, param = HOSTILE[case]
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text
    if status is None and response.status_code == 200:  # harmless (e.g. a huge k is all candidates)
        return
    error = error_of(response, status)
    if param is not None:
        assert error["param"] == param, error


def test_the_prompt_bound_is_checked_before_tokenising_and_names_the_limit(model, monkeypatch):
    tokenizer = model.tokenizer
    with TestClient(create_app(Generator(model), policy=ServePolicy(max_prompt_chars=12))) as client:
        monkeypatch.setattr(type(tokenizer), "__call__", lambda *a, **k: pytest.fail("tokenised"))
        error = error_of(client.post("/v1/completions", json={**BODY, "prompt": "rev abcdefghij="}), 400)
        assert error["param"] == "prompt" and "at most 12" in error["message"]
        error = error_of(
            client.post(
                "/v1/chat/completions",
                json={
                    **CHAT,
                    "messages": [{"role": "system", "content": "copy"}, {"role": "user", "content": "rev abcdefghij="}],
                },
            ),
            400,
        )
        assert error["param"] == "messages" and "19 characters" in error["message"]


# -- bounded bodies ------------------------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_413_naming_it_declared_or_streamed(model):
    with TestClient(create_app(Generator(model), policy=ServePolicy(max_body_bytes=1000))) as client:
        big = json.dumps({**BODY, "prompt": "x" * 2000}).encode()
        error = error_of(client.post("/v1/completions", content=big), 413)
        assert error["code"] == "request_too_large" and "1000 bytes" in error["message"]
        chunks = (big[i : i + 300] for i in range(0, len(big), 300))  # no Content-Length: counted as it streams
        assert error_of(client.post("/v1/completions", content=chunks), 413)["code"] == "request_too_large"
        assert client.post("/v1/completions", json=BODY).status_code == 200  # the server goes on


def run_asgi(app, scope_headers, chunks):
    """Drive ``app`` with a POST whose body comes in ``chunks``; returns (sent messages, chunks read)."""
    sent, read = [], []
    queue = list(chunks)

    async def receive():
        chunk = queue.pop(0)
        read.append(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(queue)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": scope_headers}
    asyncio.run(app(scope, receive, send))
    return sent, read


async def reading_app(scope, receive, send):
    """An app that reads its whole body and, if the read fails, answers 400 as frameworks do."""
    try:
        while (await receive()).get("more_body"):
            pass
    except BodyTooLarge:
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b"bad"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_body_limit_refuses_a_declared_length_unread_and_stops_reading_past_the_limit():
    limit = BodyLimit(reading_app, max_bytes=10)
    sent, read = run_asgi(limit, [(b"content-length", b"11")], [b"x" * 11])
    assert sent[0]["status"] == 413 and read == []
    sent, read = run_asgi(limit, [], [b"x" * 6, b"x" * 6, b"x" * 6])
    assert [m.get("status") for m in sent if "status" in m] == [413] and len(read) == 2
    assert b"10 bytes" in sent[-1]["body"]
    sent, read = run_asgi(limit, [(b"content-length", b"10")], [b"x" * 5, b"x" * 5])
    assert sent[0]["status"] == 200 and len(read) == 2


def test_planning_runs_off_the_event_loop(model, monkeypatch):
    import refusion.serve.routes.completions as app_module

    def slow_plan(*args, **kwargs):
        time.sleep(1.5)
        raise APIError(400, "planned slowly", param="prompt")

    monkeypatch.setattr(app_module, "plan_request", slow_plan)
    app = create_app(Generator(model), manage_generator=False)

    async def race():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            slow = asyncio.create_task(client.post("/v1/completions", json=BODY))
            await asyncio.sleep(0.2)
            started = time.perf_counter()
            await client.get("/health")
            return time.perf_counter() - started, await slow

    health_took, slow = asyncio.run(race())
    assert health_took < 1.0 and slow.status_code == 400  # answered while the plan still slept


def slowly(data, size=2**16):
    """``data`` in chunks, a little at a time (a chunked upload of about a second for 10 MB)."""
    for i in range(0, len(data), size):
        time.sleep(0.005)
        yield data[i : i + size]


def test_a_10mb_body_is_refused_while_health_keeps_answering_and_memory_stays_flat(serve_process):
    server = serve_process
    big = b'{"model": "refusion-default", "prompt": "' + b"x" * (10 * 2**20) + b'"}'
    before = server.rss()
    answers = {}

    def upload():
        declared = httpx.post(server.url + "/v1/completions", content=big, timeout=60)
        streamed = httpx.post(server.url + "/v1/completions", content=slowly(big), timeout=60)
        answers.update(declared=declared, streamed=streamed)

    thread = threading.Thread(target=upload)
    thread.start()
    waits = []
    while thread.is_alive() or not waits:
        started = time.perf_counter()
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        waits.append(time.perf_counter() - started)
        time.sleep(0.02)
    thread.join()
    for answer in answers.values():
        assert error_of(answer, 413)["code"] == "request_too_large" and "262144" in answer.json()["error"]["message"]
    assert max(waits) < 2.0, waits
    assert server.rss() - before < 200 * 2**20


# -- special-token text ---------------------------------------------------------------------------------------------


def test_allow_special_tokens_lets_prompts_name_special_tokens(model):
    with TestClient(create_app(Generator(model), policy=ServePolicy(allow_special_tokens=True))) as client:
        answer = client.post("/v1/completions", json={**BODY, "prompt": "rev <|endoftext|>=", "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        ids = model.tokenizer("rev <|endoftext|>=", add_special_tokens=False)["input_ids"]
        assert answer.json()["usage"]["prompt_tokens"] == len(ids) and min(model.eos_token_ids) in ids


def test_the_chat_template_keeps_its_own_special_tokens_while_message_text_may_not_have_them(model):
    tokenizer = copy.deepcopy(model.tokenizer)
    tokenizer.chat_template = "{% for m in messages %}<|pad|>{{ m['content'] }}<|endoftext|>{% endfor %}"
    real = Generator(model)
    generator = types.SimpleNamespace(
        model=types.SimpleNamespace(tokenizer=tokenizer, max_positions=128),
        decoder=real.decoder,
        engine=real.engine,
        gen_length=8,
    )
    plan = plan_request(ChatCompletionRequest(**CHAT), generator, ServeDefaults())
    pad, eos = tokenizer.convert_tokens_to_ids(["<|pad|>", "<|endoftext|>"])
    assert plan.prompt_ids[0] == pad and plan.prompt_ids[-1] == eos
    hostile = {**CHAT, "messages": [{"role": "system", "content": "ok"}, {"role": "user", "content": "a<|pad|>"}]}
    with pytest.raises(APIError) as refused:
        plan_request(ChatCompletionRequest(**hostile), generator, ServeDefaults())
    assert refused.value.status == 400 and refused.value.param == "messages[1].content"
    allowed = plan_request(
        ChatCompletionRequest(**hostile), generator, ServeDefaults(), ServePolicy(allow_special_tokens=True)
    )
    assert allowed.prompt_ids.count(pad) == 3


# -- `refusion serve` options are checked before anything starts ---------------------------------------------------


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--threads", "0"], "--threads"),
        (["--retry-after", "-5"], "--retry-after"),
        (["--shutdown-timeout", "nan"], "--shutdown-timeout"),
        (["--shutdown-timeout", "inf"], "--shutdown-timeout"),
        (["--port", "99999"], "--port"),
        (["--port", "0"], "--port"),
        (["--host", "256.1.1.1"], "256.1.1.1"),
        (["--host", "bad host"], "bad host"),
        (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--max-body-bytes", "-1"], "--max-body-bytes"),
        (["--max-prompt-chars", "0"], "--max-prompt-chars"),
        (["--max-rows", "0"], "--max-rows"),
        (["--max-batch-tokens", "0"], "--max-batch-tokens"),
        (["--max-queue", "-1"], "--max-queue"),
        (["--log-level", "loud"], "--log-level"),
    ],
)
def test_bad_serve_options_are_one_line_errors_naming_the_option(capsys, argv, named):
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refusion: error: ") and err.count("\n") == 1 and named in err, err
    assert "Traceback" not in err


def test_a_port_in_use_is_a_one_line_error_naming_host_and_port(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.perf_counter()
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refusion: error: ") and err.count("\n") == 1 and f"127.0.0.1:{port}" in err, err
    assert time.perf_counter() - started < 10  # refused before the model loads


def test_a_bug_while_planning_is_a_json_500_naming_only_its_type(model, monkeypatch):
    """A raw error a request reaches (a bug, not the client's) is an OpenAI error body, not Starlette's plain-text
    page; its text, which may hold server details, stays in the log."""
    import refusion.serve.routes.completions as app_module

    def broken(*args, **kwargs):
        raise TypeError("'>' not supported between instances of 'str' and 'int' (/srv/secret/path.py)")

    monkeypatch.setattr(app_module, "plan_request", broken)
    with TestClient(create_app(Generator(model)), raise_server_exceptions=False) as client:
        response = client.post("/v1/completions", json=BODY)
        assert response.status_code == 500 and response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "internal_error"
        assert "TypeError" in error["message"] and "secret" not in error["message"]
        assert client.get("/health").status_code == 200
