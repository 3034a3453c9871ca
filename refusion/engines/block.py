"""The ``block`` engine: block-diffusion models with an exact key/value cache of finished blocks.

A block-diffusion model (:mod:`refusion.models.block`) attends bidirectionally inside a block and causally across
blocks, so the keys/values of every position before the current block never change once that block is finished.
Each sequence keeps them in the columns ``0:cached`` of its block table (columns are positions): a call feeds the
positions not cached yet (the previous block's final tokens, or the prompt at the first call) and the whole current
block (committed tokens, masks, the extend's tokens), each token seeing every column of its own block and of the
blocks before it (the model's block mask, :meth:`HFBlockDiffusionLM.block_mask
<refusion.models.block.HFBlockDiffusionLM.block_mask>`), and then keeps the columns before the current block only.
So every finished block is written once, in the first call after it finished, and never recomputed (a model whose
logits are shifted, Fast-dLLM v2, also feeds the previous block's last position on every call: its output, which
sees its own block only, predicts the current block's first position); the sequences of a step share one forward
(:class:`~refusion.engines.paged.PagedEngine`). ``block-recompute`` feeds everything from position 0 on every call
(the reference the cached engine is tested against).

The decoder's serial blocks must be the generation part of the model's blocks (partitioner ``semi-ar`` with the
model's ``block_length``, and ``align="absolute"`` for models whose blocks count from position 0, such as SDAR,
whose first block also holds the prompt's last tokens); the engine refuses anything else with the reason, and
refuses Fast-dLLM's approximate caches (the cache is exact already). A call's window starts at the first position
not cached, which for SDAR's first block includes the prompt tokens of that block (recomputed with the block, as
SDAR does).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from refusion.cache.stores import NoStore
from refusion.decoding.context import SequenceCache
from refusion.decoding.protocol import BlockReuse, Extend, ExtendOutput, ModelCall
from refusion.engines.base import SequenceState
from refusion.engines.feed import Feed
from refusion.engines.paged import Finisher, PagedEngine, PagedSequence
from refusion.errors import ConfigError
from refusion.plugins import hookimpl


class BlockSequence(PagedSequence):
    """A sequence on a block-diffusion model: its finished positions' columns and its current block."""

    def __init__(self, context: SequenceCache, counters, prompt_length: int, region_length: int, model: Any):
        super().__init__(context, counters, prompt_length, region_length)
        self.model = model
        self.block_length = model.capabilities.block_length
        self.block: tuple[int, int] | None = None
        #: lanes for the extra extends of a call (each starts from a copy of the cached columns)
        self.lanes: list[Any] = []
        #: the sub-block cache (``BlockReuse(mode="sub-block")``): the sub-block's length (0: off), and whether the
        #: columns of the current model block are kept
        self.sub_block = 0
        self.sub_kept = False

    @property
    def cached(self) -> int:
        """Positions ``0:cached`` have their keys/values in the lane's columns."""
        return self.table.length

    def exact_before(self, start: int) -> int:
        """The columns the cache keeps exact through the block of serial block ``start``: those before the model
        block, less the one whose output predicts the block's first position when the logits are shifted (it sees
        its own block only, so is recomputed exactly with each call of the block)."""
        first = self.model.block_start(start, self.prompt_length)
        return max(first - self.model.capabilities.logit_shift, 0)

    def start_block(self, start: int, stop: int, reuse: BlockReuse | None) -> None:
        """Begin the decoder's serial block ``start:stop``; it must be the generation part of one model block."""
        if reuse is not None and reuse.mode != "sub-block":
            raise ConfigError(
                f"the 'block' engine keeps an exact cache of finished blocks; the reorderer's {reuse.mode!r} "
                "approximation does not apply (use reorderer 'commit-order', or 'sub-block-cache' for Fast-dLLM "
                "v2's cache inside the block)."
            )
        self.sub_block = reuse.sub_block if reuse is not None else 0
        if self.sub_kept and self.block is not None:  # the last block's kept columns are approximate: keep the
            self.table.length = self.exact_before(self.block[0])  # exact ones before it, as its own calls did
        self.sub_kept = False
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


class BlockEngine(PagedEngine):
    """Runs the model calls of block-diffusion models, every sequence's window in one forward, with the exact
    cache of finished blocks."""

    name = "block"
    priority = 30
    recompute = False

    @classmethod
    def unsupported(cls, model: Any) -> str | None:
        caps = model.capabilities
        if not caps.block_length:
            return "it is for block-diffusion models (`block_length` > 0, e.g. the 'hf-block' adapter)"
        if not caps.kv_cache or not hasattr(model, "block_mask"):
            return "it needs a model that takes a key/value cache and states its block mask (`block_mask`)"
        return cls.paged_unsupported(model)

    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        context = SequenceCache(NoStore(), prompt, torch.arange(prompt.shape[0]))
        state = BlockSequence(context, self.new_counters(), prompt.shape[0], region_length, self.model)
        return self._admitted(state, prompt)

    def tables_of(self, state: SequenceState) -> list[Any]:
        return [*super().tables_of(state), *cast(BlockSequence, state).lanes]

    def lay_out(self, state: SequenceState, call: ModelCall, feed: Feed) -> Finisher:
        state = cast(BlockSequence, state)
        if state.block is None:
            raise RuntimeError("the 'block' engine got a call before its block started")
        finishers = [self._extend(state, e, i, feed) for i, e in enumerate(call.extends)]
        return lambda scores: tuple(finish(scores) for finish in finishers)

    def _extend(self, state: BlockSequence, extend: Extend, index: int, feed: Feed) -> Any:
        start, stop = state.block  # type: ignore[misc]  # checked by lay_out
        wanted = extend.positions.cpu()
        if len(wanted) and (int(wanted.min()) < start or int(wanted.max()) >= stop):
            raise ConfigError(
                f"the 'block' engine answers positions of the current block {start}:{stop} only; got {wanted.tolist()}."
            )
        if self.recompute:
            state.table.length = 0
        shift = self.model.capabilities.logit_shift
        block_first = self.model.block_start(start, state.prompt_length)  # the model block's first position
        keep = state.exact_before(start)  # the columns kept after the call
        sub = state.sub_block if index == 0 and not self.recompute else 0
        if sub and state.sub_kept and len(wanted):
            inside = self._sub_block(state, extend, wanted, block_first, stop, sub)
            if inside is not None:
                return self._sub_call(state, extend, wanted, inside, stop, feed)
        first = state.table.length
        if state.sub_block and not self.recompute:  # the kept block's columns are approximate: a full call rewrites
            first = min(first, keep)  # them (a further extend's lane copies the exact ones before the block)
            if index == 0:
                state.table.length = first
        if first > keep:  # pragma: no cover - blocks only move forward
            raise RuntimeError("internal error: the block cache runs past the current block")
        table = state.table
        if index:  # a further extend of the call: a lane of its own, from a copy of the cached columns
            while len(state.lanes) < index:
                state.lanes.append(self.kvm.table())
            table = state.lanes[index - 1]
            if first:
                feed.write(feed.lane(state, table), 0, self.kv.entries(state.table, 0, first))
        # a call that reads only outputs of the block before (a token-shifted model's first position of the block)
        # feeds up to the block: those outputs do not see it
        end = block_first if len(wanted) and int(wanted.max()) - shift < block_first else stop
        window = self._window(state, extend, wanted, first, end)
        positions = np.arange(first, end)
        spans = np.zeros((end - first, 1, 2), dtype=np.int64)
        spans[:, 0, 1] = _block_ends(self.model, positions, end, state.prompt_length)
        at = feed.add(feed.lane(state, table), window.numpy(), positions, positions, spans)
        kept = bool(sub) and end == stop and int(window[block_first - first]) != self.model.mask_token_id
        epoch = self.epoch

        def finish(scores: Any) -> ExtendOutput:
            if index == 0:  # the current block changes: keep what precedes it (all of it, for the sub-block cache)
                table.length = stop if kept else 0 if self.recompute else keep
                state.sub_kept = kept
            return ExtendOutput(extend, scores[at + (wanted - shift - first)], [], 0, 0, epoch, epoch.value)

        return finish

    def _window(self, state: BlockSequence, extend: Extend, wanted: torch.Tensor, a: int, b: int) -> torch.Tensor:
        """The tokens at positions ``a:b``: committed ones, the extend's, masks elsewhere."""
        window = torch.full((b - a,), self.model.mask_token_id, dtype=torch.long)
        context = state.context
        inside = (context.positions >= a) & (context.positions < b)
        window[context.positions[inside] - a] = context.tokens[inside]
        here = (wanted >= a) & (wanted < b)
        window[wanted[here] - a] = extend.tokens.cpu()[here]
        return window

    def _sub_block(
        self, state: BlockSequence, extend: Extend, wanted: torch.Tensor, block_first: int, stop: int, sub: int
    ) -> tuple[int, int, torch.Tensor] | None:
        """The sub-block ``a:b`` (and its tokens) a call may feed alone: it holds every wanted position and every
        position whose output is read, and its first position holds a token; else ``None``."""
        shift = self.model.capabilities.logit_shift
        low = int(wanted.min())
        a = block_first + (low - block_first) // sub * sub
        b = min(a + sub, stop)
        if int(wanted.max()) >= b or low - shift < a:
            return None
        window = self._window(state, extend, wanted, a, b)
        if int(window[0]) == self.model.mask_token_id:
            return None
        return a, b, window

    def _sub_call(
        self, state: BlockSequence, extend: Extend, wanted: torch.Tensor, inside: tuple, stop: int, feed: Feed
    ) -> Any:
        """Feed the sub-block ``a:b`` alone, its keys/values written over the kept block's, each of its tokens
        attending to every kept column up to the block's end (Fast-dLLM v2's sub-block cache)."""
        a, b, window = inside
        positions = np.arange(a, b)
        spans = np.zeros((b - a, 1, 2), dtype=np.int64)
        spans[:, 0, 1] = stop
        at = feed.add(feed.lane(state, state.table), window.numpy(), positions, positions, spans)
        shift = self.model.capabilities.logit_shift
        epoch = self.epoch

        def finish(scores: Any) -> ExtendOutput:
            state.table.length = stop
            return ExtendOutput(extend, scores[at + (wanted - shift - a)], [], 0, 0, epoch, epoch.value)

        return finish


def _block_ends(model: Any, positions: np.ndarray, stop: int, prompt_length: int) -> np.ndarray:
    """One past the last column each query at ``positions`` sees: the end of its block (the model's block mask over
    the keys ``0:stop``; a block-causal mask is a prefix of the keys)."""
    mask = model.block_mask(torch.from_numpy(positions), torch.arange(0, stop), prompt_length)[0, 0]
    allowed = mask if mask.dtype == torch.bool else mask == 0
    return allowed.sum(-1).cpu().numpy().astype(np.int64)


class BlockRecomputeEngine(BlockEngine):
    """Like ``block``, but every call recomputes every position from 0 (no cache): the exactness reference."""

    name = "block-recompute"
    priority = 0
    recompute = True


@hookimpl
def register_engines(register):
    register(BlockEngine)
    register(BlockRecomputeEngine)
