"""refusion: plan-and-infill decoding for diffusion language models, with swappable parts.

Quick use::

    import refusion
    result = refusion.generate("What is 12+34?")          # the shipped default model
    result.text, result.forwards, result.tokens_per_forward

Compose your own decoder from parts (names, classes or instances)::

    from refusion import Decoder
    decoder = Decoder.from_names(selector="topk", k=2, slot_size=16)

Serve many requests on one running engine (continuous batching)::

    generator = refusion.Generator(max_rows=16)
    request = generator.submit("rev hello=", gen_length=32)
    for event in request:                                   # slots as they commit
        print(event.prefix_tokens)
"""

from refusion import errors
from refusion.api import generate, load_model
from refusion.config import PRESETS, Preset, load_preset
from refusion.decoding.decoder import Decoder, DecodeSession
from refusion.engines import Engine, choose_engine
from refusion.generator import Generator, Progress, Request
from refusion.plugins.registry import registry
from refusion.search import sweep
from refusion.decoding.types import DecodeResult, Plan, Slot

from refusion.version import __version__  # noqa: F401

__all__ = [
    "PRESETS",
    "DecodeResult",
    "DecodeSession",
    "Decoder",
    "Engine",
    "Generator",
    "Progress",
    "Request",
    "choose_engine",
    "Plan",
    "Preset",
    "Slot",
    "errors",
    "generate",
    "load_model",
    "load_preset",
    "registry",
    "sweep",
]
