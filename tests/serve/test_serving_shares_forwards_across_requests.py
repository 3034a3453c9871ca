"""``refusion serve`` on a LLaDA 2.x or DiffusionGemma checkpoint runs concurrent clients in shared forwards: the
engine's forwards are far fewer than the sum of the requests' own (each request counts every forward that served
it), and every answer is the one decoding it alone gives."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

import refusion
from tests.support.serving import ServerProcess, metric, one_torch_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "peers"
PROMPTS = [f"{'abcdefgh'[: 1 + i % 8]} {i}" for i in range(16)]


async def _ask_all(url: str, model: str) -> list[dict]:
    async with httpx.AsyncClient(timeout=300) as client:

        async def ask(prompt: str) -> dict:
            response = await client.post(url + "/v1/completions", json={"model": model, "prompt": prompt})
            assert response.status_code == 200, response.text
            return response.json()

        return await asyncio.gather(*(ask(p) for p in PROMPTS))


@pytest.mark.parametrize("family", ["llada2", "diffusion_gemma"])
def test_sixteen_concurrent_clients_decode_in_shared_forwards(family):
    server = ServerProcess("--model", str(FIXTURES / family), "--max-rows", "16").start()
    try:
        answers = asyncio.run(_ask_all(server.url, family))
        engine_forwards = metric(httpx.get(server.url + "/metrics").text, "refusion_forwards_total")
    finally:
        server.stop()
    own = [answer["refusion"]["forwards"] for answer in answers]
    assert engine_forwards < sum(own) / 4, (engine_forwards, own)  # one forward served many requests
    model = refusion.load_model(str(FIXTURES / family))
    for prompt, answer in zip(PROMPTS, answers):
        assert answer["refusion"]["tokens"] == refusion.generate(prompt, model).tokens.tolist()
