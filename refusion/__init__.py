"""refusion: plan-and-infill decoding for diffusion language models, with swappable parts.

Quick use::

    import refusion
    result = refusion.generate("What is 12+34?")          # the shipped default model
    result.text, result.forwards, result.tokens_per_forward

Compose your own decoder from parts (names, classes or instances)::

    from refusion import Decoder
    decoder = Decoder.from_names(selector="topk", k=2, slot_size=16)
"""

from refusion import errors
from refusion.api import generate, load_model
from refusion.config import PRESETS, Preset
from refusion.decoder import Decoder, DecodeSession
from refusion.registry import registry
from refusion.state import DecodeResult, Plan, Slot

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "DecodeResult",
    "DecodeSession",
    "Decoder",
    "Plan",
    "Preset",
    "Slot",
    "errors",
    "generate",
    "load_model",
    "registry",
]
