"""The generic plan-and-infill decoder.

It composes a partitioner, a selector, an infiller and a cache reorderer, and
knows nothing about any of them beyond their interfaces. Per iteration of the
current serial block: draft the still-masked slots (the plan), let the
selector choose, let the infiller finish some of the chosen slots, apply EOS,
let the reorderer update the cache. Every iteration commits at least one slot,
so decoding ends after at most as many iterations as there are slots.

A decode is a *program*: a generator that yields the model calls it needs and
receives their outputs (:meth:`DecodeSession.program`). Engines
(:mod:`refusion.engines`) run them; :meth:`Decoder.decode_batch` runs a batch
to the end, :class:`refusion.generator.Generator` lets requests join and leave
a running engine.
"""

from __future__ import annotations

import time
from typing import Any, Generator, Sequence

import attrs
import torch

from refusion.cache.sequence import CacheEditor
from refusion.config.spec import DecoderSpec, SamplerSpec
from refusion.decoding.checks import (bounded, call_part, check_length, check_prompt, checked_partition, checked_result,
                             checked_selection, plugin_error)
from refusion.errors import ConfigError
from refusion.models.base import ModelAdapter
from refusion.decoding.protocol import BlockReuse, Branch, Extend, ModelCall, Projection
from refusion.decoding.sampling import Sampler, apply_sampler, greedy, is_greedy
from refusion.decoding.types import Commit, DecodeResult, Drafts, InfillResult, Partition, Plan, StepRecord
from refusion.strategies.base import CacheReorderer, InfillContext, Infiller, SlotPartitioner, SlotSelector
from refusion.validators import positive_int


def _part(kind: type):
    def check(instance, attribute, value):
        if not isinstance(value, kind):
            raise ConfigError(f"`{attribute.name}` must be a {kind.__name__} instance; got {value!r}.", param=attribute.name)

    return attrs.field(validator=check)


@attrs.frozen
class Prepared:
    """One prompt checked and partitioned, ready to be admitted into an engine (see :meth:`Decoder.prepare`)."""

    prompt: torch.Tensor = attrs.field(eq=False)
    partition: Partition
    seed: int


@attrs.frozen
class Decoder:
    """Plan-and-infill decoding with four interchangeable parts.

    ``sample`` turns logits into drafts (default: greedy; see
    :class:`~refusion.decoding.sampling.Sampling` for temperature, top-k and top-p);
    each prompt draws from its own generator seeded with ``seed``, so a decode
    is reproducible and the same alone or in a batch. ``calls_per_token``
    bounds an infiller's model calls per iteration (``calls_per_token`` x the
    chosen tokens, plus 8); an infiller that exceeds it is stopped with an
    error naming it. ``engine`` names what runs the model calls (a registered
    engine name such as ``"branch"``, ``"repeat"`` or ``"canvas"``, or an
    :class:`~refusion.engines.base.Engine` subclass); ``None`` (default) takes
    the best engine that can run the model (:func:`~refusion.engines.choose_engine`).
    ``stop_at_eos`` (default) drops every slot after a committed EOS (early
    stop); without it every position is decoded and the answer is cut at the
    first EOS at the end; ``"block"`` finishes the serial block in which an
    EOS was committed and stops there (SDAR's ``stopping_criteria_idx``). ``cfg_scale`` > 0 applies LLaDA's classifier-free
    guidance (a second forward with the prompt masked; see
    :meth:`~refusion.engines.base.Engine.guide`).
    """

    partitioner: SlotPartitioner = _part(SlotPartitioner)
    selector: SlotSelector = _part(SlotSelector)
    infiller: Infiller = _part(Infiller)
    reorderer: CacheReorderer = _part(CacheReorderer)
    sample: Sampler = greedy
    calls_per_token: int = attrs.field(default=4, validator=positive_int)
    engine: Any = attrs.field(default=None, validator=lambda i, a, v: _check_engine(v))
    stop_at_eos: bool | str = attrs.field(default=True, validator=lambda i, a, v: _check_stop(v))
    seed: int = attrs.field(default=0, validator=lambda i, a, v: _check_seed(v))
    cfg_scale: float = attrs.field(default=0.0, validator=lambda i, a, v: _check_cfg_scale(v))

    @classmethod
    def from_names(
        cls,
        partitioner: Any = "fixed",
        selector: Any = "threshold",
        infiller: Any = "parallel-ar",
        reorderer: Any = "commit-order",
        **params: Any,
    ) -> "Decoder":
        """Build parts from names, classes, ``"module:Class"`` strings or instances.

        ``params`` go to whichever part declares them (``slot_size=``,
        ``token_threshold=``, ...) or, spelled ``"selector.k"``, to one part;
        the decoder's own options (``engine``, ``seed``, ``stop_at_eos``,
        ``cfg_scale``, ``calls_per_token``), ``sampler`` and its ``temperature``,
        ``top_k``, ``top_p`` to the decoder (see :class:`~refusion.config.spec.DecoderSpec`,
        which this builds; ``sample=`` takes a ready-made sampler).
        """
        spec = DecoderSpec.of_parts(partitioner, selector, infiller, reorderer)
        sample = params.pop("sample", None)
        if sample is not None:
            if any(k in params for k in ("sampler", "temperature", "top_k", "top_p")):
                raise ConfigError("Pass either `sample` or `sampler`/`temperature`/`top_k`/`top_p`, not both.",
                                  param="sample")
            spec = attrs.evolve(spec, sampler=SamplerSpec.of(sample))
        return cls.from_spec(spec.with_params(params))

    @classmethod
    def from_spec(cls, spec: DecoderSpec) -> "Decoder":
        """The decoder a :class:`~refusion.config.spec.DecoderSpec` describes: the one way from a spec to a decoder.
        Every part parameter and option is checked, errors naming the parameter."""
        return cls(**spec.part_objects(), **spec.options())

    @property
    def spec(self) -> DecoderSpec:
        """This decoder as a :class:`~refusion.config.spec.DecoderSpec` (what records and traces store)."""
        return DecoderSpec.of(self)

    # -- checking ---------------------------------------------------------------
    def partition(self, gen_length: int, prompt_length: int = 0) -> Partition:
        """The partitioner's (checked) partition of ``gen_length`` tokens after a ``prompt_length``-token prompt."""
        p = self.partitioner
        return checked_partition(p, call_part(p, p.partition_after, prompt_length, gen_length), gen_length)

    def nearest_lengths(self, gen_length: int) -> tuple[int | None, int | None]:
        """The partitioner's nearest accepted lengths around ``gen_length`` (longest below, shortest above)."""
        p = self.partitioner
        found = call_part(p, p.nearest_lengths, max(1, gen_length))
        if not (isinstance(found, tuple) and len(found) == 2
                and all(n is None or (isinstance(n, int) and n >= 1) for n in found)):
            raise plugin_error(p, f"nearest_lengths({gen_length}) returned {found!r}; expected (below, above), each "
                               "an accepted length >= 1 or None.")
        return found

    def fit_length(self, gen_length: int) -> int:
        """The smallest generation length >= ``gen_length`` the partitioner accepts (for callers that may adjust it)."""
        above = self.nearest_lengths(gen_length)[1]
        if above is None:
            raise ConfigError(f"No generation length from {gen_length} on fits the partitioner {self.partitioner!r}.",
                              param="gen_length")
        return above

    def check_model(self, model: ModelAdapter) -> None:
        """Refuse a model that lacks a capability one of the parts requires."""
        caps = model.capabilities
        for part in (self.partitioner, self.selector, self.infiller, self.reorderer):
            for field, wanted in getattr(part, "requires", {}).items():
                if getattr(caps, field) != wanted:
                    raise ConfigError(
                        f"{part.kind} {part.name!r} needs a model with `{field}={wanted}`, but {type(model).__name__} "
                        f"has `{field}={getattr(caps, field)}` ({caps}). Pick another {part.kind}: see `refusion plugins`."
                    )

    def prepare(self, model: ModelAdapter, prompt_ids: Any, gen_length: int, *, seed: int | None = None) -> Prepared:
        """Check one prompt against the model and partition its generation region, once, before any work."""
        if isinstance(gen_length, bool) or not isinstance(gen_length, int) or gen_length < 1:
            raise ConfigError(f"`gen_length` must be an integer >= 1; got {gen_length!r}.", param='gen_length')
        if seed is not None:
            _check_seed(seed)
        prompt = check_prompt(prompt_ids, model)
        self.check_model(model)
        check_length(model, prompt.shape[0], gen_length, self)  # before any slot is built
        partition = self.partition(gen_length, prompt.shape[0])  # honours gen_length exactly (checked)
        return Prepared(prompt, partition, self.seed if seed is None else seed)

    # -- running -------------------------------------------------------------
    def start(self, model: ModelAdapter, engine: Any, prepared: Prepared) -> "DecodeSession":
        """Admit a prepared prompt into ``engine`` (a live :class:`~refusion.engines.base.Engine`) and set up its session."""
        state = engine.admit(prepared.prompt, prepared.partition.gen_length)
        if self.cfg_scale > 0:
            engine.guide(state, self.cfg_scale)
        return DecodeSession(self, model, state, prepared.partition, prepared.seed, engine=engine)

    def session(
        self, model: ModelAdapter, prompt_ids: Any, gen_length: int, *, engine: Any = None, seed: int | None = None
    ) -> "DecodeSession":
        """Validate the input and set up the decode of one prompt on its own engine (not started yet).

        ``engine``: an engine name, class or live instance (default: the
        decoder's ``engine``, else the best for the model); ``seed`` seeds the
        sampling generator (default: the decoder's ``seed``).
        """
        from refusion.engines import open_engine

        prepared = self.prepare(model, prompt_ids, gen_length, seed=seed)
        return self.start(model, open_engine(model, self, engine), prepared)

    def decode(self, model: ModelAdapter, prompt_ids: Any, gen_length: int, *, tokenizer: Any = None,
               engine: Any = None) -> DecodeResult:
        """Decode one prompt (token ids, shape ``(prompt_len,)`` or ``(1, prompt_len)``)."""
        return self.decode_batch(model, [prompt_ids], gen_length, tokenizer=tokenizer, engine=engine)[0]

    def decode_batch(
        self,
        model: ModelAdapter,
        prompts: Sequence[Any],
        gen_length: int,
        *,
        tokenizer: Any = None,
        seeds: Sequence[int] | None = None,
        engine: Any = None,
    ) -> list[DecodeResult]:
        """Decode several prompts (of any lengths) together; results come back in prompt order.

        Each prompt keeps its own slots, progress, stopping point and sampling
        generator (seeded by ``seeds[i]``, default: the decoder's ``seed``); a
        prompt's result is the same as decoding it alone (exactly in fp32/fp64;
        in bf16 the batch's padding can shift rounding and flip a close call).
        ``engine`` (name, class or live instance) overrides the decoder's.
        """
        from refusion.engines import drive, open_engine

        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not len(prompts):
            raise ConfigError("`prompts` must be a non-empty list of token-id sequences.", param='prompts')
        if seeds is not None:
            seeds = list(seeds)
            if len(seeds) != len(prompts) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**64
                                                     for x in seeds):
                raise ConfigError(f"`seeds` must hold one integer >= 0 per prompt ({len(prompts)}); got {seeds!r}.", param='seeds')
        prepared = [self.prepare(model, p, gen_length, seed=None if seeds is None else seeds[i])
                    for i, p in enumerate(prompts)]
        live = open_engine(model, self, engine)
        results = drive(live, [self.start(model, live, p) for p in prepared])
        return with_text(results, tokenizer if tokenizer is not None else getattr(model, "tokenizer", None))


def with_text(results: list[DecodeResult], tokenizer: Any) -> list[DecodeResult]:
    """The results with ``text`` decoded by ``tokenizer`` (unchanged without one)."""
    if tokenizer is None:
        return results
    return [attrs.evolve(r, text=tokenizer.decode(r.tokens.tolist(), skip_special_tokens=True)) for r in results]


def _check_stop(value: Any) -> None:
    if not isinstance(value, bool) and value != "block":
        raise ConfigError(f"`stop_at_eos` must be True, False or 'block'; got {value!r}.", param='stop_at_eos')


def _check_seed(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ConfigError(f"`seed` must be an integer in [0, 2**64); got {value!r}.", param='seed')


def _check_cfg_scale(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"`cfg_scale` must be a number >= 0 (0 = no guidance); got {value!r}.", param='cfg_scale')


def _check_engine(value: Any) -> None:
    if value is None:
        return
    from refusion.engines import engine_class

    engine_class(value)




class DecodeSession:
    """One prompt's decode: its engine state, output buffer, trace and program.

    :meth:`program` is the decode as a generator of model calls; :meth:`run`
    executes it on the session's engine. ``state`` is what the engine keeps
    for the sequence; ``cache`` (its committed context) stays inspectable
    afterwards.
    """

    def __init__(self, decoder: Decoder, model: ModelAdapter, state: Any, partition: Partition, seed: int = 0, *,
                 engine: Any = None):
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
        self.steps: list[StepRecord] = []
        self.generator = torch.Generator().manual_seed(seed)
        #: the infiller's memory for this sequence across iterations (InfillContext.memory)
        self.memory: dict = {}
        #: drafts are argmaxes: a plan's rows are projected only when read
        self.greedy = is_greedy(decoder.sample)
        self._eos_ids = torch.tensor(sorted(model.eos_token_ids), dtype=torch.long)

    @property
    def cache(self):
        """The sequence's committed context (a :class:`~refusion.cache.sequence.SequenceCache`)."""
        return self.state.context

    @property
    def forwards(self) -> int:
        """Model forwards that served this sequence so far (counted by the engine)."""
        return self.state.counters.forwards

    def sample(self, logits: Any, exclude: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's sampler, bound to this prompt's generator (Scores or logits)."""
        return apply_sampler(self.decoder.sample, logits, exclude, self.generator)

    def run(self) -> DecodeResult:
        """Run :meth:`program` to the end on the session's engine."""
        from refusion.engines import drive

        return drive(self.engine, [self])[0]

    def program(self) -> Generator[ModelCall, Any, DecodeResult]:
        d = self.decoder
        for block_index, block in enumerate(self.partition.blocks):
            open_slots = [self.partition.slots[i] for i in block if self.open[i]]
            if open_slots:
                start = self.prompt_len + open_slots[0].offset
                stop = self.prompt_len + open_slots[-1].stop
                reuse = call_part(d.reorderer, d.reorderer.start_block, start, stop)
                if reuse is not None and not isinstance(reuse, BlockReuse):
                    raise plugin_error(d.reorderer, f"start_block returned {reuse!r}; expected None or a BlockReuse.")
                self.state.start_block(start, stop, reuse)
            while True:
                remaining = [i for i in block if self.open[i]]
                if not remaining:
                    break
                before = self._snapshot()
                width = call_part(d.selector, d.selector.candidates, len(remaining))
                if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= len(remaining):
                    raise plugin_error(d.selector, f"candidates({len(remaining)}) returned {width!r}; expected an "
                                       f"integer in [1, {len(remaining)}].")
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
                plan = yield from self._plan(candidates, drafted)
                if drafted:  # the plan's forward encoded pending entries: what precedes the region is known now
                    ctx = attrs.evolve(ctx, last_scores=self.cache.last_scores)
                chosen = checked_selection(d.selector, plan, call_part(d.selector, d.selector.select, plan))
                if drafted and self.greedy:  # the chosen slots' drafts, projected with the other sequences'
                    rows = torch.cat([torch.arange(plan.offsets[i], plan.offsets[i + 1]) for i in chosen])
                    yield Projection(plan.scores, rows)
                budget = d.calls_per_token * sum(plan.slots[i].length for i in chosen) + 8
                program = call_part(d.infiller, d.infiller.infill, ctx, plan, chosen)
                result = yield from bounded(d.infiller, program, budget, self.model.vocab_size, self.model.max_positions)
                result = checked_result(
                    d.infiller, result, plan, chosen, self.model.eos_token_ids, self.model.mask_token_id, self.model.vocab_size
                )
                result = self._apply_eos(result)
                encoded = self.cache.encoded
                editor = self._reorder(result)
                self.steps.append(self._step_record(block_index, remaining, plan, chosen, result, before, encoded, editor))
            if d.stop_at_eos == "block" and self.eos_offset is not None:  # the block with the EOS is finished: stop
                self.open = [False] * len(self.open)
                break
        return self._result()

    def _plan(self, slots: tuple, drafted: bool) -> Generator[ModelCall, Any, Plan]:
        """Draft ``slots`` with one forward of masks (or, when nobody reads the drafts, without one)."""
        offsets = [0]
        for slot in slots:
            offsets.append(offsets[-1] + slot.length)
        first, last = slots[0].offset, slots[-1].stop
        if last - first == offsets[-1]:  # contiguous slots: one range
            positions = torch.arange(first, last) + self.prompt_len
        else:
            positions = torch.cat([torch.arange(s.offset, s.stop) for s in slots]) + self.prompt_len
        if not drafted:
            return Plan(slots, positions, None, tuple(offsets), self.generator, **self._where())
        masks = torch.full_like(positions, self.model.mask_token_id)
        reads = torch.as_tensor(offsets[:-1]) if self.decoder.selector.reads_scores else None  # the slot scores
        (out,) = yield ModelCall.of(Extend(Branch(), masks, positions, reads))
        draw = lambda scores: self._draw(scores, positions)  # noqa: E731
        drafts = Drafts(out.scores, draw, len(positions), lazy=self.greedy, exclude=self.model.mask_token_id)
        return Plan(slots, positions, out.scores, tuple(offsets), self.generator, drafts, **self._where())

    def _where(self) -> dict:
        """The plan's place in the decode, for schedule-driven selectors."""
        return dict(canvas_length=self.prompt_len + self.partition.gen_length,
                    num_blocks=len(self.partition.blocks), memory=self.memory)

    def _draw(self, scores: Any, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        canvas = self.prompt_len + self.partition.gen_length
        block = None
        if getattr(self.decoder.sample, "draws_block", False) and hasattr(self.model, "block_start"):
            start = self.model.block_start(int(positions[0]), self.prompt_len)
            block = (start, min(start + self.model.capabilities.block_length, canvas))
        return apply_sampler(self.decoder.sample, scores, self.model.mask_token_id, self.generator,
                             positions=positions, canvas_length=canvas, block=block)

    def _apply_eos(self, result: InfillResult) -> InfillResult:
        """Cut the answer at the earliest EOS: truncate its slot, drop every slot after it."""
        eos = self.model.eos_token_ids
        if not eos or self.decoder.stop_at_eos is False:
            return result
        every = torch.cat([c.tokens for c in result.commits]) if len(result.commits) > 1 else result.commits[0].tokens
        hits = torch.isin(every.cpu(), self._eos_ids)
        if not bool(hits.any()):
            return result
        first, start = None, 0
        for c in result.commits:
            found = hits[start : start + len(c.tokens)].nonzero()
            start += len(c.tokens)
            if len(found):
                offset = c.slot.offset + int(found[0])
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

    def _step_record(self, block: int, remaining: list, plan: Plan, chosen: Sequence[int], result: InfillResult,
                     before: tuple, encoded: int, editor: CacheEditor) -> StepRecord:
        """The iteration's :class:`StepRecord`: its decisions and what it cost since ``before`` (:meth:`_snapshot`)."""
        start, forwards, logged, copied, written, encoded_before = before
        c = self.state.counters
        scored = plan.drafted and self.decoder.selector.reads_scores
        return StepRecord(
            iteration=len(self.steps),
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
            kv_copied_bytes=c.kv_context_bytes - copied,
            kv_written_bytes=c.kv_new_bytes - written,
            seconds=time.perf_counter() - start,
        )

    def _reorder(self, result: InfillResult) -> CacheEditor:
        d = self.decoder
        expected = len(self.cache) + sum(c.tokens.shape[0] for c in result.commits)
        editor = CacheEditor(self.cache)
        call_part(d.reorderer, d.reorderer.reorder, editor, result)
        if len(self.cache) != expected:
            raise plugin_error(d.reorderer, f"left the cache with {len(self.cache)} entries; expected {expected}.")
        added = self.cache.positions[expected - sum(c.tokens.shape[0] for c in result.commits) :]
        committed = torch.cat([c.positions.cpu() for c in result.commits])
        if not torch.equal(torch.sort(added).values, torch.sort(committed).values):
            raise plugin_error(d.reorderer, "appended positions other than the committed ones; it must append each "
                               "committed token exactly once.")
        for c in result.commits:
            offset = c.slot.offset
            self.tokens[offset : offset + c.tokens.shape[0]] = c.tokens.cpu()
            self.commit_step[offset : offset + c.tokens.shape[0]] = len(self.steps)
            self.open[c.slot.index] = False
        return editor

    def _result(self) -> DecodeResult:
        if self.eos_offset is None and self.model.eos_token_ids:  # stop_at_eos off: cut at the first EOS now
            hits = torch.isin(self.tokens, torch.tensor(sorted(self.model.eos_token_ids))).nonzero()
            self.eos_offset = int(hits[0]) if len(hits) else None
        end = self.partition.gen_length if self.eos_offset is None else self.eos_offset + 1
        if bool((self.commit_step[:end] < 0).any()):  # pragma: no cover - guarded by the checks above
            raise RuntimeError("internal error: a position before the end of the answer was never committed")
        return DecodeResult(
            tokens=self.tokens[:end].clone(),
            prompt_length=self.prompt_len,
            partition=self.partition,
            commit_step=self.commit_step,
            forwards=self.forwards,
            steps=tuple(self.steps),
            stopped_at_eos=self.eos_offset is not None,
            extra={
                "all_tokens": [int(t) if s >= 0 else -1 for t, s in zip(self.tokens.tolist(), self.commit_step.tolist())],
                "engine": getattr(self.engine, "name", None),
                "fed_tokens": self.state.counters.fed_tokens,
                "kv_bytes": self.state.counters.kv_bytes,
            },
        )
