"""The ``block`` engine: block-diffusion models with an exact key/value cache of finished blocks.

A block-diffusion model (:mod:`refusion.models.block`) attends bidirectionally
inside a block and causally across blocks, so the keys/values of every
position before the current block never change once that block is finished.
Each sequence keeps them in a transformers cache: a call feeds the positions
not cached yet (the previous block's final tokens, or the prompt at the first
call) and the whole current block (committed tokens, masks, the extend's
tokens), under the model's block-causal 4-D mask, and then drops the current
block's keys/values again. So every finished block is appended once, in the
first call after it finished, and never recomputed. ``block-recompute`` feeds
everything from position 0 on every call, without a cache (the reference
the cached engine is tested against).

The decoder's serial blocks must be the generation part of the model's
blocks (partitioner ``semi-ar`` with the model's ``block_length``, and
``align="absolute"`` for models whose blocks count from position 0, such as
SDAR, whose first block also holds the prompt's last tokens); the engine
refuses anything else with the reason, and refuses Fast-dLLM's approximate
caches (the cache is exact already). A call's window starts at the first
position not cached, which for SDAR's first block includes the prompt tokens
of that block (recomputed with the block, as SDAR does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from refusion.cache.sequence import SequenceCache
from refusion.cache.stores import NoStore
from refusion.decoding.protocol import BlockReuse, Extend, ExtendOutput, ModelCall
from refusion.engines.base import Engine, SequenceState
from refusion.errors import ConfigError
from refusion.plugins import hookimpl


class BlockSequence(SequenceState):
    """A sequence on a block-diffusion model: its cache of finished positions and its current block."""

    def __init__(self, context: SequenceCache, counters, prompt_length: int, region_length: int, kv: Any, model: Any):
        super().__init__(context, counters, prompt_length, region_length)
        self.model = model
        self.kv = kv
        #: positions ``0:cached`` have their keys/values in ``kv``
        self.cached = 0
        self.block_length = model.capabilities.block_length
        self.block: tuple[int, int] | None = None

    def start_block(self, start: int, stop: int, reuse: BlockReuse | None) -> None:
        """Begin the decoder's serial block ``start:stop``; it must be the generation part of one model block."""
        if reuse is not None:
            raise ConfigError(
                f"the 'block' engine keeps an exact cache of finished blocks; the reorderer's {reuse.mode!r} "
                "approximation does not apply (use reorderer 'commit-order')."
            )
        first = self.model.block_start(start, self.prompt_length)
        if (start, stop) != (max(first, self.prompt_length), min(first + self.block_length, self.canvas_length)):
            a, b = start - self.prompt_length, stop - self.prompt_length
            align = (
                "align='absolute' (the model's blocks count from position 0)"
                if getattr(self.model, "layout", "prompt") == "absolute"
                else "align='region'"
            )
            raise ConfigError(
                f"the decoder's serial block {a}:{b} is not one of the model's blocks of `block_length` "
                f"{self.block_length}: use partitioner 'semi-ar' with block_length={self.block_length} and "
                f"{align}."
            )
        self.block = (start, stop)


class BlockEngine(Engine):
    """Runs the model calls of block-diffusion models, one sequence at a time, with the exact block cache."""

    name = "block"
    priority = 30
    mixes_sequences = False  # one sequence per forward
    recompute = False

    @classmethod
    def unsupported(cls, model: Any) -> str | None:
        caps = model.capabilities
        if not caps.block_length:
            return "it is for block-diffusion models (`block_length` > 0, e.g. the 'hf-block' adapter)"
        if not caps.kv_cache or not hasattr(model, "block_mask"):
            return "it needs a model that takes a key/value cache and states its block mask (`block_mask`)"
        if caps.logit_shift:
            return "it supports block-diffusion models without a logit shift only"
        return None

    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        context = SequenceCache(NoStore(), prompt, torch.arange(prompt.shape[0]))
        return BlockSequence(context, self.new_counters(), prompt.shape[0], region_length, None, self.model)

    def run(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        self.epoch.value += 1
        return {state: tuple(self._extend(state, e) for e in call.extends) for state, call in calls.items()}

    @torch.no_grad()
    def _extend(self, state: BlockSequence, extend: Extend) -> ExtendOutput:
        if state.block is None:
            raise RuntimeError("the 'block' engine got a call before its block started")
        start, stop = state.block
        wanted = extend.positions.cpu()
        if len(wanted) and (int(wanted.min()) < start or int(wanted.max()) >= stop):
            raise ConfigError(
                f"the 'block' engine answers positions of the current block {start}:{stop} only; got {wanted.tolist()}."
            )
        first = 0 if self.recompute else state.cached
        keep = self.model.block_start(start, state.prompt_length)  # the model block's first position
        if first > keep:  # pragma: no cover - blocks only move forward
            raise RuntimeError("internal error: the block cache runs past the current block")
        window = torch.full((stop - first,), self.model.mask_token_id, dtype=torch.long)
        context = state.context
        inside = (context.positions >= first) & (context.positions < stop)
        window[context.positions[inside] - first] = context.tokens[inside]
        window[wanted - first] = extend.tokens.cpu()
        positions = torch.arange(first, stop)
        if self.recompute or state.kv is None:
            state.kv = self.model.new_cache()
        mask = self.model.block_mask(positions, torch.arange(0, stop), state.prompt_length)
        device = self.device
        scores = self.run_network(window[None].to(device), positions[None].to(device), mask, state.kv)[0]
        n = stop - first
        self.served({state: n}, pairs=n * stop, keys=first)
        state.kv.crop(-(stop - keep))  # the current block changes: keep what precedes it only
        state.cached = keep
        return ExtendOutput(extend, scores[wanted - first], [], 0, 0, self.epoch, self.epoch.value)


class BlockRecomputeEngine(BlockEngine):
    """Like ``block``, but every call recomputes every position from 0 (no cache): the exactness reference."""

    name = "block-recompute"
    priority = 0
    recompute = True


@hookimpl
def register_engines(register):
    register(BlockEngine)
    register(BlockRecomputeEngine)
