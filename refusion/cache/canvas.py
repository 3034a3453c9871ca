"""Model calls for bidirectional masked diffusion LMs (LLaDA- and Dream-style).

Such a model sees the whole *canvas*: prompt, committed tokens and masks at
every other position of the generation region, in position order, with
bidirectional attention. An extend's tokens are placed on the canvas at their
positions and the logits at those positions are read back; with a logit shift
of 1 (Dream) the logits predicting position ``p`` are the model's output at
``p - 1``. Positions after a committed EOS are filled with EOS.

Without an approximation every call is a full forward of the canvas (the
plain MDM baseline). A :class:`BlockCache` set by a reorderer enables
Fast-dLLM's approximations (Wu et al., arXiv 2505.22618): at the first call of
a block a full forward also stores the keys/values of the prefix (``prefix``
mode) or of the prefix and the suffix (``dual`` mode); later calls of the
block feed only the block (plus, in prefix mode, the suffix) and attend to the
stored keys/values.
"""

from __future__ import annotations

from typing import Mapping

import attrs
import torch

from refusion.cache.calls import Epoch, Extend, ExtendOutput, ModelCall
from refusion.cache.sequence import SequenceCache
from refusion.models.base import ModelAdapter


@attrs.define
class BlockCache:
    """Fast-dLLM cache state of one sequence: ``mode`` is ``"prefix"`` or ``"dual"``.

    The current block spans positions ``start:stop``; ``stale`` asks for a
    refresh (a full forward) at the next call.
    """

    mode: str
    start: int = 0
    stop: int = 0
    stale: bool = True
    prefix: list | None = None  # per layer (keys, values) of the cached positions
    kept: tuple[int, int, int, int] | None = None  # (0, prefix_end, suffix_start, canvas_len)


class CanvasExecutor:
    """Runs the model calls of sequences on a bidirectional model, one forward per extend."""

    def __init__(self, adapter: ModelAdapter, caches: Mapping[object, SequenceCache]):
        self.adapter = adapter
        self.caches = dict(caches)
        self.epoch = Epoch()
        self.forwards = 0

    @property
    def copies(self):
        from refusion.cache.stores import CopyStats

        return CopyStats()

    def run(self, calls: Mapping[object, ModelCall]) -> dict[object, tuple[ExtendOutput, ...]]:
        self.epoch.value += 1
        #: model forwards each sequence used in the last run (one per extend)
        self.last_counts = {key: len(call.extends) for key, call in calls.items()}
        return {key: tuple(self._extend(self.caches[key], e) for e in call.extends) for key, call in calls.items()}

    def _canvas(self, cache: SequenceCache, extend: Extend) -> torch.Tensor:
        n = cache.canvas_stop
        canvas = torch.full((n,), self.adapter.mask_token_id, dtype=torch.long)
        if cache.canvas_end is not None and cache.eos_fill is not None:
            canvas[cache.canvas_end :] = cache.eos_fill
        canvas[cache.positions] = cache.tokens
        canvas[extend.positions.cpu()] = extend.tokens.cpu()
        return canvas

    @torch.no_grad()
    def _extend(self, cache: SequenceCache, extend: Extend) -> ExtendOutput:
        shift = self.adapter.capabilities.logit_shift
        canvas = self._canvas(cache, extend)
        block = cache.block_cache
        wanted = extend.positions.cpu() - shift
        if int(wanted.min()) < 0:
            raise ValueError("with a logit shift of 1, position 0 cannot be predicted")
        if block is not None and not block.stale and block.kept is not None:
            _, prefix_end, suffix_start, total = block.kept
            inside = bool(((wanted >= prefix_end) & (wanted < suffix_start)).all()) and total == canvas.shape[0]
            if inside:
                return self._approximate(cache, extend, canvas, block, wanted)
        return self._full(cache, extend, canvas, block, wanted)

    def _forward(self, ids, positions, cache_obj):
        device = self.adapter.device
        mask = torch.ones(1, (cache_obj.get_seq_length() if cache_obj is not None else 0) + ids.shape[0],
                          dtype=torch.long, device=device)
        self.forwards += 1
        return self.adapter.forward(ids[None].to(device), positions[None].to(device), mask, cache_obj)[0]

    def _full(self, cache, extend, canvas, block, wanted) -> ExtendOutput:
        positions = torch.arange(canvas.shape[0])
        store = self.adapter.new_cache() if block is not None else None
        logits = self._forward(canvas, positions, store)
        if block is not None:
            shift = self.adapter.capabilities.logit_shift
            prefix_end = max(0, block.start - shift)
            suffix_start = block.stop if block.mode == "dual" else canvas.shape[0]
            layers = []
            for layer in store.layers:
                keys = torch.cat((layer.keys[:, :, :prefix_end], layer.keys[:, :, suffix_start:]), dim=2)
                values = torch.cat((layer.values[:, :, :prefix_end], layer.values[:, :, suffix_start:]), dim=2)
                layers.append((keys, values))
            block.prefix, block.kept, block.stale = layers, (0, prefix_end, suffix_start, canvas.shape[0]), False
        return ExtendOutput(extend, logits[wanted.to(logits.device)], [], 0, 0, self.epoch, self.epoch.value)

    def _approximate(self, cache, extend, canvas, block, wanted) -> ExtendOutput:
        from transformers import DynamicCache

        _, prefix_end, suffix_start, _ = block.kept
        store = DynamicCache(list(block.prefix))  # update() concatenates into new tensors: the snapshot stays intact
        positions = torch.arange(prefix_end, suffix_start)
        logits = self._forward(canvas[prefix_end:suffix_start], positions, store)
        return ExtendOutput(extend, logits[(wanted - prefix_end).to(logits.device)], [], 0, 0, self.epoch, self.epoch.value)
