"""refusion: plan-and-infill decoding for diffusion language models, with swappable parts.

Quick use::

    import refusion
    result = refusion.generate("What is 12+34?")          # the shipped default model
    result.text, result.forwards, result.tokens_per_forward

Register a part of your own in this process, then name it like a built-in::

    @refusion.register
    class Mine(SlotSelector):                               # from refusion.parts
        name = "mine"
        def select(self, plan): ...
    refusion.generate("rev hello=", selector="mine")

Compose your own decoder from parts (names, classes or instances)::

    from refusion import Decoder
    decoder = Decoder.from_names(selector="topk", k=2, slot_size=16)

Serve many requests on one running engine (continuous batching)::

    batcher = refusion.Batcher(max_rows=16)
    request = batcher.submit("rev hello=", gen_length=32)
    for event in request:                                   # slots as they commit
        print(event.prefix_tokens)

Generate for every row of a JSON Lines file, resumably (``refusion batch`` from the shell)::

    refusion.run_batch("prompts.jsonl", "results.jsonl", max_rows=16)

The names below are imported when first used, so ``import refusion`` is
quick and loads no model code, strategy search or training.
"""

from __future__ import annotations

import importlib
from typing import Any

from refusion import errors
from refusion.version import __version__

#: public name -> the module that defines it (imported on first use)
_EXPORTS = {
    "generate": "refusion.api",
    "load_model": "refusion.models.loading",
    "PRESETS": "refusion.config.presets",
    "Preset": "refusion.config.presets",
    "DecoderSpec": "refusion.config.spec",
    "load_preset": "refusion.config.presets",
    "Decoder": "refusion.decoding.decoder",
    "DecodeSession": "refusion.decoding.session",
    "DecodeResult": "refusion.decoding.types",
    "Plan": "refusion.decoding.types",
    "Slot": "refusion.decoding.types",
    "Engine": "refusion.engines.base",
    "choose_engine": "refusion.engines.factory",
    "Batcher": "refusion.batcher",
    "Generator": "refusion.generator",
    "Progress": "refusion.batcher",
    "Request": "refusion.batcher",
    "RuntimeConfig": "refusion.config.runtime",
    "register": "refusion.plugins.registry",
    "registry": "refusion.plugins.registry",
    "run_batch": "refusion.batch.embedded",
    "run_sweep": "refusion.sweep.run",
}


#: public subpackages named after their commands (``refusion.batch``, ``refusion.sweep``), imported on first use
_PACKAGES = ("batch", "sweep")


def __getattr__(name: str) -> Any:
    if name in _PACKAGES:
        return importlib.import_module(f"refusion.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'refusion' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, *_PACKAGES})


__all__ = ["__version__", "errors", *sorted([*_EXPORTS, *_PACKAGES])]
