"""A parameter name has one owner: the decoder, or the one part of a spec that declares it.

Was: DiffusionGemma's denoising options were fields of every decoder, so ``preset="sdar",
confidence_threshold=0.5`` set DiffusionGemma's stop option and SDAR's selector kept 0.85.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

import refusion
from refusion.config import DECODER_OPTIONS, PRESETS, DecoderSpec
from refusion.config.build import PART_KINDS, part_parameters
from refusion.config.spec import MOVED_TO_DENOISE, SHARED_PART_PARAMS
from refusion.errors import ConfigError, RegistrationError
from refusion.peers import peer_functions
from refusion.plugins.hookspecs import DECODER_NAMES
from refusion.plugins.manager import hookimpl, make_plugin_manager
from refusion.plugins.registry import Registry, registry, reset_registry
from refusion.strategies.base import SlotSelector

DIFFUSION_GEMMA = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "diffusion_gemma"
DENOISING = ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold", "renoise")


def owners(spec: DecoderSpec, name: str) -> list[str]:
    """Who takes the flat parameter ``name`` in ``spec``: the decoder, and each part that declares it."""
    found = ["decoder"] if name in DECODER_NAMES else []
    return found + [
        kind for kind in PART_KINDS if name in part_parameters(kind, getattr(spec, kind).name, getattr(spec, kind).cls)
    ]


def test_every_decoder_option_is_a_name_the_decoder_owns():
    assert set(DECODER_OPTIONS) <= set(DECODER_NAMES)
    assert not set(DENOISING) & set(DECODER_OPTIONS)  # they are the `denoise` infiller's


def test_no_registered_part_declares_a_name_the_decoder_owns():
    for kind in PART_KINDS:
        for entry in registry().entries(kind):
            assert not set(entry.parameters()) & set(DECODER_NAMES), (kind, entry.name)


def test_a_part_declaring_a_decoder_option_is_refused_when_registered():
    @attrs.frozen
    class Seeded(SlotSelector):
        name = "seeded"
        seed: int = 0

        def select(self, plan):
            return [0]

    class Plugin:
        @hookimpl
        def register_selectors(self, register):
            register(Seeded)

    try:
        with pytest.raises(RegistrationError, match="`seed`"):
            Registry(make_plugin_manager(entry_points=False, extra=(Plugin(),)))
    finally:
        reset_registry()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_sends_each_parameter_to_one_owner(name):
    """Every name a part of the preset declares, every decoder option, and every argument of the preset's peer
    function that refusion takes under its own name."""
    spec = PRESETS[name]
    names = {p for kind in PART_KINDS for p in part_parameters(kind, getattr(spec, kind).name)} | set(DECODER_OPTIONS)
    if spec.peer is not None:
        names |= set(peer_functions()[spec.peer].arguments) & (names | set(DECODER_NAMES))
    for param in sorted(names):
        found = owners(spec, param)
        assert len(found) == 1 or param in SHARED_PART_PARAMS, (name, param, found)


def test_a_name_two_parts_of_a_spec_read_differently_must_name_its_part():
    spec = PRESETS["sdar"].with_parts(infiller="denoise")  # both declare `confidence_threshold`
    with pytest.raises(ConfigError, match="selector.confidence_threshold") as info:
        spec.with_params({"confidence_threshold": 0.5})
    assert "infiller.confidence_threshold" in str(info.value)
    named = spec.with_params({"selector.confidence_threshold": 0.5})
    assert named.selector.params["confidence_threshold"] == 0.5
    assert "confidence_threshold" not in named.infiller.params


def test_the_denoising_options_are_the_denoise_infillers():
    from refusion.api import decoder_spec

    spec = decoder_spec(None, preset="diffusion-gemma", max_denoising_steps=5, renoise=False)
    assert spec.infiller.name == "denoise"
    assert dict(spec.infiller.params) == {"max_denoising_steps": 5, "renoise": False}
    with pytest.raises(ConfigError, match="t_max"):
        refusion.Decoder.from_spec(spec.with_params({"t_min": 0.9, "t_max": 0.5}))


def test_a_canvas_denoising_model_refuses_another_infiller_naming_denoise():
    model = refusion.load_model(str(DIFFUSION_GEMMA))
    with pytest.raises(ConfigError, match="'denoise'"):
        refusion.generate([4, 45], model, infiller="draft", gen_length=16)


def test_a_spec_written_before_the_move_reads_back():
    """Earlier files held the denoising options at the top level: onto the `denoise` infiller (an earlier
    diffusion-gemma spec's `draft` infiller becomes it), dropped at their defaults elsewhere, refused when changed
    on another infiller."""
    written = PRESETS["diffusion-gemma"].with_parts(infiller="draft").to_dict()
    back = DecoderSpec.from_dict({**written, **MOVED_TO_DENOISE, "max_denoising_steps": 12})
    assert back.infiller.name == "denoise" and back.infiller.params["max_denoising_steps"] == 12
    paper = PRESETS["paper"].to_dict()
    assert DecoderSpec.from_dict({**paper, **MOVED_TO_DENOISE}) == DecoderSpec.from_dict(paper)
    with pytest.raises(ConfigError, match="t_min"):
        DecoderSpec.from_dict({**paper, "t_min": 0.1})
    assert json.loads(json.dumps(back.to_dict()))["infiller"]["name"] == "denoise"
