"""The selector with memory of docs/plugin_hooks.md (examples/steady_selector.py) runs on the LLaDA, Dream and SDAR
checkpoints built by their authors' classes, its memory changes what it decides, and the page shows it verbatim."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import refusion

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "steady_selector.py"
PEERS = ROOT / "tests" / "fixtures" / "peers"
PROMPTS = ["ab", "hello"]


@pytest.fixture(scope="module")
def steady():
    spec = importlib.util.spec_from_file_location("steady_selector", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Steady


def test_the_page_shows_the_selector_verbatim_in_under_30_lines():
    text = EXAMPLE.read_text()
    body = text[text.index("@attrs.frozen") : text.index("@hookimpl")].strip()
    assert body in (ROOT / "docs" / "plugin_hooks.md").read_text()
    assert len(body.splitlines()) < 30


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_the_selector_with_memory_decodes_each_familys_checkpoint_alone_and_in_a_batch(steady, family):
    model = refusion.load_model(str(PEERS / family))
    batch = refusion.generate(PROMPTS, model, selector=steady(threshold=0.6), gen_length=16)
    alone = [refusion.generate(p, model, selector=steady(threshold=0.6), gen_length=16) for p in PROMPTS]
    assert [r.region_tokens for r in batch] == [r.region_tokens for r in alone]
    assert all(0 < len(r.tokens) <= 16 for r in batch)


def test_its_memory_changes_the_decisions(steady):
    """``weight=1`` keeps nothing of the earlier steps: on some family the answers or the steps differ."""
    changed = []
    for family in ("llada", "dream", "sdar"):
        model = refusion.load_model(str(PEERS / family))
        kept, forgot = (
            refusion.generate(PROMPTS, model, selector=steady(threshold=0.6, weight=w), gen_length=16) for w in (0.5, 1)
        )
        changed.append([(r.region_tokens, r.forwards) for r in kept] != [(r.region_tokens, r.forwards) for r in forgot])
    assert sum(changed) >= 2, changed
