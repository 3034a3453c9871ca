"""A reviser revises accepted tokens of the open block before they are sealed into the cache; the decoder checks
what it answers, refuses it on causal models, stops one that never lets a block finish, and streams only sealed
tokens. ``none`` (the default) seals every commit at once."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch

import refusion
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError, PluginError
from refusion.generator import Generator
from refusion.models.mdm import tiny_bidirectional
from refusion.strategies.base import Reviser, Revision
from tests.support.helpers import tiny

WINO = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "wino"
GOLDEN = json.loads((WINO / "golden.json").read_text())
REMASKING = [c for c in GOLDEN["calls"] if any(c["remasked_per_step"]) and c["dtype"] == "float32"]


def wino_decode(call: dict, **overrides):
    args = dict(call["args"])
    gen_length = args.pop("gen_length")
    if call.get("seed") is not None:
        args["seed"] = call["seed"]
    model = refusion.load_model(str(WINO / GOLDEN["checkpoint"]))
    prompt = GOLDEN["prompts"][call["prompt"]]
    return refusion.generate(prompt, model, preset="wino", gen_length=gen_length, record=True, **{**args, **overrides})


def test_wino_masks_accepted_tokens_again_before_they_are_sealed_and_needs_to():
    assert REMASKING
    differs = 0
    for call in REMASKING:
        result = wino_decode(call)
        assert result.region_tokens == call["tokens"]
        revised = [r for r in result.iterations if r.revised]
        assert revised  # some accepted slots were masked again ...
        for record in revised:
            later = [r for r in result.iterations if r.iteration > record.iteration]
            again = {s for r in later for s, _ in r.committed}
            assert set(record.revised) <= again  # ... and decoded again before their block was sealed
        differs += wino_decode(call, reviser="none").region_tokens != call["tokens"]
    assert differs  # without the revisions the selector alone does not give WINO's tokens


@attrs.frozen
class Outside(Reviser):
    name = "outside"

    def revise(self, view):
        return Revision(remask=[view.block_stop + 5])


@attrs.frozen
class Forever(Reviser):
    name = "forever"

    def revise(self, view):
        return Revision(remask=view.offsets.tolist())


@attrs.frozen
class Swap(Reviser):
    """Replaces every token accepted in the iteration by token 7 (it stays accepted)."""

    name = "swap"

    def revise(self, view):
        return Revision(replace={int(o): 7 for o in view.offsets[view.accepted_now]})


def mdm(reviser, **params):
    return Decoder.from_names(
        partitioner="semi-ar",
        selector="topk",
        infiller="draft",
        reorderer="no-cache",
        reviser=reviser,
        k=2,
        block_length=4,
        **params,
    )


def test_a_revision_naming_offsets_outside_the_view_names_the_reviser():
    with pytest.raises(PluginError, match="outside|not accepted tokens of the view"):
        mdm(Outside()).decode(tiny_bidirectional(vocab_size=24), [1, 2], 8)


def test_a_reviser_that_never_lets_a_block_finish_is_stopped_naming_it():
    with pytest.raises(PluginError, match="forever.*kept block 0 open"):
        mdm(Forever(), calls_per_token=1).decode(tiny_bidirectional(vocab_size=24), [1, 2], 8)


def test_replaced_tokens_stay_accepted_and_are_what_is_sealed():
    session = mdm(Swap()).session(tiny_bidirectional(vocab_size=24), [1, 2], 8)
    result = session.run()
    assert result.region_tokens == [7] * 8
    assert session.cache.tokens[2:].tolist() == [7] * 8  # what the reorderer sealed into the context


def test_a_revising_reviser_is_refused_on_a_causal_model_before_any_work():
    with pytest.raises(ConfigError, match="reviser 'forever'.*causal") as caught:
        mdm(Forever()).decode(tiny(), [1, 2], 8)
    assert caught.value.param == "reviser"
    with pytest.raises(ConfigError, match="reviser 'wino' needs a model"):
        mdm("wino").decode(tiny_bidirectional(vocab_size=24, logit_shift=1), [1, 2], 8)


def test_none_seals_every_commit_at_once_as_before():
    model = tiny_bidirectional(vocab_size=24, seed=3)
    plain = Decoder.from_names(
        partitioner="semi-ar", selector="topk", infiller="draft", reorderer="no-cache", k=2, block_length=4
    )
    assert plain.reviser.name == "none"
    result = plain.decode(model, [1, 2], 8, record=True)
    assert all(not r.revised for r in result.iterations)
    assert [r.committed for r in result.iterations] == [
        r.committed for r in mdm("none").decode(model, [1, 2], 8, record=True).iterations
    ]


def test_a_stream_shows_only_sealed_tokens_of_a_revising_decoder():
    call = REMASKING[0]
    model = refusion.load_model(str(WINO / GOLDEN["checkpoint"]))
    args = dict(call["args"])
    gen_length = args.pop("gen_length")
    generator = Generator(model, gen_length=gen_length)
    request = generator.submit(torch.tensor(GOLDEN["prompts"][call["prompt"]]).tolist(), preset="wino", **args)
    streamed = [t for event in request for t in event.prefix_tokens]
    final = request.result.tokens.tolist()
    assert streamed == final  # nothing streamed was revised afterwards


def test_wino_is_refused_with_a_selector_or_slots_its_rule_does_not_bound():
    model = tiny_bidirectional(vocab_size=24, seed=3)
    with pytest.raises(ConfigError, match="reviser 'wino'.*selector 'threshold'") as caught:
        Decoder.from_names(partitioner="semi-ar", selector="threshold", infiller="draft", reviser="wino").decode(
            model, [1, 2], 8
        )
    assert caught.value.param == "reviser"
    with pytest.raises(ConfigError, match="one-token slots") as caught:
        Decoder.from_names(
            partitioner="semi-ar", selector="wino", infiller="draft", reviser="wino", slot_size=2
        ).decode(model, [1, 2], 8)
    assert caught.value.param == "slot_size"
