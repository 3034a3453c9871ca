"""The generic plan-and-infill decoder.

It composes a partitioner, a selector, an infiller and a cache reorderer, and
knows nothing about any of them beyond their interfaces. Per iteration of the
current serial block: draft the still-masked slots (the plan), let the
selector choose, let the infiller finish some of the chosen slots, apply EOS,
let the reorderer update the cache. Every iteration commits at least one slot,
so decoding ends after at most as many iterations as there are slots.

A decode is a *program*: a generator that yields the model calls it needs and
receives their outputs (:meth:`Decoder.program`). :meth:`Decoder.decode` runs
one program against the model; a batch engine can interleave many.
"""

from __future__ import annotations

from typing import Any, Generator, Sequence

import attrs
import torch

from refusion.cache.calls import Branch, Extend, ModelCall
from refusion.cache.executor import RepeatExecutor
from refusion.cache.sequence import SequenceCache
from refusion.cache.stores import DynamicStore
from refusion.checks import bounded, checked_partition, checked_result, checked_selection, plugin_error
from refusion.errors import ConfigError
from refusion.models.base import ModelAdapter
from refusion.sampling import Sampler, greedy
from refusion.state import Commit, DecodeResult, InfillResult, Partition, Plan, StepRecord
from refusion.validators import positive_int
from refusion.strategies.base import CacheReorderer, InfillContext, Infiller, SlotPartitioner, SlotSelector


def _part(kind: type):
    def check(instance, attribute, value):
        if not isinstance(value, kind):
            raise ConfigError(f"`{attribute.name}` must be a {kind.__name__} instance; got {value!r}.")

    return attrs.field(validator=check)


@attrs.frozen
class Decoder:
    """Plan-and-infill decoding with four interchangeable parts.

    ``sample`` turns logits into drafts (default: greedy; see
    :class:`~refusion.sampling.Sampling` for temperature, top-k and top-p);
    each prompt draws from its own generator seeded with ``seed``, so a decode
    is reproducible and the same alone or in a batch. ``calls_per_token``
    bounds an infiller's model calls per iteration (``calls_per_token`` x the
    chosen tokens, plus 8); an infiller that exceeds it is stopped with an
    error naming it. ``engine`` runs the model calls: ``"branch"`` (batched,
    parallel branches as attention masks over one preallocated cache) or
    ``"repeat"`` (the reference's way: a transformers ``DynamicCache`` per
    sequence, the context repeated once per branch, one sequence at a time);
    bidirectional models always run on the canvas executor. ``stop_at_eos``
    (default) drops every slot after a committed EOS (early stop); without it
    every position is decoded and the answer is cut at the first EOS at the end.
    """

    partitioner: SlotPartitioner = _part(SlotPartitioner)
    selector: SlotSelector = _part(SlotSelector)
    infiller: Infiller = _part(Infiller)
    reorderer: CacheReorderer = _part(CacheReorderer)
    sample: Sampler = greedy
    calls_per_token: int = attrs.field(default=4, validator=positive_int)
    engine: str = attrs.field(default="branch", validator=lambda i, a, v: _check_engine(v))
    stop_at_eos: bool = attrs.field(default=True, validator=lambda i, a, v: _check_bool(a.name, v))
    seed: int = attrs.field(default=0, validator=lambda i, a, v: _check_seed(v))

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
        ``token_threshold=``, ...) or, spelled ``"selector.k"``, to one part.
        The decoder's own options (``engine``, ``seed``, ``stop_at_eos``,
        ``calls_per_token``, ``sample``) and the sampling shorthands
        ``temperature``, ``top_k``, ``top_p`` are taken out first.
        """
        from refusion.config import build_parts
        from refusion.sampling import Sampling

        own = {k: params.pop(k) for k in DECODER_OPTIONS if k in params}
        shorthands = {k: params.pop(k) for k in ("temperature", "top_k", "top_p") if k in params}
        if shorthands:
            if "sample" in own:
                raise ConfigError("Pass either `sample` or `temperature`/`top_k`/`top_p`, not both.")
            own["sample"] = Sampling(**shorthands)
        parts = build_parts(partitioner=partitioner, selector=selector, infiller=infiller, reorderer=reorderer, params=params)
        return cls(**parts, **own)

    # -- running -------------------------------------------------------------
    def session(
        self, model: ModelAdapter, prompt_ids: Any, gen_length: int, *, store: Any = None, seed: int | None = None
    ) -> "DecodeSession":
        """Validate the input and set up the decode of one prompt (not started yet).

        ``store`` holds the sequence's keys/values (default: a
        :class:`~refusion.cache.stores.DynamicStore`, as the ``repeat`` engine uses);
        ``seed`` seeds its sampling generator (default: the decoder's ``seed``).
        """
        prompt = check_prompt(prompt_ids, model)
        partition = self.partition(gen_length)
        check_length(model, prompt.shape[0], partition.gen_length, self)
        self.check_model(model)
        cache = SequenceCache(store if store is not None else DynamicStore(model.new_cache()), prompt,
                              torch.arange(prompt.shape[0]))
        cache.canvas_stop = prompt.shape[0] + partition.gen_length
        cache.eos_fill = min(model.eos_token_ids) if model.eos_token_ids else None
        return DecodeSession(self, model, cache, partition, self.seed if seed is None else seed)

    def partition(self, gen_length: int) -> Partition:
        """The partitioner's (checked) partition of ``gen_length`` tokens."""
        p = self.partitioner
        return checked_partition(p, _call_part(p, p.partition, gen_length), gen_length)

    def fit_length(self, gen_length: int) -> int:
        """The smallest generation length >= ``gen_length`` the partitioner accepts, after its rounding."""
        for n in range(max(1, gen_length), max(1, gen_length) + 65536):
            try:
                return self.partition(n).gen_length
            except ConfigError:
                continue
        raise ConfigError(f"No generation length from {gen_length} on fits the partitioner {self.partitioner!r}.")

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

    def decode(self, model: ModelAdapter, prompt_ids: Any, gen_length: int, *, tokenizer: Any = None) -> DecodeResult:
        """Decode one prompt (token ids, shape ``(prompt_len,)`` or ``(1, prompt_len)``)."""
        return self.decode_batch(model, [prompt_ids], gen_length, tokenizer=tokenizer)[0]

    def decode_batch(
        self,
        model: ModelAdapter,
        prompts: Sequence[Any],
        gen_length: int,
        *,
        tokenizer: Any = None,
        seeds: Sequence[int] | None = None,
    ) -> list[DecodeResult]:
        """Decode several prompts (of any lengths) together; results come back in prompt order.

        Each prompt keeps its own slots, progress, stopping point and sampling
        generator (seeded by ``seeds[i]``, default: the decoder's ``seed``); a
        prompt's result is the same as decoding it alone (exactly in fp32/fp64;
        in bf16 the batch's padding can shift rounding and flip a close call).
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not len(prompts):
            raise ConfigError("`prompts` must be a non-empty list of token-id sequences.")
        if seeds is not None:
            seeds = list(seeds)
            if len(seeds) != len(prompts) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds):
                raise ConfigError(f"`seeds` must hold one integer >= 0 per prompt ({len(prompts)}); got {seeds!r}.")
        if not model.capabilities.causal:
            results = _run_canvas(self, model, prompts, gen_length, seeds)
        elif self.engine == "repeat" or not _states_kv_shape(model) or not _takes_custom_masks(model):
            results = [self.session(model, p, gen_length, seed=None if seeds is None else seeds[i]).run()
                       for i, p in enumerate(prompts)]
        else:
            results = _run_batched(self, model, prompts, gen_length, seeds)
        tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        if tok is not None:
            results = [attrs.evolve(r, text=tok.decode(r.tokens.tolist(), skip_special_tokens=True)) for r in results]
        return results


def _takes_custom_masks(model: ModelAdapter) -> bool:
    """The branch engine passes 4-D masks: only sdpa and eager attention apply them."""
    config = getattr(getattr(model, "model", None), "config", None)
    impl = getattr(config, "_attn_implementation", "sdpa") if config is not None else "sdpa"
    if impl in ("sdpa", "eager"):
        return True
    import warnings

    warnings.warn(f"attention implementation {impl!r} cannot apply custom 4-D masks; using the 'repeat' engine.",
                  stacklevel=3)
    return False


def _states_kv_shape(model: ModelAdapter) -> bool:
    try:
        model.kv_shape()
    except NotImplementedError:
        return False
    return True


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"`{name}` must be True or False; got {value!r}.")


def _check_seed(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"`seed` must be an integer >= 0; got {value!r}.")


def _check_engine(value: str) -> None:
    if value not in ENGINES:
        raise ConfigError(f"`engine` must be one of {', '.join(ENGINES)}; got {value!r}.")


ENGINES = ("branch", "repeat")
DECODER_OPTIONS = ("engine", "seed", "stop_at_eos", "calls_per_token", "sample")


def _run_batched(decoder: Decoder, model: ModelAdapter, prompts: Sequence[Any], gen_length: int,
                 seeds: Sequence[int] | None) -> list[DecodeResult]:
    """Run every prompt's program on one :class:`~refusion.cache.batched.BranchExecutor`."""
    from refusion.cache.batched import BranchExecutor
    from refusion.cache.stores import PreallocatedKV

    layers, heads, dim, dtype = model.kv_shape()
    region = decoder.partition(gen_length).gen_length
    capacity = max(len(check_prompt(p, model)) for p in prompts) + region
    buffer = PreallocatedKV(layers, len(prompts), heads, 2 * capacity + 64, dim, dtype=dtype, device=model.device)
    sessions = {i: decoder.session(model, p, gen_length, store=buffer.row(i), seed=None if seeds is None else seeds[i])
                for i, p in enumerate(prompts)}
    executor = BranchExecutor(model, buffer, {i: s.cache for i, s in sessions.items()})
    return _drive(sessions, executor)


def _run_canvas(decoder: Decoder, model: ModelAdapter, prompts: Sequence[Any], gen_length: int,
                seeds: Sequence[int] | None) -> list[DecodeResult]:
    """Run every prompt's program on a :class:`~refusion.cache.canvas.CanvasExecutor` (bidirectional models)."""
    from refusion.cache.canvas import CanvasExecutor

    sessions = {i: decoder.session(model, p, gen_length, seed=None if seeds is None else seeds[i])
                for i, p in enumerate(prompts)}
    return _drive(sessions, CanvasExecutor(model, {i: s.cache for i, s in sessions.items()}))


def _drive(sessions: dict[int, "DecodeSession"], executor: Any) -> list[DecodeResult]:
    """Step all programs together: each executor run answers one call of every live session."""
    results: dict[int, DecodeResult] = {}
    with torch.no_grad():
        programs = {i: s.program() for i, s in sessions.items()}
        calls = {i: next(p) for i, p in programs.items()}
        while calls:
            outputs = executor.run(calls)
            following = {}
            counts = getattr(executor, "last_counts", {})
            for i, out in outputs.items():
                sessions[i].forwards += counts.get(i, 1)
                try:
                    following[i] = programs[i].send(out)
                except StopIteration as stop:
                    results[i] = stop.value
            calls = following
    for r in results.values():  # the engine's totals, shared by the whole batch
        r.extra.update(batch_forwards=executor.forwards, batch_kv_bytes=executor.copies.as_dict())
    return [results[i] for i in range(len(sessions))]


def check_prompt(prompt_ids: Any, model: ModelAdapter) -> torch.Tensor:
    """The prompt as a 1-D LongTensor on the CPU; clear errors for anything else."""
    try:
        raw = torch.as_tensor(prompt_ids)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"`prompt_ids` must be a sequence of token ids; got {type(prompt_ids).__name__} ({exc}).") from exc
    if raw.numel() and (raw.is_floating_point() or raw.is_complex() or raw.dtype == torch.bool):
        raise ConfigError(f"`prompt_ids` must be integer token ids; got dtype {raw.dtype}.")
    prompt = raw.to(torch.long).cpu()
    if prompt.dim() == 2 and prompt.shape[0] == 1:
        prompt = prompt[0]
    if prompt.dim() != 1:
        raise ConfigError(f"`prompt_ids` must be one prompt of shape (prompt_len,); got shape {tuple(prompt.shape)}.")
    if prompt.shape[0] == 0:
        raise ConfigError("`prompt_ids` must hold at least one token; got an empty prompt.")
    if int(prompt.min()) < 0 or int(prompt.max()) >= model.vocab_size:
        raise ConfigError(f"`prompt_ids` must be token ids in [0, {model.vocab_size}); got {prompt.min()}..{prompt.max()}.")
    return prompt


def check_length(model: ModelAdapter, prompt_len: int, gen_length: int, decoder: "Decoder | None" = None) -> None:
    limit = model.max_positions
    if limit is not None and prompt_len + gen_length > limit:
        room, best = limit - prompt_len, None
        if decoder is not None:
            for n in range(room, 0, -1):  # the longest request that still fits after the partitioner's rounding
                try:
                    if decoder.partition(n).gen_length <= room:
                        best = n
                        break
                except ConfigError:
                    continue
        hint = f"use gen_length <= {best}" if best else "use a shorter prompt or a smaller slot/block size"
        raise ConfigError(
            f"`gen_length` ({gen_length} after rounding to whole slots/blocks) plus the prompt ({prompt_len} tokens) "
            f"exceeds the model's maximum of {limit} positions; {hint}."
        )


class DecodeSession:
    """One prompt's decode: its context cache, output buffer, trace and program.

    :meth:`program` is the decode as a generator of model calls; :meth:`run`
    executes it against the model. ``cache`` stays inspectable afterwards.
    """

    def __init__(self, decoder: Decoder, model: ModelAdapter, cache: SequenceCache, partition: Partition, seed: int = 0):
        self.decoder = decoder
        self.model = model
        self.cache = cache
        self.partition = partition
        self.prompt_len = len(cache)
        g = partition.gen_length
        self.tokens = torch.full((g,), model.mask_token_id, dtype=torch.long)
        self.commit_step = torch.full((g,), -1, dtype=torch.long)
        self.open = [True] * len(partition.slots)  # not yet committed nor dropped
        self.eos_offset: int | None = None
        self.steps: list[StepRecord] = []
        self.forwards = 0
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, exclude: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's sampler, bound to this prompt's generator."""
        return self.decoder.sample(logits, exclude=exclude, generator=self.generator)

    def run(self) -> DecodeResult:
        """Run :meth:`program` to the end, one model forward per call."""
        if not self.model.capabilities.causal:
            from refusion.cache.canvas import CanvasExecutor

            return _drive({0: self}, CanvasExecutor(self.model, {0: self.cache}))[0]
        executor = RepeatExecutor(self.model, self.cache)
        with torch.no_grad():
            program = self.program()
            call = next(program)
            while True:
                before = self.model.forwards
                outputs = executor.run(call)
                self.forwards += self.model.forwards - before
                try:
                    call = program.send(outputs)
                except StopIteration as stop:
                    ours, store = executor.copies, self.cache.store.copies
                    copies = {"context": ours.context + store.context, "new": ours.new + store.new}
                    return attrs.evolve(stop.value, extra={**stop.value.extra, "kv_bytes": copies})

    def program(self) -> Generator[ModelCall, Any, DecodeResult]:
        d = self.decoder
        for block_index, block in enumerate(self.partition.blocks):
            open_slots = [self.partition.slots[i] for i in block if self.open[i]]
            if open_slots:
                start = self.prompt_len + open_slots[0].offset
                _call_part(d.reorderer, d.reorderer.start_block, self.cache, start, self.prompt_len + open_slots[-1].stop)
            while True:
                remaining = [i for i in block if self.open[i]]
                if not remaining:
                    break
                forwards_before = self.forwards
                plan = yield from self._plan(remaining)
                chosen = checked_selection(d.selector, plan, _call_part(d.selector, d.selector.select, plan))
                ctx = InfillContext(
                    mask_token_id=self.model.mask_token_id,
                    eos_token_ids=self.model.eos_token_ids,
                    last_logits=self.cache.last_logits,
                    last_position=self.cache.last_position,
                    context_length=len(self.cache),
                    sampler=self.sample,
                )
                budget = d.calls_per_token * sum(plan.slots[i].length for i in chosen) + 8
                program = _call_part(d.infiller, d.infiller.infill, ctx, plan, chosen)
                result = yield from bounded(d.infiller, program, budget, self.model.vocab_size, self.model.max_positions)
                result = checked_result(
                    d.infiller, result, plan, chosen, self.model.eos_token_ids, self.model.mask_token_id, self.model.vocab_size
                )
                result = self._apply_eos(result)
                self._reorder(result)
                self.steps.append(
                    StepRecord(
                        iteration=len(self.steps),
                        block=block_index,
                        planned=tuple(remaining),
                        selected=tuple(plan.slots[i].index for i in chosen),
                        committed=tuple((c.slot.index, c.tokens.shape[0]) for c in result.commits),
                        forwards=self.forwards - forwards_before,
                    )
                )
        return self._result()

    def _plan(self, remaining: Sequence[int]) -> Generator[ModelCall, Any, Plan]:
        slots = tuple(self.partition.slots[i] for i in remaining)
        positions = torch.cat([torch.arange(s.offset, s.stop) for s in slots]) + self.prompt_len
        masks = torch.full_like(positions, self.model.mask_token_id)
        (out,) = yield ModelCall.of(Extend(Branch(), masks, positions))
        tokens, confidence = self.sample(out.logits, exclude=self.model.mask_token_id)
        offsets = [0]
        for s in slots:
            offsets.append(offsets[-1] + s.length)
        return Plan(slots, positions.to(tokens.device), out.logits, tokens, confidence, tuple(offsets), self.generator)

    def _apply_eos(self, result: InfillResult) -> InfillResult:
        """Cut the answer at the earliest EOS: truncate its slot, drop every slot after it."""
        eos = self.model.eos_token_ids
        if not eos or not self.decoder.stop_at_eos:
            return result
        first = None
        for c in result.commits:
            hits = torch.isin(c.tokens.cpu(), torch.tensor(sorted(eos))).nonzero()
            if len(hits):
                offset = c.slot.offset + int(hits[0])
                first = offset if first is None else min(first, offset)
        if first is None:
            return result
        self.eos_offset = first if self.eos_offset is None else min(self.eos_offset, first)
        self.cache.canvas_end = self.prompt_len + self.eos_offset + 1
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

    def _reorder(self, result: InfillResult) -> None:
        d = self.decoder
        expected = len(self.cache) + sum(c.tokens.shape[0] for c in result.commits)
        _call_part(d.reorderer, d.reorderer.reorder, self.cache, result)
        if len(self.cache) != expected:
            raise plugin_error(d.reorderer, f"left the cache with {len(self.cache)} entries; expected {expected}.")
        for c in result.commits:
            offset = c.slot.offset
            self.tokens[offset : offset + c.tokens.shape[0]] = c.tokens.cpu()
            self.commit_step[offset : offset + c.tokens.shape[0]] = len(self.steps)
            self.open[c.slot.index] = False

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
            extra={"all_tokens": [int(t) if s >= 0 else -1 for t, s in zip(self.tokens.tolist(), self.commit_step.tolist())]},
        )


def _call_part(part: Any, method: Any, *args: Any) -> Any:
    """Call a part's method; anything it raises becomes a PluginError naming it."""
    from refusion.errors import RefusionError

    try:
        return method(*args)
    except RefusionError:
        raise
    except Exception as exc:
        raise plugin_error(part, f"raised {type(exc).__name__}: {exc}") from exc
