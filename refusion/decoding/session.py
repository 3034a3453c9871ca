"""One prompt's decode as a program: the plan-and-infill loop, step by step.

:meth:`DecodeSession.program` is a generator that yields the model calls it
needs and receives their outputs; engines (:mod:`refusion.engines`) run them.
Per iteration of the current serial block: draft the still-masked slots (the
plan), let the selector choose, let the infiller finish some of the chosen
slots, apply EOS, let the reorderer update the cache. Every iteration commits
at least one slot, so a decode ends after at most as many iterations as
there are slots.
"""

from __future__ import annotations

import bisect
import functools
import time
from collections.abc import Generator, Sequence
from typing import Any

import attrs
import torch

from refusion.decoding.checks import (
    bounded,
    call_part,
    checked_candidates,
    checked_post_fill_passes,
    checked_result,
    checked_selection,
    checks_answers,
    plugin_error,
)
from refusion.decoding.context import CacheEditor, Chunk
from refusion.decoding.protocol import ROOT, BlockReuse, Extend, ModelCall, Projection, Selection
from refusion.decoding.sampling import apply_sampler, is_greedy
from refusion.decoding.scores import Scores
from refusion.decoding.types import (
    Commit,
    DecodeResult,
    Drafts,
    InfillResult,
    IterationRecord,
    KVBytes,
    Partition,
    Plan,
    answer_end,
)
from refusion.dtypes import reduction_dtype
from refusion.models.base import ModelAdapter
from refusion.strategies.base import InfillContext, Revision, RevisionView


class DecodeSession:
    """One prompt's decode: its engine state, output buffer, trace and program.

    :meth:`program` is the decode as a generator of model calls; :meth:`run`
    executes it on the session's engine. ``decoder`` is the
    :class:`~refusion.decoding.decoder.Decoder` whose parts and options it uses. ``state`` is what the engine keeps
    for the sequence; ``cache`` (its committed context) stays inspectable
    afterwards. ``record``: keep an :class:`IterationRecord` per iteration
    (for traces, observers, benchmarks); without it only the slots each
    iteration committed are kept.
    """

    def __init__(
        self,
        decoder: Any,
        model: ModelAdapter,
        state: Any,
        partition: Partition,
        seed: int = 0,
        *,
        engine: Any = None,
        record: bool = False,
    ):
        self.decoder = decoder
        self.model = model
        self.state = state
        self.engine = engine
        self.partition = partition
        self.prompt_len = state.prompt_length
        g = partition.gen_length
        self.tokens = torch.full((g,), model.mask_token_id, dtype=torch.long)
        self.commit_step = torch.full((g,), -1, dtype=torch.long)
        self.open = [True] * len(partition.slots)  # not yet committed nor dropped
        self.eos_offset: int | None = None
        self.record = record
        #: per finished iteration, ``(slot index, tokens kept)`` of each commit (what streaming reports)
        self.committed: list[tuple[tuple[int, int], ...]] = []
        #: per finished iteration, its record (only when ``record``)
        self.records: list[IterationRecord] = []
        self.rng = torch.Generator().manual_seed(seed)
        #: the infiller's memory for this sequence across iterations (InfillContext.memory)
        self.memory: dict = {}
        #: drafts are argmaxes: a plan's rows are projected only when read
        self.greedy = is_greedy(decoder.sample)
        #: whose answers are checked on every call (parts from outside refusion; see checks.check_builtins)
        self._checked = {
            kind: checks_answers(getattr(decoder, kind)) for kind in ("selector", "infiller", "reorderer", "reviser")
        }
        #: a reviser may revise accepted tokens: a block's tokens are sealed (cached) only when it is finished
        self.revising = bool(decoder.reviser.revises)
        #: the plan's forward also runs leave-one-out rows over the open block (the reviser reads them)
        self.verifying = self.revising and bool(decoder.reviser.verifies)
        #: positions accepted in the open block but not sealed yet (revisable)
        self.accepted = torch.zeros(g, dtype=torch.bool)
        #: positions sealed into the context (final)
        self.sealed = torch.zeros(g, dtype=torch.bool)
        #: the reviser's scratch space for the open block
        self.block_memory: dict = {}
        #: this iteration's leave-one-out rows over the open block: (region offsets, Scores) (verifying only)
        self._verification: tuple[torch.Tensor, Any] | None = None
        #: the open block's rows of this iteration's forward: (region offsets, Scores) (a predicting reviser only)
        self._predictions: tuple[torch.Tensor, Any] | None = None
        #: slot indices the reviser re-masked in the current iteration (for its record)
        self._revised: tuple[int, ...] = ()
        #: positions of leave-one-out rows after the canvas (the open block's length when verifying)
        self._shadow = 0

    @property
    def cache(self):
        """The sequence's committed context (a :class:`~refusion.decoding.context.SequenceCache`)."""
        return self.state.context

    @property
    def forwards(self) -> int:
        """Model forwards that served this sequence so far (counted by the engine)."""
        return self.state.counters.forwards

    def sample(self, logits: Any, exclude: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's sampler, bound to this prompt's generator (Scores or logits)."""
        return apply_sampler(self.decoder.sample, logits, exclude, self.rng)

    def run(self) -> DecodeResult:
        """Run :meth:`program` to the end on the session's engine."""
        from refusion.decoding.loop import drive

        return drive(self.engine, [self])[0]

    def program(self) -> Generator[ModelCall, Any, DecodeResult]:
        d = self.decoder
        #: edit-only passes a filled block may get: read once, checked and bounded (refusion.limits)
        self._post_fill_passes = checked_post_fill_passes(d.reviser) if self.revising else 0
        for block_index, block in enumerate(self.partition.blocks):
            open_slots = [self.partition.slots[i] for i in block if self.open[i]]
            if open_slots:
                start = self.prompt_len + open_slots[0].offset
                stop = self.prompt_len + open_slots[-1].stop
                reuse = call_part(d.reorderer, d.reorderer.start_block, start, stop)
                if reuse is not None and not isinstance(reuse, BlockReuse):
                    raise plugin_error(d.reorderer, f"start_block returned {reuse!r}; expected None or a BlockReuse.")
                self.state.start_block(start, stop, reuse)
            self.block_memory = {}
            if self.verifying:  # the leave-one-out rows of this block's positions follow the canvas
                self._shadow = sum(self.partition.slots[i].length for i in block)
            iterations, limit = 0, d.calls_per_token * sum(self.partition.slots[i].length for i in block) + 8
            post_fill = 0
            while True:
                remaining = [i for i in block if self.open[i]]
                if not remaining:
                    if self.revising and post_fill < self._post_fill_passes:
                        post_fill += 1  # an edit-only pass over the filled block
                        if (yield from self._review(block, block_index, post_fill)):
                            continue
                    if self.revising:
                        self._seal(block)
                    break
                iterations += 1
                if self.revising and iterations > limit:
                    raise plugin_error(
                        d.reviser,
                        f"kept block {block_index} open for {limit} iterations (calls_per_token x its length + 8); "
                        "a reviser must let every block finish.",
                    )
                before = self._snapshot() if self.record else None
                firsts = [self.prompt_len + self.partition.slots[i].offset for i in remaining]
                width = checked_candidates(d.selector, firsts)
                candidates = tuple(self.partition.slots[i] for i in remaining[:width])
                ctx = InfillContext(
                    mask_token_id=self.model.mask_token_id,
                    eos_token_ids=self.model.eos_token_ids,
                    last_scores=self.cache.last_scores,
                    last_position=self.cache.last_position,
                    context_length=len(self.cache),
                    sampler=self.sample,
                    memory=self.memory,
                    region_start=self.prompt_len,
                )
                drafted = d.selector.reads_scores or call_part(d.infiller, d.infiller.needs_drafts, ctx, candidates)
                plan = yield from self._plan(candidates, drafted, block)
                if drafted:  # the plan's forward encoded pending entries: what precedes the region is known now
                    ctx = attrs.evolve(ctx, last_scores=self.cache.last_scores)
                chosen = yield Selection(d.selector, plan)  # decided with the other sequences' plans
                chosen = (
                    checked_selection(d.selector, plan, chosen) if self._checked["selector"] else tuple(sorted(chosen))
                )
                if drafted and self.greedy:  # the chosen slots' drafts, projected with the other sequences'
                    rows = torch.cat([torch.arange(plan.offsets[i], plan.offsets[i + 1]) for i in chosen])
                    yield Projection(plan.scores, rows)
                budget = d.calls_per_token * sum(plan.slots[i].length for i in chosen) + 8
                program = call_part(d.infiller, d.infiller.infill, ctx, plan, chosen)
                check = self._checked["infiller"]
                result = yield from bounded(
                    d.infiller, program, budget, self.model.vocab_size, self.model.max_positions, check
                )
                if check:
                    result = checked_result(
                        d.infiller,
                        result,
                        plan,
                        chosen,
                        self.model.eos_token_ids,
                        self.model.mask_token_id,
                        self.model.vocab_size,
                    )
                encoded = self.cache.encoded
                if self.revising:
                    editor = self._accept(result, block, block_index)
                else:
                    result = self._apply_eos(result)
                    editor = self._reorder(result)
                if before is not None:
                    self.records.append(
                        self._record(block_index, remaining, plan, chosen, result, before, encoded, editor)
                    )
                self.committed.append(tuple((m.slot.index, m.tokens.shape[0]) for m in result.commits))
            if d.stop_at_eos == "block" and self.eos_offset is not None:  # the block with the EOS is finished: stop
                self.open = [False] * len(self.open)
                break
        return self._result()

    def _plan(self, slots: tuple, drafted: bool, block: Sequence[int] = ()) -> Generator[ModelCall, Any, Plan]:
        """Draft ``slots`` with one forward of masks (or, when nobody reads the drafts, without one).

        A revising decoder's plan feeds the whole open block (its accepted, not yet cached tokens and its
        masks; with a verifying reviser also leave-one-out rows) and drafts the masked ``slots`` from it."""
        if self.revising and drafted:
            return (yield from self._block_plan(slots, block))
        offsets = [0]
        for slot in slots:
            offsets.append(offsets[-1] + slot.length)
        first, last = slots[0].offset, slots[-1].stop
        if last - first == offsets[-1]:  # contiguous slots: one range
            positions = torch.arange(first, last) + self.prompt_len
        else:
            positions = torch.cat([torch.arange(s.offset, s.stop) for s in slots]) + self.prompt_len
        if not drafted:
            return Plan(slots, positions, None, tuple(offsets), self.rng, **self._where())
        masks = torch.full_like(positions, self.model.mask_token_id)
        selector = self.decoder.selector
        # the slot scores are projected with the other sequences' rows (on the fused path only; a rescoring
        # selector's drafts come from the logits it returns)
        fused = self.greedy and not selector.rescores
        reads = torch.as_tensor(offsets[:-1]) if fused and selector.reads_scores else None
        (out,) = yield ModelCall.of(Extend(ROOT, masks, positions, reads))
        return self._drafted(slots, positions, out.scores, offsets)

    def _drafted(
        self, slots: tuple, positions: torch.Tensor, scores: Any, offsets: list[int], drawn: Any = None
    ) -> Plan:
        """The plan of ``slots`` whose drafts come from ``scores`` (one row per planned position); ``drawn``:
        their ``(tokens, confidence)`` already drawn (with the rest of the block, in one draw). A selector that
        rescores (:meth:`~refusion.strategies.base.SlotSelector.rescore`) gives the logits they are drawn from (a
        draw made with the block is then made again from them)."""
        selector = self.decoder.selector
        if selector.rescores:
            scores, drawn = self._rescored(selector, slots, positions, scores, offsets), None
        draw = (lambda s: drawn) if drawn is not None else (lambda s: self.draw(s, positions))
        drafts = Drafts(
            scores,
            draw,
            len(positions),
            lazy=self.greedy,
            exclude=self.model.mask_token_id,
            rowwise=drawn is None and getattr(self.decoder.sample, "rowwise", False),
        )
        return Plan(slots, positions, scores, tuple(offsets), self.rng, drafts, **self._where())

    def _rescored(self, selector: Any, slots: tuple, positions: torch.Tensor, scores: Any, offsets: list[int]) -> Any:
        """The plan's scores as ``selector.rescore`` returns them (checked: same shape, floating point)."""
        logits = Scores.of(scores).logits
        bare = Plan(slots, positions, scores, tuple(offsets), self.rng, **self._where())
        out = call_part(selector, selector.rescore, bare, logits)
        if not isinstance(out, torch.Tensor) or out.shape != logits.shape or not out.is_floating_point():
            raise plugin_error(
                selector,
                f"rescore returned {type(out).__name__} of shape {tuple(getattr(out, 'shape', ()))}; expected "
                f"floating-point logits of shape {tuple(logits.shape)}.",
            )
        return Scores(logits=out)

    def _span(self, block: Sequence[int]) -> tuple[int, int]:
        """Region offsets ``first, stop`` of serial block ``block`` (slot indices)."""
        return self.partition.slots[block[0]].offset, self.partition.slots[block[-1]].stop

    def _block_plan(self, slots: tuple, block: Sequence[int]) -> Generator[ModelCall, Any, Plan]:
        """A revising decoder's plan: one forward over the open block's tokens (plus leave-one-out rows)."""
        offsets = [0]
        for slot in slots:
            offsets.append(offsets[-1] + slot.length)
        first, stop = self._span(block)
        span = torch.arange(first, stop)
        positions = torch.cat([torch.arange(s.offset, s.stop) for s in slots]) + self.prompt_len
        fed = Extend(ROOT, self.tokens[first:stop], span + self.prompt_len, verify=self.verifying)
        (out,) = yield ModelCall.of(fed)
        if self.verifying:
            self._verification = (span, out.scores[len(span) :])
        rows = positions - self.prompt_len - first
        if not self.decoder.reviser.predicts:
            return self._drafted(slots, positions, out.scores[rows], offsets)
        if self.greedy:  # the reviser reads the forward's argmax at the accepted positions
            self._predictions = (span, out.scores[: len(span)])
            return self._drafted(slots, positions, out.scores[rows], offsets)
        # sampling: one draw over the whole block (LLaDA 2.1 draws every row of it); the masked rows' draws are the
        # plan's drafts, the accepted rows' the reviser's predictions
        tokens, confidence = self.draw(out.scores[: len(span)], span + self.prompt_len)
        self._predictions = (span, (tokens.cpu(), confidence.cpu()))
        return self._drafted(slots, positions, out.scores[rows], offsets, drawn=(tokens[rows], confidence[rows]))

    def _accept(self, result: InfillResult, block: Sequence[int], block_index: int) -> CacheEditor:
        """A revising decoder's commits: accepted, revisable until the block is sealed; then the reviser's turn."""
        d = self.decoder
        iteration = len(self.committed)
        now = torch.zeros_like(self.accepted)
        for c in result.commits:
            offset, n = c.slot.offset, c.tokens.shape[0]
            self.tokens[offset : offset + n] = c.tokens.cpu()
            self.commit_step[offset : offset + n] = iteration
            now[offset : offset + n] = True
            self.open[c.slot.index] = False
        verified = self._verified_probabilities(now)
        self.accepted |= now
        view = self._view(block, block_index, now, verified)
        revision = call_part(d.reviser, d.reviser.revise, view)
        self._revised = self._revise(revision, set(view.offsets.tolist())) if revision else ()
        return CacheEditor(self.cache)

    def _view(
        self, block: Sequence[int], block_index: int, now: torch.Tensor, verified: Any, post_fill: int = 0
    ) -> RevisionView:
        """What the reviser reads of the open block: its accepted tokens, with this iteration's rows."""
        first, stop = self._span(block)
        inside = self.accepted[first:stop].nonzero().squeeze(-1) + first
        predicted = probability = None
        if self._predictions is not None:
            span, rows = self._predictions
            self._predictions = None
            if isinstance(rows, tuple):  # sampled with the plan's drafts
                predicted, probability = rows[0][inside - first], rows[1][inside - first]
            else:
                logits = rows[inside - first].logits
                probability, predicted = torch.softmax(logits.to(reduction_dtype(logits.dtype)), dim=-1).max(dim=-1)
                predicted, probability = predicted.cpu(), probability.cpu()
        return RevisionView(
            offsets=inside,
            tokens=self.tokens[inside],
            accepted_now=now[inside],
            verified=None if verified is None else verified[inside - first],
            masked=int((~self.accepted[first:stop]).sum()),
            block=block_index,
            block_start=first,
            block_stop=stop,
            memory=self.block_memory,
            predicted=predicted,
            predicted_probability=probability,
            post_fill=post_fill,
            mask_token_id=self.model.mask_token_id,
        )

    def _review(self, block: Sequence[int], block_index: int, post_fill: int) -> Generator[ModelCall, Any, bool]:
        """An edit-only pass over the filled open block: one forward, then the reviser (True if it revised)."""
        before = self._snapshot() if self.record else None
        first, stop = self._span(block)
        span = torch.arange(first, stop)
        (out,) = yield ModelCall.of(Extend(ROOT, self.tokens[first:stop], span + self.prompt_len))
        if self.greedy:
            self._predictions = (span, out.scores)
        else:  # the pass draws every row of the block, as the plan's forward does
            tokens, confidence = self.draw(out.scores, span + self.prompt_len)
            self._predictions = (span, (tokens.cpu(), confidence.cpu()))
        view = self._view(block, block_index, torch.zeros_like(self.accepted), None, post_fill)
        revision = call_part(self.decoder.reviser, self.decoder.reviser.revise, view)
        self._revised = self._revise(revision, set(view.offsets.tolist())) if revision else ()
        if before is not None:
            start, forwards, logged, copied, written, encoded = before
            c = self.state.counters
            self.records.append(
                IterationRecord(
                    iteration=len(self.committed),
                    block=block_index,
                    planned=(),
                    selected=(),
                    committed=(),
                    forwards=c.forwards - forwards,
                    revised=self._revised,
                    fed_tokens=tuple(c.fed_log[logged:]),
                    kv_encoded=self.cache.encoded - encoded,
                    kv_copied_bytes=c.kv_context_bytes - copied,
                    kv_written_bytes=c.kv_new_bytes - written,
                    seconds=time.perf_counter() - start,
                )
            )
        self.committed.append(())
        return bool(revision)

    def _verified_probabilities(self, now: torch.Tensor) -> torch.Tensor | None:
        """Each position of the open block: the float64 probability of its accepted token under its leave-one-out
        row of this iteration's forward (NaN where it was not accepted before this iteration)."""
        if self._verification is None:
            return None
        span, rows = self._verification
        self._verification = None
        earlier = self.accepted[span] & ~now[span]
        out = torch.full((len(span),), float("nan"), dtype=torch.float64)
        if bool(earlier.any()):
            index = earlier.nonzero().squeeze(-1)
            logits = rows[index].logits.to(torch.float64)
            probs = torch.softmax(logits, dim=-1)
            tokens = self.tokens[span[index]].to(probs.device)
            out[index] = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).cpu()
        return out

    def _revise(self, revision: Any, allowed: set[int]) -> tuple[int, ...]:
        """Apply a reviser's :class:`Revision` (checked): re-masked positions reopen their whole slot. Returns the
        slots it re-masked or replaced tokens of."""
        d = self.decoder
        if not isinstance(revision, Revision):
            raise plugin_error(d.reviser, f"revise returned {revision!r:.80}; expected None or a Revision.")
        named = set(revision.remask) | set(revision.replace)
        if not named <= allowed:
            raise plugin_error(
                d.reviser, f"revised offsets {sorted(named - allowed)[:8]} that are not accepted tokens of the view."
            )
        vocab, mask = self.model.vocab_size, self.model.mask_token_id
        for offset, token in revision.replace.items():
            if not 0 <= token < vocab or token == mask:
                raise plugin_error(
                    d.reviser,
                    f"replaced offset {offset} with {token}; expected a token id in [0, {vocab}) other than the mask.",
                )
            self.tokens[offset] = token
        reopened = sorted({self._slot_at(o) for o in revision.remask})
        for index in reopened:
            slot = self.partition.slots[index]
            self.tokens[slot.offset : slot.stop] = mask
            self.commit_step[slot.offset : slot.stop] = -1
            self.accepted[slot.offset : slot.stop] = False
            self.open[index] = True
        return tuple(sorted(set(reopened) | {self._slot_at(o) for o in revision.replace}))

    def _slot_at(self, offset: int) -> int:
        """The index of the slot holding region offset ``offset`` (slots are in position order)."""
        return bisect.bisect_right(self._slot_starts, offset) - 1

    def _seal(self, block: Sequence[int]) -> None:
        """The open block is finished: EOS applied, its accepted tokens handed to the reorderer (the cache)."""
        slots = [self.partition.slots[i] for i in block if self.accepted[self.partition.slots[i].offset]]
        if not slots:
            return
        commits = [
            Commit(s, self.tokens[s.offset : s.stop].clone(), torch.arange(s.offset, s.stop) + self.prompt_len)
            for s in slots
        ]
        result = self._apply_eos(InfillResult(commits))
        self.accepted[:] = False
        self._reorder(result, stamp=False)

    def _where(self) -> dict:
        """The plan's place in the decode, for schedule-driven selectors (a verifying decoder's canvas holds the
        leave-one-out rows too)."""
        return dict(
            canvas_length=self.prompt_len + self.partition.gen_length + self._shadow,
            num_blocks=len(self.partition.blocks),
            memory=self.memory,
        )

    def draw(self, scores: Any, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's sampler over a plan's rows at ``positions`` (absolute), drawn from this prompt's generator
        with what the sampler asks for (the canvas, the model block); ``(tokens, confidence)``."""
        canvas = self._where()["canvas_length"]
        block = None
        if getattr(self.decoder.sample, "draws_block", False) and hasattr(self.model, "block_start"):
            start = self.model.block_start(int(positions[0]), self.prompt_len)
            block = (start, min(start + self.model.capabilities.block_length, canvas))
        return apply_sampler(
            self.decoder.sample,
            scores,
            self.model.mask_token_id,
            self.rng,
            positions=positions,
            canvas_length=canvas,
            block=block,
        )

    @functools.cached_property
    def _slot_starts(self) -> list[int]:
        return [slot.offset for slot in self.partition.slots]

    def _apply_eos(self, result: InfillResult) -> InfillResult:
        """Cut the answer at the earliest EOS: truncate its slot, drop every slot after it."""
        eos = self.model.eos_token_ids
        if not eos or self.decoder.stop_at_eos is False:
            return result
        every = torch.cat([c.tokens for c in result.commits]) if len(result.commits) > 1 else result.commits[0].tokens
        ids = every.tolist()  # committed tokens live on the host: one read for the whole result
        if eos.isdisjoint(ids):
            return result
        first, start = None, 0
        for c in result.commits:
            n = len(c.tokens)
            found = next((j for j, t in enumerate(ids[start : start + n]) if t in eos), None)
            start += n
            if found is not None:
                offset = c.slot.offset + found
                first = offset if first is None else min(first, offset)
        self.eos_offset = first if self.eos_offset is None else min(self.eos_offset, first)
        if self.decoder.stop_at_eos == "block":  # the block is decoded to its end, as if no EOS had come
            return result
        self.state.end_at(self.prompt_len + self.eos_offset)
        for slot in self.partition.slots:
            if slot.offset > first:
                self.open[slot.index] = False
        kept: list[Commit] = []
        for c in result.commits:
            if c.slot.offset > first:
                continue
            m = first - c.slot.offset + 1
            if m < c.tokens.shape[0]:
                kv = c.kv[: min(m, len(c.kv))] if c.kv is not None else None
                c = Commit(c.slot, c.tokens[:m], c.positions[:m], kv, c.chain)
            kept.append(c)
        same = len(kept) == len(result.commits) and all(a is b for a, b in zip(kept, result.commits))
        return result if same else InfillResult(kept, next_logits=None)

    def _snapshot(self) -> tuple:
        """What an iteration's record is measured from: counters, encoded entries and the clock at its start."""
        c = self.state.counters
        return (time.perf_counter(), c.forwards, len(c.fed_log), c.kv_context_bytes, c.kv_new_bytes, self.cache.encoded)

    def _record(
        self,
        block: int,
        remaining: list,
        plan: Plan,
        chosen: Sequence[int],
        result: InfillResult,
        before: tuple,
        encoded: int,
        editor: CacheEditor,
    ) -> IterationRecord:
        """The iteration's record: its decisions and what it cost since ``before`` (:meth:`_snapshot`)."""
        start, forwards, logged, copied, written, encoded_before = before
        c = self.state.counters
        scored = plan.drafted and self.decoder.selector.reads_scores
        return IterationRecord(
            iteration=len(self.committed),
            block=block,
            planned=tuple(remaining),
            selected=tuple(plan.slots[i].index for i in chosen),
            committed=tuple((m.slot.index, m.tokens.shape[0]) for m in result.commits),
            forwards=c.forwards - forwards,
            drafted=tuple(s.index for s in plan.slots) if plan.drafted else (),
            confidence=tuple(plan.first_confidence.tolist()) if scored else (),
            fed_tokens=tuple(c.fed_log[logged:]),
            kv_appended=editor.appended_kv,
            kv_pending=editor.appended - editor.appended_kv,
            kv_encoded=encoded - encoded_before,
            kv_invalidated=editor.invalidated,
            revised=self._revised,
            kv_copied_bytes=c.kv_context_bytes - copied,
            kv_written_bytes=c.kv_new_bytes - written,
            seconds=time.perf_counter() - start,
        )

    def _reorder(self, result: InfillResult, stamp: bool = True) -> CacheEditor:
        """Seal ``result``'s commits: the reorderer puts them into the cache (checked); ``stamp`` marks them
        committed in this iteration (a revising decoder's tokens keep the iteration that accepted them)."""
        d = self.decoder
        expected = len(self.cache) + sum(c.tokens.shape[0] for c in result.commits)
        editor = CacheEditor(self.cache)
        call_part(d.reorderer, d.reorderer.reorder, editor, result)
        if len(self.cache) != expected:
            raise plugin_error(d.reorderer, f"left the cache with {len(self.cache)} entries; expected {expected}.")
        if self._checked["reorderer"]:
            added = self.cache.positions[expected - sum(c.tokens.shape[0] for c in result.commits) :]
            committed = torch.cat([c.positions.cpu() for c in result.commits])
            if not torch.equal(torch.sort(added).values, torch.sort(committed).values):
                raise plugin_error(
                    d.reorderer,
                    "appended positions other than the committed ones; it must append "
                    "each committed token exactly once.",
                )
        for c in result.commits:
            offset = c.slot.offset
            self.tokens[offset : offset + c.tokens.shape[0]] = c.tokens.cpu()
            if stamp:
                self.commit_step[offset : offset + c.tokens.shape[0]] = len(self.committed)
            self.sealed[offset : offset + c.tokens.shape[0]] = True
            self.open[c.slot.index] = False
        return editor

    def settled(self, order: torch.Tensor, encoded: int) -> DecodeResult:
        """A batched form (:mod:`refusion.decoding.forms`) finished this session's row: its cache holds the prompt,
        then the answer's region offsets ``order`` in commit order, the first ``encoded`` of them all with
        keys/values (the forwards and tokens that served it are on its counters already). Returns the result."""
        cache = self.cache
        prompt = self.prompt_len
        cache.tokens = torch.cat((cache.tokens[:prompt], self.tokens[order]))
        cache.positions = torch.cat((torch.arange(prompt), order + prompt))
        cache.encoded = encoded
        cache.chunks = [Chunk(0, encoded, 0)]
        cache.last_scores = None
        return self._result()

    def _result(self) -> DecodeResult:
        if self.eos_offset is None and self.model.eos_token_ids:  # stop_at_eos off: cut at the first EOS now
            hits = torch.isin(self.tokens, torch.tensor(sorted(self.model.eos_token_ids))).nonzero()
            self.eos_offset = int(hits[0]) if len(hits) else None
        end, stopped = answer_end(self.partition, self.eos_offset)
        if bool((self.commit_step[:end] < 0).any()):  # pragma: no cover - guarded by the checks above
            raise RuntimeError("internal error: a position before the end of the answer was never committed")
        counters = self.state.counters
        return DecodeResult(
            tokens=self.tokens[:end].clone(),
            prompt_length=self.prompt_len,
            partition=self.partition,
            commit_step=self.commit_step,
            forwards=self.forwards,
            stopped_at_eos=stopped,
            num_iterations=len(self.committed),
            iterations=tuple(self.records),
            region_tokens=[int(t) if s >= 0 else -1 for t, s in zip(self.tokens.tolist(), self.commit_step.tolist())],
            engine=getattr(self.engine, "name", None),
            fed_tokens=counters.fed_tokens,
            kv_bytes=KVBytes(counters.kv_context_bytes, counters.kv_new_bytes),
        )
