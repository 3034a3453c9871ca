"""Decoder configurations: :class:`DecoderSpec` (the one value that describes a decoder), the named presets,
building parts from names, and ``key=value`` parsing."""

from refusion.config.build import PART_KINDS
from refusion.config.presets import PRESETS, Preset, load_preset, preset
from refusion.config.spec import DECODER_OPTIONS, SAMPLING_PARAMS, SPEC_PARAMS, DecoderSpec, PartSpec, SamplerSpec

__all__ = [
    "DECODER_OPTIONS",
    "PART_KINDS",
    "SAMPLING_PARAMS",
    "SPEC_PARAMS",
    "PRESETS",
    "DecoderSpec",
    "PartSpec",
    "Preset",
    "SamplerSpec",
    "load_preset",
    "preset",
]
