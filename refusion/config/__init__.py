"""Decoder configurations: named presets, parameter routing, ``key=value`` parsing."""

from refusion.config.presets import (PART_KINDS, PRESETS, Preset, build_parts, load_preset, preset,
                                     route_params)

__all__ = ["PART_KINDS", "PRESETS", "Preset", "build_parts", "load_preset", "preset", "route_params"]
