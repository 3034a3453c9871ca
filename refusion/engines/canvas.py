"""The ``canvas`` engine: model calls for bidirectional masked diffusion LMs (LLaDA- and Dream-style).

Such a model sees the whole *canvas*: prompt, committed tokens and masks at every other position of the generation
region, in position order, with bidirectional attention. An extend's tokens are placed on the canvas at their
positions and the logits at those positions are read back; with a logit shift of 1 (Dream) the logits predicting
position ``p`` are the model's output at ``p - 1``. Positions after a committed EOS are filled with EOS. Every
sequence's canvas is one lane of the step's forward (:class:`~refusion.engines.paged.PagedEngine`): canvases of
different lengths share one forward, each attending to its own columns only.

Without an approximation every call feeds the whole canvas (the plain MDM baseline). When a cache reorderer asks for
:class:`~refusion.decoding.protocol.BlockReuse` at the start of a block, the engine applies Fast-dLLM's
approximations (Wu et al., arXiv 2505.22618): the first call of the block feeds the whole canvas and keeps its
keys/values in the sequence's pages; later calls of the block feed only the block (``dual``: the block alone;
``prefix``: the block and the masked suffix), written over their columns, and attend to every column in position
order (the kept prefix, and in ``dual`` mode the kept suffix, as Fast-dLLM's caches do).

With classifier-free guidance (:meth:`CanvasEngine.guide`, LLaDA's ``cfg_scale``) every call also feeds the canvas
with the prompt masked, in a second lane of the same forward, and the logits are ``un + (cfg_scale + 1) * (cond -
un)`` in the model's dtype. A verifying extend (WINO) adds one leave-one-out row per fed position after the canvas.
"""

from __future__ import annotations

from typing import Any, cast

import attrs
import numpy as np
import torch

from refusion.cache.pages import PAGE_SIZE
from refusion.cache.stores import NoStore
from refusion.decoding.context import SequenceCache
from refusion.decoding.protocol import BlockReuse, Extend, ExtendOutput, ModelCall
from refusion.decoding.scores import Scores
from refusion.engines.base import SequenceState
from refusion.engines.feed import Feed, full_spans
from refusion.engines.paged import Finisher, PagedEngine, PagedSequence
from refusion.plugins import hookimpl


@attrs.define
class BlockCache:
    """Fast-dLLM cache state of one sequence's current block ``start:stop`` (absolute positions).

    ``stale`` asks for a full forward at the next call; after it the sequence's lane holds the whole canvas, and
    later calls feed only the columns ``prefix_end:suffix_start``.
    """

    mode: str
    start: int
    stop: int
    prefix_at_block: bool = False
    stale: bool = True
    prefix_end: int = 0
    suffix_start: int = 0
    #: ``decoded`` mode: the full forward's period, the block's calls so far, and the columns that held a token
    #: (not a mask) at the previous call: their keys/values are kept
    reload_every: int = 1
    calls: int = 0
    kept: np.ndarray | None = None
    #: ``periodic`` mode: the chunks' bounds (chunk 0 is everything before the block), the calls a complete chunk
    #: waits, the end of the kept prefix, whether anything was kept, and the call at which each chunk was complete
    bounds: np.ndarray | None = None
    delay: int = 0
    kept_end: int = 0
    has_kept: bool = False
    complete_at: dict[int, int] = attrs.field(factory=dict)
    #: ``periodic`` mode: the chunks attend block-causally
    chunk_causal: bool = False

    @classmethod
    def of(cls, reuse: BlockReuse, start: int, stop: int) -> BlockCache:
        """The state for ``reuse`` over the block ``start:stop``, before its first call."""
        block = cls(reuse.mode, start, stop, reuse.prefix_at_block, reload_every=reuse.reload_every)
        if reuse.mode == "periodic":
            block.bounds = np.concatenate(([0] if start else [], np.arange(start, stop, reuse.chunk), [stop]))
            block.delay, block.chunk_causal = reuse.delay, reuse.chunk_causal
            if start:  # everything before the block is complete before its first call (d3LLM's prompt block)
                block.complete_at[0] = 0
        return block


def periodic_columns(masked: np.ndarray, block: BlockCache, shift: int = 0) -> np.ndarray:
    """d3LLM's delayed, periodically refreshed prefix cache: the columns a call on a canvas whose masks are
    ``masked`` feeds (see :class:`~refusion.decoding.protocol.BlockReuse`, ``mode="periodic"``); advances the
    block's call count, clock and kept prefix. With a logit ``shift`` the kept prefix's last column, whose output
    predicts the first one after it, is fed too (its keys/values are exact only under ``chunk_causal``)."""
    bounds, n, call = cast(np.ndarray, block.bounds), masked.shape[0], block.calls + 1
    if masked[: block.kept_end].any():  # a reviser masked a kept position again: its chunk is fed from now on
        block.kept_end = int(bounds[np.searchsorted(bounds, np.flatnonzero(masked)[0], side="right") - 1])
        block.complete_at = {i: at for i, at in block.complete_at.items() if bounds[i] < block.kept_end}
    end, waiting = block.kept_end, False
    for i in range(len(bounds) - 1):
        a, b = int(bounds[i]), int(bounds[i + 1])
        if b <= block.kept_end:
            continue
        if masked[a:b].any():
            block.complete_at.pop(i, None)
            break
        if call - block.complete_at.setdefault(i, call) < block.delay:
            waiting = True
            break
        end = b
    grows = end > block.kept_end
    fed_from = block.kept_end if grows or (block.has_kept and not waiting and call % block.reload_every) else 0
    block.kept_end, block.has_kept, block.calls = end, block.has_kept or grows, call
    return np.arange(max(fed_from - shift, 0), n)


class CanvasSequence(PagedSequence):
    """A sequence on the canvas: where its answer ends, its block cache, its guidance and its lanes."""

    def __init__(
        self,
        context: SequenceCache,
        counters,
        prompt_length: int,
        region_length: int,
        eos_fill: int | None,
        shift: int = 0,
    ):
        super().__init__(context, counters, prompt_length, region_length)
        self.eos_fill = eos_fill
        #: the model's logit shift
        self.shift = shift
        #: first position after a committed EOS (filled with ``eos_fill``), if any
        self.end: int | None = None
        self.block: BlockCache | None = None
        #: classifier-free guidance scale (0: none)
        self.cfg_scale = 0.0
        #: lanes besides ``table``: the unconditional canvas (guided), and one per extra extend of a call
        self.lanes: list[Any] = []

    def start_block(self, start: int, stop: int, reuse: BlockReuse | None) -> None:
        if reuse is not None and reuse.mode == "sub-block":
            from refusion.errors import ConfigError

            raise ConfigError(
                "the sub-block cache (reorderer 'sub-block-cache') keeps the keys/values of a block-diffusion "
                "model's block (the 'block' engine: SDAR, LLaDA 2.x, Fast-dLLM v2); a bidirectional canvas has no "
                "such block. Use reorderer 'prefix-cache', 'dual-cache' or 'no-cache'.",
                param="reorderer",
            )
        if reuse is not None and self.cfg_scale > 0:
            from refusion.errors import ConfigError

            raise ConfigError(
                f"`cfg_scale` > 0 needs a full forward at every step; the reorderer's {reuse.mode!r} "
                "block cache cannot be combined with it (use reorderer 'commit-order' or 'no-cache').",
                param="cfg_scale",
            )
        if reuse is not None and reuse.mode in ("decoded", "periodic") and self.shift and not reuse.chunk_causal:
            from refusion.errors import ConfigError

            raise ConfigError(
                f"the {reuse.mode!r} cache (reorderers 'dkv', 'periodic') keeps a position's keys/values once its "
                "own token is decoded; with a logit shift of 1 (Dream) a position predicts the next one, which this "
                "rule does not cover. Use reorderer 'prefix-cache', 'dual-cache' or 'no-cache'.",
                param="reorderer",
            )
        if reuse is None:
            self.block = None
            return
        self.block = BlockCache.of(reuse, start, stop)

    def end_at(self, position: int) -> None:
        self.end = position + 1 if self.end is None else min(self.end, position + 1)

    def lane(self, index: int) -> Any:
        """The block table of extra lane ``index`` (made on first use)."""
        while len(self.lanes) <= index:
            self.lanes.append(self.kvm.table())
        return self.lanes[index]


class CanvasEngine(PagedEngine):
    """Runs the model calls of bidirectional models, every sequence's canvas in one forward."""

    name = "canvas"
    priority = 10

    def __init__(
        self,
        model: Any,
        *,
        packed: bool | None = None,
        batch_invariant: bool = False,
        prefix_cache: bool = False,
        kv_memory: int | None = None,
        page_size: int = PAGE_SIZE,
        paged_kernel: bool | None = None,
    ):
        if packed is None and not model.capabilities.kv_cache:  # a network that takes no cache sees only what it
            packed = False  # is fed: padded lanes
        super().__init__(
            model,
            packed=packed,
            batch_invariant=batch_invariant,
            prefix_cache=prefix_cache,
            kv_memory=kv_memory,
            page_size=page_size,
            paged_kernel=paged_kernel,
        )

    @classmethod
    def unsupported(cls, model: Any) -> str | None:
        if model.capabilities.causal:
            return "it is for bidirectional models (causal ones use 'branch' or 'repeat')"
        if model.capabilities.block_length:
            return "it attends across the whole canvas; block-diffusion models use the 'block' engine"
        return cls.paged_unsupported(model)

    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        counters = self.new_counters()
        context = SequenceCache(NoStore(), prompt, torch.arange(prompt.shape[0]))
        eos = self.model.eos_token_ids
        shift = self.model.capabilities.logit_shift
        state = CanvasSequence(context, counters, prompt.shape[0], region_length, min(eos) if eos else None, shift)
        return self._admitted(state, prompt)

    def guide(self, state: SequenceState, cfg_scale: float) -> None:
        state = cast(CanvasSequence, state)
        state.cfg_scale = float(cfg_scale)
        self.kvm.reserve(state, self.kvm.pages_for(state.canvas_length) + 1)  # the unconditional canvas's lane

    def tables_of(self, state: SequenceState) -> list[Any]:
        return [*super().tables_of(state), *cast(CanvasSequence, state).lanes]

    def _canvas(self, state: CanvasSequence, extend: Extend) -> torch.Tensor:
        canvas = torch.full((state.canvas_length,), self.model.mask_token_id, dtype=torch.long)
        if state.end is not None and state.eos_fill is not None:
            canvas[state.end :] = state.eos_fill
        context = state.context
        canvas[context.positions] = context.tokens
        canvas[extend.positions.cpu()] = extend.tokens.cpu()
        return canvas

    def lay_out(self, state: SequenceState, call: ModelCall, feed: Feed) -> Finisher:
        state = cast(CanvasSequence, state)
        finishers = [self._extend(state, e, i, feed) for i, e in enumerate(call.extends)]
        return lambda scores: tuple(finish(scores) for finish in finishers)

    def _extend(self, state: CanvasSequence, extend: Extend, index: int, feed: Feed) -> Any:
        """Lay out one extend: the first in the sequence's own lane, any further one in a lane of its own."""
        shift = self.model.capabilities.logit_shift
        canvas = self._canvas(state, extend)
        wanted = extend.positions.cpu() - shift
        if int(wanted.min()) < 0:
            raise ValueError("with a logit shift of 1, position 0 cannot be predicted")
        table = state.table if index == 0 else state.lane(index + 1)
        block = state.block
        if extend.verify:
            return self._verified(state, extend, canvas, table, feed)
        if block is not None and block.mode == "decoded" and not index and state.cfg_scale == 0:
            return self._decoded(state, extend, canvas, table, block, wanted, feed)
        if block is not None and block.mode == "periodic" and state.cfg_scale == 0:
            # a further extend of the call feeds the whole canvas in its own lane, under the block's attention
            if index:
                columns = np.arange(canvas.shape[0])
            else:
                columns = periodic_columns(canvas.numpy() == self.model.mask_token_id, block, shift)
            return self._fed(state, extend, canvas, table, columns, wanted, feed, block if block.chunk_causal else None)
        if block is not None and not block.stale:
            inside = bool(((wanted >= block.prefix_end) & (wanted < block.suffix_start)).all())
            if inside:
                if index:  # an extra lane starts from a copy of the kept canvas
                    feed.write(feed.lane(state, table), 0, self.kv.entries(state.table, 0, state.canvas_length))
                return self._approximate(state, extend, canvas, table, block, wanted, feed)
        if state.cfg_scale > 0:
            return self._guided(state, extend, canvas, table, wanted, feed)
        return self._full(state, extend, canvas, table, None if index else block, wanted, feed)

    def _full(self, state, extend, canvas, table, block, wanted, feed: Feed) -> Any:
        n = canvas.shape[0]
        columns = np.arange(n)
        at = feed.add(feed.lane(state, table), canvas.numpy(), columns, columns, full_spans(n, 0, n))
        epoch = self.epoch

        def finish(scores: Any) -> ExtendOutput:
            if block is not None:  # the whole canvas stays: later calls of the block feed only the block
                shift = self.model.capabilities.logit_shift
                block.prefix_end = block.start if block.prefix_at_block else max(0, block.start - shift)
                block.suffix_start = block.stop if block.mode == "dual" else n
                block.stale = False
                table.length = n
            else:
                table.length = 0
            return ExtendOutput(extend, scores[at + wanted], [], 0, 0, epoch, epoch.value)

        return finish

    def _approximate(self, state, extend, canvas, table, block, wanted, feed: Feed) -> Any:
        a, b, n = block.prefix_end, block.suffix_start, canvas.shape[0]
        columns = np.arange(a, b)
        at = feed.add(feed.lane(state, table), canvas[a:b].numpy(), columns, columns, full_spans(b - a, 0, n))
        epoch = self.epoch

        def finish(scores: Any) -> ExtendOutput:
            table.length = n
            return ExtendOutput(extend, scores[at + wanted - a], [], 0, 0, epoch, epoch.value)

        return finish

    def _decoded(self, state, extend, canvas, table, block: BlockCache, wanted, feed: Feed) -> Any:
        """dKV-Cache's delayed cache: a refresh feeds the whole canvas; other calls feed the columns that were masks
        at the previous call, over the kept keys/values of the rest (see :class:`BlockReuse`)."""
        ids, step, kept = canvas.numpy(), block.calls, block.kept
        n = len(ids)
        columns = np.arange(n)  # a refresh
        if kept is not None and step > 1 and step % block.reload_every:
            columns = np.flatnonzero(~kept)  # a position masked again (a reviser) is not among them: a refresh
        block.kept, block.calls = ids != self.model.mask_token_id, step + 1
        return self._fed(state, extend, canvas, table, columns, wanted, feed)

    def _fed(self, state, extend, canvas, table, columns: np.ndarray, wanted, feed: Feed, chunks=None) -> Any:
        """Feed ``columns`` of the canvas over the kept keys/values of the others (the whole canvas where a wanted
        position is not fed); with ``chunks`` (a block cache whose chunks attend block-causally) each fed position
        sees up to the end of its chunk."""
        ids, wanted_np, n = canvas.numpy(), wanted.numpy(), canvas.shape[0]
        if not np.isin(wanted_np, columns).all():
            columns = np.arange(n)
        spans = full_spans(len(columns), 0, n)
        if chunks is not None:
            bounds = cast(np.ndarray, chunks.bounds)
            ends = bounds[np.minimum(np.searchsorted(bounds, columns, side="right"), len(bounds) - 1)]
            spans[:, 0, 1] = np.where(columns < bounds[-1], ends, n)
        at = feed.add(feed.lane(state, table), ids[columns], columns, columns, spans)
        rows = torch.from_numpy(np.searchsorted(columns, wanted_np))
        epoch = self.epoch

        def finish(scores: Any) -> ExtendOutput:
            table.length = n
            return ExtendOutput(extend, scores[at + rows], [], 0, 0, epoch, epoch.value)

        return finish

    def _guided(self, state, extend, canvas, table, wanted, feed: Feed) -> Any:
        n = canvas.shape[0]
        unconditional = canvas.clone()
        prompt = unconditional[: state.prompt_length]
        prompt[prompt != self.model.mask_token_id] = self.model.mask_token_id
        columns = np.arange(n)
        spans = full_spans(n, 0, n)
        cond = feed.add(feed.lane(state, table), canvas.numpy(), columns, columns, spans)
        uncond = feed.add(feed.lane(state, state.lane(0)), unconditional.numpy(), columns, columns, spans)
        epoch = self.epoch

        def finish(scores: Any) -> ExtendOutput:
            table.length = state.lanes[0].length = 0
            c, u = scores[cond : cond + n].logits, scores[uncond : uncond + n].logits
            logits = u + (state.cfg_scale + 1) * (c - u)
            return ExtendOutput(extend, Scores(logits=logits[wanted.to(logits.device)]), [], 0, 0, epoch, epoch.value)

        return finish

    def _verified(self, state, extend, canvas, table, feed: Feed) -> Any:
        """The canvas plus one leave-one-out row per fed position (WINO's verification block), in one forward.

        The canvas's rows see the canvas only; leave-one-out row ``j``, a mask at the position of fed token ``j``,
        sees the canvas except that token's column, and every leave-one-out row (WINO-DLLM ``decoding_wino``'s
        mask)."""
        from refusion.errors import ConfigError

        if self.model.capabilities.logit_shift or state.cfg_scale > 0 or state.block is not None:
            raise ConfigError(
                "leave-one-out verification (a verifying reviser such as 'wino') runs on models with logit shift 0, "
                "without `cfg_scale` and without a block cache (reorderer 'no-cache' or 'commit-order').",
                param="reviser",
            )
        n, q = canvas.shape[0], extend.positions.shape[0]
        twins = extend.positions.cpu().numpy()
        ids = np.concatenate((canvas.numpy(), np.full(q, self.model.mask_token_id, dtype=np.int64)))
        positions = np.concatenate((np.arange(n), twins))
        spans = np.zeros((n + q, 3, 2), dtype=np.int64)
        spans[:n, 0] = (0, n)
        spans[n:, 0, 1] = twins
        spans[n:, 1, 0] = twins + 1
        spans[n:, 1, 1] = n
        spans[n:, 2] = (n, n + q)
        at = feed.add(feed.lane(state, table), ids, positions, np.arange(n + q), spans)
        rows = torch.from_numpy(np.concatenate((twins, n + np.arange(q))))
        epoch = self.epoch

        def finish(scores: Any) -> ExtendOutput:
            table.length = 0
            return ExtendOutput(extend, scores[at + rows], [], 0, 0, epoch, epoch.value)

        return finish


@hookimpl
def register_engines(register):
    register(CanvasEngine)
