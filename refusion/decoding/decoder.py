"""The generic plan-and-infill decoder.

It composes a partitioner, a selector, an infiller and a cache reorderer, and
knows nothing about any of them beyond their interfaces. Per iteration of the
current serial block: draft the still-masked slots (the plan), let the
selector choose, let the infiller finish some of the chosen slots, apply EOS,
let the reorderer update the cache. Every iteration commits at least one slot,
so decoding ends after at most as many iterations as there are slots.

A decode is a *program*: a generator that yields the model calls it needs and
receives their outputs (:meth:`~refusion.decoding.session.DecodeSession.program`). Engines
(:mod:`refusion.engines`) run them; :meth:`Decoder.decode_batch` runs a batch
to the end, :class:`refusion.batcher.Batcher` lets requests join and leave
a running engine.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

import attrs
import torch

from refusion.config.options import BY_NAME, decoder_option
from refusion.config.spec import DecoderSpec, SamplerSpec
from refusion.decoding.checks import (
    call_part,
    check_length,
    check_prompt,
    checked_partition,
    checked_post_fill_passes,
    checks_answers,
    plugin_error,
)
from refusion.decoding.sampling import Sampler, greedy
from refusion.decoding.session import DecodeSession
from refusion.decoding.types import DecodeResult, Partition
from refusion.errors import ConfigError
from refusion.models.base import ModelAdapter
from refusion.strategies.base import CacheReorderer, Infiller, Reviser, SlotPartitioner, SlotSelector
from refusion.strategies.revisers.none import NoReviser
from refusion.validators import check_integer, is_integer


def _part(kind: type, **kwargs: Any):
    def check(instance, attribute, value):
        if not isinstance(value, kind):
            raise ConfigError(
                f"`{attribute.name}` must be a {kind.__name__} instance; got {value!r}.", param=attribute.name
            )

    return attrs.field(validator=check, **kwargs)


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
    the best engine that can run the model (:func:`~refusion.engines.factory_engine`).
    ``stop_at_eos`` (default) drops every slot after a committed EOS (early
    stop); without it every position is decoded and the answer is cut at the
    first EOS at the end; ``"block"`` finishes the serial block in which an
    EOS was committed and stops there (SDAR's ``stopping_criteria_idx``).
    ``cfg_scale`` > 0 applies LLaDA's classifier-free guidance (a second forward with the prompt masked; see
    :meth:`~refusion.engines.base.Engine.guide`). ``batch_invariant=True``
    makes every prompt's tokens identical alone and in any batch, in every
    dtype (bf16 and fp16 included), at a cost: the engine runs each
    sequence's attention on its own and its matrix products in fixed row
    tiles where the backend needs them (:mod:`refusion.engines.invariant`,
    docs/batching.md).
    """

    partitioner: SlotPartitioner = _part(SlotPartitioner)
    selector: SlotSelector = _part(SlotSelector)
    infiller: Infiller = _part(Infiller)
    reorderer: CacheReorderer = _part(CacheReorderer)
    reviser: Reviser = _part(Reviser, factory=NoReviser)
    sample: Sampler = cast(Sampler, greedy)
    calls_per_token: int = decoder_option("calls_per_token")
    engine: Any = decoder_option("engine")
    stop_at_eos: bool | str = decoder_option("stop_at_eos")
    seed: int = decoder_option("seed")
    cfg_scale: float = decoder_option("cfg_scale")
    batch_invariant: bool = decoder_option("batch_invariant")

    def __attrs_post_init__(self) -> None:
        checked_post_fill_passes(self.reviser)  # a loop count: bounded (refusion.limits) before any decode

    @classmethod
    def from_names(
        cls,
        partitioner: Any = "fixed",
        selector: Any = "threshold",
        infiller: Any = "parallel-ar",
        reorderer: Any = "commit-order",
        reviser: Any = "none",
        **params: Any,
    ) -> Decoder:
        """Build parts from names, classes, ``"module:Class"`` strings or instances.

        ``params`` go to whichever part declares them (``slot_size=``,
        ``token_threshold=``, ...) or, spelled ``"selector.k"``, to one part;
        the decoder's own options (``engine``, ``seed``, ``stop_at_eos``,
        ``cfg_scale``, ``calls_per_token``, ``batch_invariant``), ``sampler`` and its ``temperature``,
        ``top_k``, ``top_p`` to the decoder (see :class:`~refusion.config.spec.DecoderSpec`,
        which this builds; ``sample=`` takes a ready-made sampler).
        """
        spec = DecoderSpec.of_parts(partitioner, selector, infiller, reorderer, reviser)
        sample = params.pop("sample", None)
        if sample is not None:
            if any(k in params for k in ("sampler", "temperature", "top_k", "top_p")):
                raise ConfigError(
                    "Pass either `sample` or `sampler`/`temperature`/`top_k`/`top_p`, not both.", param="sample"
                )
            spec = attrs.evolve(spec, sampler=SamplerSpec.of(sample))
        return cls.from_spec(spec.with_params(params))

    @classmethod
    def from_spec(cls, spec: DecoderSpec) -> Decoder:
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
        if not checks_answers(p):  # refusion's own partitioners are pure functions of their parameters
            return _builtin_partition(p, prompt_length, gen_length)
        return checked_partition(p, call_part(p, p.partition_after, prompt_length, gen_length), gen_length)

    def nearest_lengths(self, gen_length: int) -> tuple[int | None, int | None]:
        """The partitioner's nearest accepted lengths around ``gen_length`` (longest below, shortest above)."""
        p = self.partitioner
        found = call_part(p, p.nearest_lengths, max(1, gen_length))
        if not (
            isinstance(found, tuple)
            and len(found) == 2
            and all(n is None or (isinstance(n, int) and n >= 1) for n in found)
        ):
            raise plugin_error(
                p,
                f"nearest_lengths({gen_length}) returned {found!r}; expected (below, above), each "
                "an accepted length >= 1 or None.",
            )
        return found

    def fit_length(self, gen_length: int) -> int:
        """The smallest generation length >= ``gen_length`` the partitioner accepts (for callers that may adjust it)."""
        above = self.nearest_lengths(gen_length)[1]
        if above is None:
            raise ConfigError(
                f"No generation length from {gen_length} on fits the partitioner {self.partitioner!r}.",
                param="gen_length",
            )
        return above

    def check_model(self, model: ModelAdapter) -> None:
        """Refuse a model that lacks a capability one of the parts requires."""
        caps = model.capabilities
        if caps.denoiser:
            return self._check_denoiser(model)
        if self.reviser.revises and caps.causal:
            raise ConfigError(
                f"reviser {self.reviser.name!r} revises accepted tokens before they are cached, which needs a "
                f"bidirectional model (a masked diffusion or block-diffusion one); {type(model).__name__} is causal: "
                "use reviser 'none' (ReFusion seals every commit at once).",
                param="reviser",
            )
        for part in (self.partitioner, self.selector, self.infiller, self.reorderer, self.reviser):
            for field, wanted in getattr(part, "requires", {}).items():
                if getattr(caps, field) != wanted:
                    raise ConfigError(
                        f"{part.kind} {part.name!r} needs a model with `{field}={wanted}`, but {type(model).__name__} "
                        f"has `{field}={getattr(caps, field)}` ({caps}). Pick another {part.kind} (see `refusion "
                        f"plugins`), or a preset that runs on this model: {', '.join(presets_for(model))}.",
                        param=part.kind,
                    )
        self._check_pairing()

    def _check_pairing(self) -> None:
        """A reviser whose rule assumes a selector or one-token slots is refused with any other (it could mask
        again what the selector keeps accepting, and never finish a block)."""
        reviser = self.reviser
        if reviser.pairs_with is not None and self.selector.name != reviser.pairs_with:
            raise ConfigError(
                f"reviser {reviser.name!r} bounds what it masks again by what selector {reviser.pairs_with!r} "
                f"accepts; selector {self.selector.name!r} gives no such bound. Use selector {reviser.pairs_with!r} "
                "(or another reviser).",
                param="reviser",
            )
        slot_size = getattr(self.partitioner, "slot_size", 1)
        if reviser.token_slots and slot_size != 1:
            raise ConfigError(
                f"reviser {reviser.name!r} masks single tokens again: it needs one-token slots; the partitioner "
                f"has `slot_size` = {slot_size}. Use slot_size=1.",
                param="slot_size",
            )

    def _check_denoiser(self, model: ModelAdapter) -> None:
        """A canvas-denoising model decodes with the selector and the ``denoise`` infiller's options only
        (:mod:`refusion.decoding.denoising`): refuse what it cannot honour."""
        if getattr(self.infiller, "requires", {}).get("denoiser") is not True:
            raise ConfigError(
                f"infiller {self.infiller.name!r}: {type(model).__name__} denoises whole canvases; the loop's "
                "options (max_denoising_steps, t_min, t_max, stability_threshold, confidence_threshold, renoise) "
                "are the 'denoise' infiller's: use infiller 'denoise' (the diffusion-gemma preset's).",
                param="infiller",
            )
        if self.reviser.revises:
            raise ConfigError(
                f"reviser {self.reviser.name!r}: {type(model).__name__} re-decides every position of its canvas at "
                "each step already (non-accepted positions are re-noised); use reviser 'none'.",
                param="reviser",
            )
        if self.cfg_scale > 0:
            raise ConfigError(
                f"`cfg_scale` > 0: {type(model).__name__} has no mask token to hide the prompt with; use 0.",
                param="cfg_scale",
            )
        if self.selector.rescores:
            raise ConfigError(
                f"selector {self.selector.name!r} rescores each plan's logits (trait `rescores`); "
                f"{type(model).__name__} draws its canvas from the step's own logits, which a selector cannot "
                "change. Pick a rule that decides from one step's scores: entropy-bound, threshold, topk, margin, "
                "entropy, factor, random, leftmost (see `refusion plugins`).",
                param="selector",
            )
        for field, wanted in getattr(self.selector, "requires", {}).items():
            if getattr(model.capabilities, field) != wanted:
                raise ConfigError(
                    f"selector {self.selector.name!r} needs a model with `{field}={wanted}`; {type(model).__name__} "
                    "denoises canvases, re-deciding every position at each step (a schedule over shrinking masks "
                    "does not apply). Pick a rule that decides from one step's scores: entropy-bound, threshold, "
                    "topk, margin, entropy, factor, random, leftmost (see `refusion plugins`).",
                    param="selector",
                )

    def prepare(self, model: ModelAdapter, prompt_ids: Any, gen_length: int, *, seed: int | None = None) -> Prepared:
        """Check one prompt against the model and partition its generation region, once, before any work."""
        check_integer("gen_length", gen_length, 1)
        if seed is not None:
            BY_NAME["seed"].check(seed)
        prompt = check_prompt(prompt_ids, model)
        self.check_model(model)
        check_length(model, prompt.shape[0], gen_length, self)  # before any slot is built
        if model.capabilities.denoiser:  # the canvases are the model's: whole canvases, one slot per position
            partition = canvas_partition(model.capabilities.block_length, prompt.shape[0], gen_length)
        else:  # honours gen_length (checked; built-ins may pad)
            partition = self.partition(gen_length, prompt.shape[0])
        if partition.gen_length != gen_length:  # a built-in partitioner padded the region to the model's blocks
            check_length(model, prompt.shape[0], partition.gen_length)
        return Prepared(prompt, partition, self.seed if seed is None else seed)

    # -- running -------------------------------------------------------------
    def start(self, model: ModelAdapter, engine: Any, prepared: Prepared, *, record: bool = False) -> Any:
        """Admit a prepared prompt into ``engine`` (a live :class:`~refusion.engines.base.Engine`) and set up its
        session (``record``: keep an iteration record per iteration): a
        :class:`~refusion.decoding.session.DecodeSession`, or on a canvas-denoising model a
        :class:`~refusion.decoding.denoising.DenoisingSession`."""
        if self.batch_invariant:
            from refusion.engines.factory import check_invariance

            check_invariance(engine, True)
        state = engine.admit(prepared.prompt, prepared.partition.gen_length)
        try:
            if model.capabilities.denoiser:
                from refusion.decoding.denoising import DenoisingSession

                denoiser = cast(Any, model)  # a CanvasDenoiserLM (capabilities.denoiser)
                return DenoisingSession(
                    self, denoiser, state, prepared.partition, prepared.seed, engine=engine, record=record
                )
            if self.cfg_scale > 0:
                engine.guide(state, self.cfg_scale)
            return DecodeSession(self, model, state, prepared.partition, prepared.seed, engine=engine, record=record)
        except BaseException:
            engine.release(state)  # never started: what the engine holds for it (pages, reservations) is free again
            raise

    def session(
        self,
        model: ModelAdapter,
        prompt_ids: Any,
        gen_length: int,
        *,
        engine: Any = None,
        seed: int | None = None,
        record: bool = False,
    ) -> Any:
        """Validate the input and set up the decode of one prompt on its own engine (not started yet).

        ``engine``: an engine name, class or live instance (default: the
        decoder's ``engine``, else the best for the model); ``seed`` seeds the
        sampling generator (default: the decoder's ``seed``); ``record`` keeps
        an iteration record per iteration.
        """
        from refusion.engines import open_engine

        prepared = self.prepare(model, prompt_ids, gen_length, seed=seed)
        return self.start(model, open_engine(model, self, engine), prepared, record=record)

    def decode(
        self,
        model: ModelAdapter,
        prompt_ids: Any,
        gen_length: int,
        *,
        tokenizer: Any = None,
        engine: Any = None,
        record: bool = False,
    ) -> DecodeResult:
        """Decode one prompt (token ids, shape ``(prompt_len,)`` or ``(1, prompt_len)``)."""
        return self.decode_batch(model, [prompt_ids], gen_length, tokenizer=tokenizer, engine=engine, record=record)[0]

    def decode_batch(
        self,
        model: ModelAdapter,
        prompts: Sequence[Any],
        gen_length: int,
        *,
        tokenizer: Any = None,
        seeds: Sequence[int] | None = None,
        engine: Any = None,
        record: bool = False,
    ) -> list[DecodeResult]:
        """Decode several prompts (of any lengths) together; results come back in prompt order.

        Each prompt keeps its own slots, progress, stopping point and sampling
        generator (seeded by ``seeds[i]``, default: the decoder's ``seed``); a
        prompt's result is the same as decoding it alone (in fp32/fp64 up to
        last-bit rounding; in bf16/fp16 the batch's layout can shift rounding
        and flip a close call; with ``batch_invariant=True`` exactly, in every
        dtype: docs/batching.md).
        ``engine`` (name, class or live instance) overrides the decoder's;
        ``record`` keeps each result's iteration records (``DecodeResult.iterations``).
        """
        from refusion.engines.factory import lent_engine
        from refusion.scheduler import Ticket, decode_all

        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not len(prompts):
            raise ConfigError("`prompts` must be a non-empty list of token-id sequences.", param="prompts")
        if seeds is not None:
            seeds = list(seeds)
            if len(seeds) != len(prompts) or not all(is_integer(x) and 0 <= x < 2**64 for x in seeds):
                raise ConfigError(
                    f"`seeds` must hold one integer >= 0 per prompt ({len(prompts)}); got {seeds!r}.", param="seeds"
                )
        prepared = [
            self.prepare(model, p, gen_length, seed=None if seeds is None else seeds[i]) for i, p in enumerate(prompts)
        ]
        with lent_engine(model, self, engine) as live:
            results = decode_all(live, model, [Ticket(self, p, record=record) for p in prepared])
        return with_text(results, tokenizer if tokenizer is not None else getattr(model, "tokenizer", None))


def presets_for(model: ModelAdapter) -> list[str]:
    """The names of the presets whose parts run on ``model`` (every capability a part or the preset's peer function
    requires, the model has; a canvas-denoising model runs only presets made for it)."""
    from refusion.config.presets import PRESETS
    from refusion.peers import peer_function

    caps = model.capabilities
    fits = []
    for name, spec in PRESETS.items():
        peer = dict(peer_function(spec.peer).requires) if spec.peer else {}
        if caps.denoiser and not peer.get("denoiser"):  # its partitioner and infiller do not apply to canvases
            continue
        parts = spec.part_objects()
        if all(
            getattr(caps, field) == wanted
            for part in parts.values()
            for field, wanted in [*getattr(part, "requires", {}).items(), *peer.items()]
        ):
            fits.append(name)
    return fits


@functools.lru_cache(maxsize=1024)
def canvas_partition(canvas_length: int, prompt_length: int, gen_length: int) -> Partition:
    """A canvas-denoising model's partition: ``gen_length`` rounded up to whole canvases of ``canvas_length``
    from the region's start, one length-1 slot per position, one serial block per canvas; the answer is the
    whole canvases, as transformers' ``generate`` returns them."""
    from refusion.strategies.partitioners.semi_ar import SemiAutoregressive

    padded = SemiAutoregressive(block_length=canvas_length, pad=True).partition_after(prompt_length, gen_length)
    return attrs.evolve(padded, answer_length=None)


@functools.lru_cache(maxsize=1024)
def _builtin_partition(partitioner: SlotPartitioner, prompt_length: int, gen_length: int) -> Partition:
    """A built-in partitioner's partition, computed once per (partitioner, lengths)."""
    return call_part(partitioner, partitioner.partition_after, prompt_length, gen_length)


def with_text(results: list[DecodeResult], tokenizer: Any) -> list[DecodeResult]:
    """The results with ``text`` decoded by ``tokenizer`` (unchanged without one)."""
    if tokenizer is None:
        return results
    return [attrs.evolve(r, text=tokenizer.decode(r.tokens.tolist(), skip_special_tokens=True)) for r in results]
