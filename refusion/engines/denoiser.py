"""The ``denoiser`` engine: runs canvas-denoising models (DiffusionGemma) for the canvas-denoising loop.

It answers the two calls of :mod:`refusion.decoding.denoising`:
:class:`~refusion.decoding.protocol.Encode` (the causal encoder appends the
prompt, then each finished canvas, to the sequence's transformers cache) and
:class:`~refusion.decoding.protocol.Denoise` (one denoiser pass over the
current canvas, reading that cache). The attention masks are built as
transformers' own ``generate`` builds them, once per canvas. Each sequence
runs its own forwards (sequences hold caches of different lengths), so every
sequence gets exactly the tokens it gets alone, in every dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch

from refusion.decoding.protocol import Denoise, Encode, ModelCall
from refusion.engines.base import Engine, SequenceState
from refusion.models.base import exclusive
from refusion.plugins import hookimpl


class DenoiserState(SequenceState):
    """One sequence of a canvas-denoising model: its encoder cache, the attention mask over it and the
    current canvas's denoiser masks. Holds no :class:`~refusion.cache.sequence.SequenceCache` (``context``
    is ``None``)."""

    def __init__(self, prompt: torch.Tensor, counters: Any, region_length: int, cache: Any):
        super().__init__(cast(Any, None), counters, prompt.shape[0], region_length)
        self.prompt = prompt
        self.cache = cache
        #: entries the encoder has written (prompt, then finished canvases)
        self.encoded = 0
        #: the denoiser's masks for the current canvas (built on its first pass)
        self.masks: Any = None


class DenoiserEngine(Engine):
    """Encoder and denoiser calls of canvas-denoising models, one sequence per forward."""

    name = "denoiser"
    priority = 10
    mixes_sequences = False

    @classmethod
    def unsupported(cls, model: Any) -> str | None:
        if not getattr(model.capabilities, "denoiser", False):
            return "it is for canvas-denoising models (`capabilities.denoiser`, e.g. DiffusionGemma)"
        return None

    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        return DenoiserState(prompt, self.new_counters(), region_length, self.model.new_cache())

    def run(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple]:
        out: dict[SequenceState, tuple] = {}
        for state, call in calls.items():
            assert isinstance(state, DenoiserState)
            if isinstance(call, Encode):
                self._encode(state, call.tokens)
                out[state] = ()
            elif isinstance(call, Denoise):
                out[state] = (self._denoise(state, call),)
            else:
                raise TypeError(f"engine 'denoiser' runs Encode and Denoise calls; got {type(call).__name__}")
        return out

    def _attention(self, state: DenoiserState, extra: int) -> torch.Tensor:
        return torch.ones((1, state.encoded + extra), dtype=torch.bool, device=self.device)

    def _encode(self, state: DenoiserState, tokens: torch.Tensor) -> None:
        ids = tokens.to(self.device)[None]
        with exclusive(self.model):
            state.cache = self.model.encode(ids, self._attention(state, ids.shape[1]), state.cache)
        state.encoded += ids.shape[1]
        state.masks = None
        self.served({state: ids.shape[1]})

    def _denoise(self, state: DenoiserState, call: Denoise) -> torch.Tensor:
        canvas = call.canvas.to(self.device)[None]
        conditioning = None if call.self_conditioning is None else call.self_conditioning[None]
        with exclusive(self.model):
            if state.masks is None:
                state.masks = self.model.canvas_mask(canvas, self._attention(state, canvas.shape[1]), state.cache)
            logits = self.model.denoise(canvas, state.encoded, state.masks, state.cache, conditioning)
        self.served({state: canvas.shape[1]})
        return logits[0]

    def release(self, state: SequenceState) -> None:
        if isinstance(state, DenoiserState):
            state.cache = None
            state.masks = None
        super().release(state)


@hookimpl
def register_engines(register):
    register(DenoiserEngine)
