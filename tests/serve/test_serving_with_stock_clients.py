"""Stock clients run against `refusion serve` with their default settings (issue 30): the official `openai`
client, LangChain's OpenAI wrappers (which send `frequency_penalty: 0`, `top_p: 1`, `max_tokens: 256`, ...) and
lm-evaluation-harness's `local-completions` model (which finds the server's tokenizer endpoints, as it does vLLM's).

The server runs the shipped model's weights with 1024 positions (RoPE reaches any length), so that LangChain's
default of 256 new tokens fits, as it would on a published checkpoint.
"""

from __future__ import annotations

import json
import shutil

import openai
import pytest

from refusion.models.default import default_model_path
from tests.support.serving import ServerProcess

MODEL = "refusion-1024"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model") / MODEL
    shutil.copytree(default_model_path(), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1024}))
    process = ServerProcess("--model", str(folder)).start()
    yield process
    process.stop()


def test_the_openai_client_with_its_defaults(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    completion = client.completions.create(model=MODEL, prompt="rev helloworld=")
    assert completion.choices[0].finish_reason in ("stop", "length") and completion.usage.completion_tokens > 0
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "rev helloworld="}])
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason in ("stop", "length")
    streamed = list(client.completions.create(model=MODEL, prompt="rev helloworld=", stream=True))
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")


def test_langchains_openai_wrappers_with_their_defaults(server, monkeypatch):
    langchain_openai = pytest.importorskip("langchain_openai")
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    text = langchain_openai.OpenAI(base_url=server.url + "/v1", model=MODEL).invoke("rev helloworld=")
    assert isinstance(text, str)
    message = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", model=MODEL).invoke("rev helloworld=")
    assert isinstance(message.content, str)


def test_lm_eval_local_completions_with_its_defaults(server, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    import lm_eval

    from tests.support.lmeval_task import write_task

    write_task(tmp_path, monkeypatch)
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"model={MODEL},base_url={server.url}/v1/completions",
        tasks=["refusion_synthetic"],
        task_manager=lm_eval.tasks.TaskManager(include_path=str(tmp_path)),
        limit=2,
    )
    assert results["results"]["refusion_synthetic"]["exact_match,none"] >= 0.0
    assert results["n-samples"]["refusion_synthetic"]["effective"] == 2


def test_registering_refusion_keeps_lm_eval_s_own_models():
    """lm-eval imports its models only while its registry is empty; refusion's registration must not hide them."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.registry import get_model

    import refusion.measure.lmeval  # noqa: F401  (registers "refusion")

    assert get_model("refusion") and get_model("local-completions")
