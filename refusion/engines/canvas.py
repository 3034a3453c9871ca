"""The ``canvas`` engine: model calls for bidirectional masked diffusion LMs (LLaDA- and Dream-style).

Such a model sees the whole *canvas*: prompt, committed tokens and masks at
every other position of the generation region, in position order, with
bidirectional attention. An extend's tokens are placed on the canvas at their
positions and the logits at those positions are read back; with a logit shift
of 1 (Dream) the logits predicting position ``p`` are the model's output at
``p - 1``. Positions after a committed EOS are filled with EOS.

Without an approximation every call is a full forward of the canvas (the
plain MDM baseline). When a cache reorderer asks for
:class:`~refusion.decoding.protocol.BlockReuse` at the start of a block, the engine
applies Fast-dLLM's approximations (Wu et al., arXiv 2505.22618): the first
call of the block is a full forward that also keeps the keys/values of the
prefix (``prefix`` mode) or of the prefix and the suffix (``dual`` mode);
later calls of the block feed only the block (plus, in prefix mode, the
suffix) and attend to the kept keys/values.

With classifier-free guidance (:meth:`CanvasEngine.guide`, LLaDA's
``cfg_scale``) every call is one forward of a batch of two canvases, the
second with the prompt masked, and the logits are
``un + (cfg_scale + 1) * (cond - un)`` in the model's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import attrs
import torch

from refusion.cache.sequence import SequenceCache
from refusion.cache.stores import NoStore
from refusion.decoding.protocol import BlockReuse, Extend, ExtendOutput, ModelCall
from refusion.engines.base import Engine, SequenceState
from refusion.plugins import hookimpl


@attrs.define
class BlockCache:
    """Fast-dLLM cache state of one sequence's current block ``start:stop`` (absolute positions).

    ``stale`` asks for a refresh (a full forward) at the next call; ``kept``
    holds per layer the (keys, values) of positions ``0:prefix_end`` and
    ``suffix_start:canvas`` from that forward.
    """

    mode: str
    start: int
    stop: int
    prefix_at_block: bool = False
    stale: bool = True
    kept: list | None = None
    prefix_end: int = 0
    suffix_start: int = 0


class CanvasSequence(SequenceState):
    """A sequence on the canvas: where its answer ends and its block cache, if any."""

    def __init__(self, context: SequenceCache, counters, prompt_length: int, region_length: int, eos_fill: int | None):
        super().__init__(context, counters, prompt_length, region_length)
        self.eos_fill = eos_fill
        #: first position after a committed EOS (filled with ``eos_fill``), if any
        self.end: int | None = None
        self.block: BlockCache | None = None
        #: classifier-free guidance scale (0: none)
        self.cfg_scale = 0.0

    def start_block(self, start: int, stop: int, reuse: BlockReuse | None) -> None:
        if reuse is not None and self.cfg_scale > 0:
            from refusion.errors import ConfigError

            raise ConfigError(
                f"`cfg_scale` > 0 needs a full forward at every step; the reorderer's {reuse.mode!r} "
                "block cache cannot be combined with it (use reorderer 'commit-order' or 'no-cache').",
                param="cfg_scale",
            )
        self.block = None if reuse is None else BlockCache(reuse.mode, start, stop, reuse.prefix_at_block)

    def end_at(self, position: int) -> None:
        self.end = position + 1 if self.end is None else min(self.end, position + 1)


class CanvasEngine(Engine):
    """Runs the model calls of sequences on a bidirectional model, one forward per extend."""

    name = "canvas"
    priority = 10
    mixes_sequences = False  # one sequence per forward

    @classmethod
    def unsupported(cls, model: Any) -> str | None:
        if model.capabilities.causal:
            return "it is for bidirectional models (causal ones use 'branch' or 'repeat')"
        if model.capabilities.block_length:
            return "it attends across the whole canvas; block-diffusion models use the 'block' engine"
        return None

    def admit(self, prompt: torch.Tensor, region_length: int) -> SequenceState:
        counters = self.new_counters()
        context = SequenceCache(NoStore(), prompt, torch.arange(prompt.shape[0]))
        eos = self.model.eos_token_ids
        return CanvasSequence(context, counters, prompt.shape[0], region_length, min(eos) if eos else None)

    def guide(self, state: SequenceState, cfg_scale: float) -> None:
        cast(CanvasSequence, state).cfg_scale = float(cfg_scale)

    def run(self, calls: Mapping[SequenceState, ModelCall]) -> dict[SequenceState, tuple[ExtendOutput, ...]]:
        self.epoch.value += 1
        return {state: tuple(self._extend(state, e) for e in call.extends) for state, call in calls.items()}

    def _canvas(self, state: CanvasSequence, extend: Extend) -> torch.Tensor:
        canvas = torch.full((state.canvas_length,), self.model.mask_token_id, dtype=torch.long)
        if state.end is not None and state.eos_fill is not None:
            canvas[state.end :] = state.eos_fill
        context = state.context
        canvas[context.positions] = context.tokens
        canvas[extend.positions.cpu()] = extend.tokens.cpu()
        return canvas

    @torch.no_grad()
    def _extend(self, state: CanvasSequence, extend: Extend) -> ExtendOutput:
        shift = self.model.capabilities.logit_shift
        canvas = self._canvas(state, extend)
        block = state.block
        wanted = extend.positions.cpu() - shift
        if int(wanted.min()) < 0:
            raise ValueError("with a logit shift of 1, position 0 cannot be predicted")
        if extend.verify:
            return self._verified(state, extend, canvas, block)
        if block is not None and not block.stale:
            inside = bool(((wanted >= block.prefix_end) & (wanted < block.suffix_start)).all())
            if inside:
                return self._approximate(state, extend, canvas, block, wanted)
        if state.cfg_scale > 0:
            return self._guided(state, extend, canvas, wanted)
        return self._full(state, extend, canvas, block, wanted)

    def _guided(self, state: CanvasSequence, extend: Extend, canvas: torch.Tensor, wanted) -> ExtendOutput:
        from refusion.decoding.scores import Scores

        unconditional = canvas.clone()
        prompt = unconditional[: state.prompt_length]
        prompt[prompt != self.model.mask_token_id] = self.model.mask_token_id
        ids = torch.stack((canvas, unconditional)).to(self.device)
        positions = torch.arange(canvas.shape[0], device=self.device).expand(2, -1)
        mask = torch.ones(2, canvas.shape[0], dtype=torch.long, device=self.device)
        both = self.run_network(ids, positions, mask, None)
        n = canvas.shape[0]
        self.served({state: 2 * n}, pairs=2 * n * n)
        cond, un = both.logits[0], both.logits[1]
        logits = un + (state.cfg_scale + 1) * (cond - un)
        return ExtendOutput(
            extend, Scores(logits=logits[wanted.to(logits.device)]), [], 0, 0, self.epoch, self.epoch.value
        )

    def _verified(self, state: CanvasSequence, extend: Extend, canvas: torch.Tensor, block) -> ExtendOutput:
        """The canvas plus one leave-one-out row per fed position (WINO's verification block), in one forward.

        The input is the canvas followed by a mask token per fed position, at
        that position; canvas rows attend to the canvas only; leave-one-out row
        ``j`` attends to the canvas except the fed position ``j`` and to every
        leave-one-out row (WINO-DLLM ``decoding_wino``'s mask, built the same way)."""
        from refusion.errors import ConfigError

        if self.model.capabilities.logit_shift or state.cfg_scale > 0 or block is not None:
            raise ConfigError(
                "leave-one-out verification (a verifying reviser such as 'wino') runs on models with logit shift 0, "
                "without `cfg_scale` and without a block cache (reorderer 'no-cache' or 'commit-order').",
                param="reviser",
            )
        n, q = canvas.shape[0], extend.positions.shape[0]
        twins = extend.positions.cpu()
        ids = torch.cat((canvas, torch.full((q,), self.model.mask_token_id, dtype=torch.long)))
        positions = torch.cat((torch.arange(n), twins))
        allowed = torch.ones(n + q, n + q, dtype=torch.bool)
        allowed[:, n:] = False
        allowed[n:, n:] = True
        allowed[n + torch.arange(q), twins] = False
        device = self.device
        mask = allowed[None, None].to(device)
        scores = self.run_network(ids[None].to(device), positions[None].to(device), mask, None)[0]
        self.served({state: n + q}, pairs=int(allowed.sum()))
        rows = torch.cat((twins, n + torch.arange(q)))
        return ExtendOutput(extend, scores[rows], [], 0, 0, self.epoch, self.epoch.value)

    def _forward(self, state: CanvasSequence, ids, positions, cache_obj):
        device = self.device
        past = cache_obj.get_seq_length() if cache_obj is not None else 0
        mask = torch.ones(1, past + ids.shape[0], dtype=torch.long, device=device)
        scores = self.run_network(ids[None].to(device), positions[None].to(device), mask, cache_obj)[0]
        n = ids.shape[0]
        self.served({state: n}, pairs=n * (past + n), keys=past)  # bidirectional: every query sees every key
        return scores

    def _full(self, state, extend, canvas, block, wanted) -> ExtendOutput:
        positions = torch.arange(canvas.shape[0])
        store: Any = self.model.new_cache() if block is not None else None
        logits = self._forward(state, canvas, positions, store)
        if block is not None:
            shift = self.model.capabilities.logit_shift
            block.prefix_end = block.start if block.prefix_at_block else max(0, block.start - shift)
            block.suffix_start = block.stop if block.mode == "dual" else canvas.shape[0]
            kept = []
            for layer in store.layers:
                keys = torch.cat((layer.keys[:, :, : block.prefix_end], layer.keys[:, :, block.suffix_start :]), dim=2)
                values = torch.cat(
                    (layer.values[:, :, : block.prefix_end], layer.values[:, :, block.suffix_start :]), dim=2
                )
                kept.append((keys, values))
            block.kept, block.stale = kept, False
        return ExtendOutput(extend, logits[wanted], [], 0, 0, self.epoch, self.epoch.value)

    def _approximate(self, state, extend, canvas, block, wanted) -> ExtendOutput:
        from transformers import DynamicCache

        if block.mode == "dual":  # the block's keys/values between the prefix's and the suffix's, as Fast-dLLM's
            store = _between(block.kept, block.prefix_end)
        else:
            store = DynamicCache(list(block.kept))  # update() concatenates into new tensors: the snapshot stays intact
        positions = torch.arange(block.prefix_end, block.suffix_start)
        logits = self._forward(state, canvas[block.prefix_end : block.suffix_start], positions, store)
        return ExtendOutput(extend, logits[wanted - block.prefix_end], [], 0, 0, self.epoch, self.epoch.value)


def _between(kept: list, split: int) -> Any:
    """A transformers cache of the kept ``(keys, values)`` per layer whose ``update`` inserts the new entries at
    ``split`` (after the prefix, before the suffix) and stores nothing.

    Attention is over the same keys in any order, but the order fixes the
    sums' rounding: Fast-dLLM's dual cache writes the block's keys/values in
    place (``replace_position``), so its forwards see prefix, block, suffix
    in position order; so do these.
    """
    from transformers import DynamicCache

    class Between(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            keys, values = kept[layer_idx]
            return (
                torch.cat((keys[:, :, :split], key_states, keys[:, :, split:]), dim=2),
                torch.cat((values[:, :, :split], value_states, values[:, :, split:]), dim=2),
            )

    return Between(list(kept))


@hookimpl
def register_engines(register):
    register(CanvasEngine)
