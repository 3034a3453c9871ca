"""The ``denoiser`` engine: runs canvas-denoising models (DiffusionGemma) for the canvas-denoising loop.

It answers the two calls of :mod:`refusion.decoding.denoising`:
:class:`~refusion.decoding.protocol.Encode` (the causal encoder appends the prompt, then each finished canvas, to
the sequence's transformers cache) and :class:`~refusion.decoding.protocol.Denoise` (one denoiser pass over the
current canvas, reading that cache). The sequences of a step share forwards: every ``Encode`` of the step runs in
one encoder forward and every ``Denoise`` in one denoiser forward, as transformers' own ``generate`` runs a batch:
the sequences' caches left-padded to the longest (a batch cache built for the step, kept while no sequence's cache
changes, the sequences' own caches reading from it meanwhile),
a 2-D mask marking the padding, each row at its own positions; the masks are transformers' own. A
sequence alone runs exactly the single-sequence forwards of transformers' ``generate``; with
``batch_invariant=True`` every sequence runs alone.
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
    current canvas's denoiser masks. Holds no :class:`~refusion.decoding.context.SequenceCache` (``context``
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
    """Encoder and denoiser calls of canvas-denoising models; the sequences of a step share each forward."""

    name = "denoiser"
    priority = 10

    def __init__(self, model: Any, *, batch_invariant: bool = False):
        super().__init__(model, batch_invariant=batch_invariant)
        #: the batch cache of the last batched denoise: (key of the rows and their lengths, cache, masks)
        self._batch: tuple[Any, Any, Any] | None = None

    @classmethod
    def unsupported(cls, model: Any) -> str | None:
        if not getattr(model.capabilities, "denoiser", False):
            return "it is for canvas-denoising models (`capabilities.denoiser`, e.g. DiffusionGemma)"
        return None

    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        return DenoiserState(prompt, self.new_counters(), region_length, self.model.new_cache())

    def run(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple]:
        encodes: list[tuple[DenoiserState, torch.Tensor]] = []
        denoises: list[tuple[DenoiserState, Denoise]] = []
        for state, call in calls.items():
            state = cast(DenoiserState, state)
            if isinstance(call, Encode):
                encodes.append((state, call.tokens))
            elif isinstance(call, Denoise):
                denoises.append((state, call))
            else:
                raise TypeError(f"engine 'denoiser' runs Encode and Denoise calls; got {type(call).__name__}")
        out: dict[SequenceState, tuple] = {}
        if encodes:
            if len(encodes) == 1 or self.batch_invariant:
                for state, tokens in encodes:
                    self._encode(state, tokens)
            else:
                self._encode_batch(encodes)
            out.update((state, ()) for state, _ in encodes)
        if denoises:
            if len(denoises) == 1 or self.batch_invariant:
                out.update((state, (self._denoise(state, call),)) for state, call in denoises)
            else:
                out.update(zip((state for state, _ in denoises), ((x,) for x in self._denoise_batch(denoises))))
        return out

    # -- one sequence: transformers' own single-sequence forwards ---------------------------------
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

    # -- several sequences: one forward, caches left-padded --------------------------------------
    def _padding(self, states: list[DenoiserState], extra: int) -> torch.Tensor:
        """``(rows, longest + extra)`` bool: each row's cache entries (right-aligned at the longest) and ``extra``."""
        longest = max(state.encoded for state in states)
        lengths = torch.tensor([state.encoded for state in states], device=self.device)
        columns = torch.arange(longest + extra, device=self.device)
        return (columns[None, :] >= (longest - lengths)[:, None]) | (columns[None, :] >= longest)

    def _batch_cache(self, states: list[DenoiserState], share: bool = False) -> Any:
        """One transformers cache holding every row's entries, each left-padded to the longest (the layout
        transformers' batched ``generate`` keeps): full layers ``longest`` entries, sliding ones their window.
        ``share``: each row's own cache then reads its entries from the batch cache (views, the same values), so
        the rows' keys/values are held once while the batch cache is kept."""
        batch = self.model.new_cache()
        longest = max(state.encoded for state in states)
        if not longest:
            return batch
        for index, layer in enumerate(batch.layers):
            sources = [state.cache.layers[index] for state in states]
            known = next(s for s in sources if getattr(s, "is_initialized", False) and s.keys.numel())
            heads, dim = known.keys.shape[1], known.keys.shape[3]
            window = getattr(layer, "sliding_window", None)
            width = longest if window is None else min(longest, window - 1)
            keys = known.keys.new_zeros((len(states), heads, width, dim))
            values = known.values.new_zeros((len(states), heads, width, dim))
            for row, source in enumerate(sources):
                if getattr(source, "is_initialized", False) and source.keys.numel():
                    n = source.keys.shape[2]
                    keys[row, :, width - n :] = source.keys[0]
                    values[row, :, width - n :] = source.values[0]
                    if share:
                        source.keys = keys[row : row + 1, :, width - n :]
                        source.values = values[row : row + 1, :, width - n :]
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
            if window is not None:
                layer.cumulative_length = longest
        return batch

    def _encode_batch(self, encodes: list[tuple[DenoiserState, torch.Tensor]]) -> None:
        """Every row's tokens in one encoder forward (right-padded after its cache); each row's cache gets its own
        new entries."""
        states = [state for state, _ in encodes]
        width = max(len(tokens) for _, tokens in encodes)
        ids = torch.zeros((len(states), width), dtype=torch.long, device=self.device)
        positions = torch.zeros((len(states), width), dtype=torch.int32, device=self.device)
        padding = self._padding(states, width)
        longest = max(state.encoded for state in states)
        for row, (state, tokens) in enumerate(encodes):
            n = len(tokens)
            ids[row, :n] = tokens.to(self.device)
            positions[row] = state.encoded + torch.arange(width, dtype=torch.int32, device=self.device)
            padding[row, longest + n :] = False
        batch = self._batch_cache(states)
        written: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        update = batch.update

        def recording(keys, values, layer_idx, *args, **kwargs):
            written[layer_idx] = (keys, values)
            return update(keys, values, layer_idx, *args, **kwargs)

        batch.update = recording
        with exclusive(self.model):
            self.model.encode(ids, padding, batch, positions)
        for row, (state, tokens) in enumerate(encodes):
            n = len(tokens)
            for layer, (keys, values) in sorted(written.items()):
                state.cache.update(keys[row : row + 1, :, :n], values[row : row + 1, :, :n], layer)
            state.encoded += n
            state.masks = None
        self._batch = None
        self.served(
            {state: len(tokens) for state, tokens in encodes},
            width * len(states) - sum(len(tokens) for _, tokens in encodes),
        )

    def _denoise_batch(self, denoises: list[tuple[DenoiserState, Denoise]]) -> list[torch.Tensor]:
        """Every row's canvas in one denoiser forward over the batch cache."""
        states = [state for state, _ in denoises]
        key = tuple((id(state), state.encoded) for state in states)
        canvas = torch.stack([call.canvas.to(self.device) for _, call in denoises])
        with exclusive(self.model):
            if self._batch is None or self._batch[0] != key:
                self._batch = None  # the previous batch cache goes before the next is built
                cache = self._batch_cache(states, share=True)
                masks = self.model.canvas_mask(canvas, self._padding(states, canvas.shape[1]), cache)
                self._batch = (key, cache, masks)
            _, cache, masks = self._batch
            conditioned = torch.tensor([call.self_conditioning is not None for _, call in denoises])
            conditioning = None
            if bool(conditioned.any()):
                known = next(call.self_conditioning for _, call in denoises if call.self_conditioning is not None)
                conditioning = torch.stack(
                    [
                        call.self_conditioning if call.self_conditioning is not None else torch.zeros_like(known)
                        for _, call in denoises
                    ]
                )
            starts = torch.tensor([state.encoded for state in states])
            logits = self.model.denoise(
                canvas, starts, masks, cache, conditioning, None if bool(conditioned.all()) else conditioned
            )
        self.served({state: canvas.shape[1] for state in states})
        return list(logits)

    def release(self, state: SequenceState) -> None:
        if isinstance(state, DenoiserState):
            state.cache = None
            state.masks = None
        if self._batch is not None and any(id(state) == k for k, _ in self._batch[0]):
            self._batch = None
        super().release(state)


@hookimpl
def register_engines(register):
    register(DenoiserEngine)
