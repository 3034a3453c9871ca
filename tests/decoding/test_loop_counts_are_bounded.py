"""Every loop count a request, a row or a checkpoint can set is bounded by a documented limit (refusion.limits):
past it the value is refused naming the field before any work, at it the decode still ends; a reviser's
``post_fill_passes`` is checked when the decoder is built, and what it answers must be integers."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refusion
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError, PluginError
from refusion.limits import (
    MAX_BLOCK_LENGTH,
    MAX_CALLS_PER_TOKEN,
    MAX_DENOISING_STEPS,
    MAX_POST_FILL_PASSES,
    MAX_STEPS,
)
from refusion.models.mdm import tiny_bidirectional
from refusion.strategies.base import Reviser, Revision

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "peers"

#: (decoder as names and parameters, without the count; the count's name; its limit; its lowest value)
COUNTS = [
    ({"selector": "llada-steps"}, "steps", MAX_STEPS, 1),
    ({"selector": "dream-steps"}, "steps", MAX_STEPS, 1),
    ({"selector": "dream-blocks"}, "steps", MAX_STEPS, 1),
    ({"selector": "llada2-steps"}, "steps", MAX_STEPS, 1),
    ({"selector": "sdar-steps"}, "denoising_steps", MAX_STEPS, 1),
    ({"reviser": "editing", "infiller": "draft", "partitioner": "semi-ar"}, "max_post_steps", MAX_POST_FILL_PASSES, 0),
    ({"infiller": "denoise"}, "max_denoising_steps", MAX_DENOISING_STEPS, 1),
    ({}, "calls_per_token", MAX_CALLS_PER_TOKEN, 1),
    # the rows a selector ranks and a partition's blocks: positions allocated per step
    ({"selector": "llada2-steps"}, "block_length", MAX_BLOCK_LENGTH, 1),
    ({"selector": "sdar-steps"}, "block_length", MAX_BLOCK_LENGTH, 1),
    ({"partitioner": "semi-ar"}, "block_length", MAX_BLOCK_LENGTH, 1),
]
IDS = [f"{next(iter(names.values()), 'decoder')}.{field}" for names, field, _, _ in COUNTS]


@pytest.mark.parametrize("names, field, limit, low", COUNTS, ids=IDS)
def test_a_loop_count_past_its_limit_is_refused_naming_it_and_the_limit(names, field, limit, low):
    Decoder.from_names(**names, **{field: limit})  # the limit itself is allowed
    for value in (limit + 1, 10**9, 10**400, low - 1, float("inf"), str(low + 1), True, None):
        with pytest.raises(ConfigError) as caught:
            Decoder.from_names(**names, **{field: value})
        assert caught.value.param in (field, f"{next(iter(names), 'decoder')}.{field}"), (value, caught.value)
        assert f"`{field}`" in str(caught.value) or f".{field}`" in str(caught.value), caught.value
    with pytest.raises(ConfigError, match=rf"\[{low}, {limit}\].*refusion\.limits"):
        Decoder.from_names(**names, **{field: limit + 1})


def test_a_slot_past_the_block_limit_is_refused_naming_slot_size():
    Decoder.from_names(partitioner="semi-ar", block_length=MAX_BLOCK_LENGTH, slot_size=MAX_BLOCK_LENGTH)
    with pytest.raises(ConfigError, match="refusion.limits.MAX_BLOCK_LENGTH") as caught:
        Decoder.from_names(partitioner="semi-ar", block_length=MAX_BLOCK_LENGTH, slot_size=10**9)
    assert caught.value.param in ("slot_size", "partitioner.slot_size")


@settings(max_examples=30, deadline=None)
@given(case=st.sampled_from(range(len(COUNTS))), value=st.integers(-(2**70), 2**70))
def test_a_loop_count_is_accepted_exactly_within_its_limit(case, value):
    names, field, limit, low = COUNTS[case]
    if low <= value <= limit:
        decoder = Decoder.from_names(**names, **{field: value})
        owner = next(o for o in (decoder, decoder.partitioner, decoder.selector, decoder.reviser) if hasattr(o, field))
        assert getattr(owner, field) == value
    else:
        with pytest.raises(ConfigError):
            Decoder.from_names(**names, **{field: value})


@pytest.mark.parametrize(
    "preset, fixture, options",
    [
        ("llada", "llada", {"steps": MAX_STEPS, "gen_length": 16}),
        ("dream", "dream", {"steps": MAX_STEPS, "max_new_tokens": 16}),
        ("sdar", "sdar", {"denoising_steps": MAX_STEPS, "gen_length": 16}),
    ],
)
def test_a_schedule_at_its_step_limit_still_decodes_with_a_forward_per_token_at_most(preset, fixture, options):
    """Steps due no token are skipped: the limit bounds the bookkeeping, never the forwards (at most one per
    token, plus the prompt's)."""
    model = refusion.load_model(str(FIXTURES / fixture))
    result = refusion.generate([5, 6, 7], model, preset=preset, **options)
    assert 1 <= result.forwards <= 16 + 1, result.forwards


# -- a reviser's post_fill_passes ---------------------------------------------------------------------------------
@attrs.frozen
class Passes(Reviser):
    """A plugin reviser whose edit-only passes are its own parameter."""

    name = "passes"
    post_fill_passes: object = 0  # type: ignore[assignment]  # a plugin may declare it as a field

    def revise(self, view):
        return None


class Computed(Reviser):
    """A plugin reviser that computes its passes (a property)."""

    name = "computed"

    def __init__(self, passes):
        self.passes = passes

    @property
    def post_fill_passes(self):
        if isinstance(self.passes, Exception):
            raise self.passes
        return self.passes

    def revise(self, view):
        return None


def editing_decoder(reviser):
    return Decoder.from_names(partitioner="semi-ar", selector="topk", infiller="draft", reviser=reviser)


@pytest.mark.parametrize("value", [10**9, MAX_POST_FILL_PASSES + 1, -1, "3", None, True, 3.0, [2]])
def test_a_revisers_own_post_fill_passes_out_of_range_or_not_an_integer_is_refused_naming_it(value):
    with pytest.raises(ConfigError) as caught:
        editing_decoder(Passes(post_fill_passes=value))
    assert caught.value.param == "post_fill_passes" and "refusion.limits.MAX_POST_FILL_PASSES" in str(caught.value)
    with pytest.raises(ConfigError) as caught:  # by name and parameter, as a request would give it
        Decoder.from_names(partitioner="semi-ar", infiller="draft", reviser=Passes, post_fill_passes=value)
    assert caught.value.param == "post_fill_passes"


def test_an_infinite_post_fill_passes_is_refused_naming_it():
    with pytest.raises(ConfigError, match="post_fill_passes") as caught:
        Decoder.from_names(partitioner="semi-ar", infiller="draft", reviser=Passes, post_fill_passes=float("inf"))
    assert caught.value.param.endswith("post_fill_passes")


@pytest.mark.parametrize("value", [10**9, "3", None, 2.0, RuntimeError("broken")])
def test_a_reviser_computing_a_bad_post_fill_passes_is_a_plugin_error_naming_it(value):
    with pytest.raises(PluginError, match="computed") as caught:
        editing_decoder(Computed(value))
    assert caught.value.plugin == "computed"


@given(st.integers(0, MAX_POST_FILL_PASSES))
def test_every_post_fill_passes_within_the_limit_builds(value):
    assert editing_decoder(Passes(post_fill_passes=value)).reviser.post_fill_passes == value


# -- what a reviser answers -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [5.7, "7", True, None, 2.0])
def test_revision_offsets_and_tokens_must_be_integers_never_rounded_or_read_as_0_1(bad):
    for fields in ({"remask": [bad]}, {"replace": {0: bad}}, {"replace": {bad: 1}}):
        with pytest.raises(TypeError, match="must be integers"):
            Revision(**fields)


def test_integer_like_revision_values_are_taken():
    import numpy as np
    import torch

    assert Revision(remask=[np.int64(2), torch.tensor(3)], replace={np.int32(1): torch.tensor(4)}) == Revision(
        remask=(2, 3), replace={1: 4}
    )


@pytest.mark.parametrize("bad", [5.7, "7", True])
def test_a_reviser_answering_non_integer_tokens_is_a_plugin_error_naming_it(bad):
    @attrs.frozen
    class Fractional(Reviser):
        name = "fractional"

        def revise(self, view):
            offsets = view.offsets[view.accepted_now].tolist()
            return Revision(replace={offsets[0]: bad}) if offsets else None

    decoder = Decoder.from_names(
        partitioner="semi-ar", selector="topk", infiller="draft", reorderer="no-cache", reviser=Fractional(), k=2
    )
    with pytest.raises(PluginError, match="fractional.*must be integers") as caught:
        decoder.decode(tiny_bidirectional(vocab_size=24), [1, 2], 8)
    assert caught.value.plugin == "fractional"
