"""The cache policy of docs/plugin_hooks.md (examples/long_block_cache.py) runs on the LLaDA, Dream and SDAR
checkpoints built by their authors' classes, recomputes less where it caches, and the page shows it verbatim."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import refusion

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "long_block_cache.py"
PEERS = ROOT / "tests" / "fixtures" / "peers"
PROMPTS = ["ab", "hello"]
CALLS = {
    "llada": dict(preset="llada", gen_length=16, block_length=8, steps=16),
    "dream": dict(preset="dream", gen_length=16, steps=16),
    "sdar": dict(preset="sdar", gen_length=16),
}


@pytest.fixture(scope="module")
def policy():
    spec = importlib.util.spec_from_file_location("long_block_cache", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LongBlockCache


def test_the_page_shows_the_policy_verbatim_in_under_30_lines():
    text = EXAMPLE.read_text()
    body = text[text.index("@attrs.frozen") : text.index("@hookimpl")].strip()
    assert body in (ROOT / "docs" / "plugin_hooks.md").read_text()
    assert len(body.splitlines()) < 30


@pytest.mark.parametrize("family", CALLS)
def test_the_cache_policy_decodes_each_familys_checkpoint_alone_and_in_a_batch(policy, family):
    model = refusion.load_model(str(PEERS / family))
    batch = refusion.generate(PROMPTS, model, reorderer=policy(), **CALLS[family])
    alone = [refusion.generate(p, model, reorderer=policy(), **CALLS[family]) for p in PROMPTS]
    assert [r.region_tokens for r in batch] == [r.region_tokens for r in alone]
    exact = refusion.generate(PROMPTS, model, reorderer=policy(min_block=10**6), **CALLS[family])
    if family == "sdar":  # 4-token blocks stay below min_block: exact either way
        assert [r.region_tokens for r in batch] == [r.region_tokens for r in exact]
    else:  # long blocks reuse the prefix: fewer tokens fed than recomputing every canvas
        assert sum(r.fed_tokens for r in batch) < sum(r.fed_tokens for r in exact)
