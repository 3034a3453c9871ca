"""The swappable parts of ReFusion decoding, and what they may rely on.

Each iteration of the decoder, for the current serial block:

1. the decoder drafts every still-masked slot (:class:`~refusion.decoding.types.Plan`);
2. a :class:`SlotSelector` picks the slots to infill now;
3. an :class:`Infiller` finishes some of them, asking the model for what it
   needs through yielded :class:`~refusion.decoding.protocol.ModelCall` s;
4. a :class:`Reviser` may re-mask or replace tokens accepted earlier in the
   block (WINO, LLaDA 2.1 editing); with the default ``none`` nothing is
   revisable and every commit is sealed at once;
5. a :class:`CacheReorderer` puts the sealed slots into the context cache.

Before decoding, a :class:`SlotPartitioner` cuts the generation region into
slots and serial blocks. Parts are small, stateless between calls and
configured by their (attrs) fields; each has a registry ``name``.
"""

from __future__ import annotations

import functools
import operator
from abc import ABC, abstractmethod
from collections.abc import Generator, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch

from refusion.decoding.context import CacheEditor
from refusion.decoding.plans import Plans
from refusion.decoding.protocol import ROOT, BlockReuse, Branch, Extend, ExtendOutput, ModelCall
from refusion.decoding.sampling import Sampler, greedy
from refusion.decoding.scores import Scores
from refusion.decoding.types import Commit, InfillResult, Partition, Plan, Slot

#: what :meth:`Infiller.infill` returns: a program (a Python generator) that yields model calls, receives their
#: outputs and returns the :class:`InfillResult`
InfillProgram = Generator[ModelCall, "tuple[ExtendOutput, ...]", InfillResult]
#: the former name of :data:`InfillProgram`
InfillGenerator = InfillProgram


class Part(ABC):
    """Base of every part: ``name`` is its registry key, ``kind`` its kind.

    ``requires`` names model capabilities the part depends on, as
    :class:`~refusion.models.base.ModelCapabilities` field -> value (e.g.
    ``{"causal": True}``); the decoder refuses a model that lacks them.

    ``traits`` are what a kind of part may declare about itself so that the decode loop can decide rows together
    (:mod:`refusion.decoding.forms`): trait name -> ``(default, methods)``. A declared trait speaks for the methods
    named beside it: a subclass that overrides one of them without declaring the trait again in its own class body
    gets the default back (it runs per sequence until its author says otherwise). The loop never asks which class a
    part is, only its traits.
    """

    name: ClassVar[str]
    kind: ClassVar[str]
    requires: ClassVar[dict[str, object]] = {}
    traits: ClassVar[dict[str, tuple[Any, tuple[str, ...]]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for trait, (default, methods) in cls.traits.items():
            if trait not in cls.__dict__ and any(method in cls.__dict__ for method in methods):
                setattr(cls, trait, default)


class SlotPartitioner(Part):
    """Cuts the generation region into slots and serial blocks."""

    kind = "partitioner"

    @abstractmethod
    def partition(self, gen_length: int) -> Partition:
        """Receive the requested generation length (>= 1); return a :class:`Partition`.

        The partition must honour ``gen_length`` exactly
        (``Partition.gen_length == gen_length``; a last slot or block may be
        shorter); its slots must cover ``0:gen_length`` once, in position
        order. Raise :class:`~refusion.errors.ConfigError` for a length that
        does not fit the part's parameters, naming the nearest lengths that do.
        """

    def nearest_lengths(self, gen_length: int) -> tuple[int | None, int | None]:
        """``(below, above)``: the longest accepted length <= ``gen_length`` and the shortest >= it (``None``
        where there is none; both are ``gen_length`` when it is accepted).

        The default asks :meth:`partition` (lengths down to 1, and up to
        ``gen_length + 4096``); a partitioner that knows its accepted lengths
        overrides it with the answer.
        """
        from refusion.errors import ConfigError

        def accepted(n: int) -> bool:
            try:
                self.partition(n)
            except ConfigError:
                return False
            return True

        below = next((n for n in range(gen_length, 0, -1) if accepted(n)), None)
        above = (
            gen_length
            if below == gen_length
            else next((n for n in range(gen_length + 1, gen_length + 4097) if accepted(n)), None)
        )
        return below, above

    def partition_after(self, prompt_length: int, gen_length: int) -> Partition:
        """The partition of a region that starts at absolute position ``prompt_length`` (the decoder calls this).

        Same contract as :meth:`partition`. The default ignores where the
        region starts; a partitioner whose blocks follow a model's absolute
        block grid (``semi-ar`` with ``align="absolute"``) overrides it, and
        with ``pad=True`` (SDAR's rule, built-in only) returns a region grown
        to the end of the model block that holds its last position.
        """
        return self.partition(gen_length)


class SlotSelector(Part):
    """Chooses which drafted slots to infill in this iteration."""

    kind = "selector"
    traits = {
        "leftmost_only": (False, ("candidates", "candidates_at", "select", "choose")),
        "rescores": (False, ("rescore",)),
    }

    #: False when :meth:`select` never reads the plan's scores, tokens or confidences (then the
    #: decoder may skip the plan's forward when the infiller needs no drafts either).
    reads_scores: ClassVar[bool] = True
    #: True when :meth:`candidates` is always 1, so every choice is the block's leftmost open slot (``leftmost``):
    #: a batched infiller may then decide without a plan (a trait, see :class:`Part`)
    leftmost_only: ClassVar[bool] = False
    #: True when :meth:`rescore` changes the plan's logits before its drafts are drawn (a selector with memory:
    #: ``credit``); such a plan's rows then run through the per-sequence adapter (a trait, see :class:`Part`)
    rescores: ClassVar[bool] = False

    def rescore(self, plan: Plan, logits: torch.Tensor) -> torch.Tensor:
        """Receive a plan before its drafts are drawn (``plan.scores`` the model's, ``plan.memory`` the row's state
        kept across iterations) and its logits ``(n, vocab)``, one row per planned position; return the logits the
        drafts and confidences are drawn from, of the same shape (any float dtype).

        Called once per plan, only when the class declares ``rescores = True``; must not modify ``logits`` in
        place. This is where a selector with memory fuses what it kept from earlier iterations (CreditDecoding's
        credit) into the current step. Default: ``logits`` unchanged.
        """
        return logits

    @abstractmethod
    def select(self, plan: Plan) -> Sequence[int]:
        """Receive the plan of the current block; return indices into ``plan.slots``.

        At least one index, no duplicates, each in ``range(len(plan))``; order
        does not matter (the decoder sorts them by position). Must not modify
        the plan's tensors. Where scores tie, the built-in selectors take the
        lowest position first (a stable sort); plugins should too.
        """

    def choose(self, plans: Plans) -> list[Sequence[int]]:
        """Receive the plans of every sequence this selector decides for in this engine step (one row each);
        return each row's choice, as :meth:`select` would return it for that row's plan.

        The batched form: read ``plans``' stacked ``(rows, width)`` views
        (``first_confidence``, ``first_margin``, ``first_entropy``, ``valid``)
        with tensor operations over the group. Must give every row what
        :meth:`select` gives it alone (the decoder calls ``choose`` whatever
        the batch). Default: :meth:`select` row by row (a per-sequence
        selector needs nothing more).
        """
        return [self.select(plan) for plan in plans]

    def candidates(self, remaining: int) -> int:
        """How many of the block's ``remaining`` masked slots, leftmost first, :meth:`select` may pick.

        The plan drafts only those (a plan's logits at a slot do not depend on
        the masked slots after it, so this changes no draft). Default: all;
        ``leftmost``: 1. Must return an integer in ``[1, remaining]``.
        """
        return remaining

    def candidates_at(self, positions: Sequence[int]) -> int:
        """How many of the block's masked slots, leftmost first, :meth:`select` may pick, given the absolute position
        of each one's first token (``positions``, ascending; the block's open slots).

        For a rule that depends on where the slots are (Fast-dLLM v2's
        sub-blocks). Same contract as :meth:`candidates`, which it calls by
        default. Must return an integer in ``[1, len(positions)]``.
        """
        return self.candidates(len(positions))


@attrs.frozen(eq=False)
class InfillContext:
    """What an infiller may use besides the plan.

    ``last_scores`` (one-row :class:`~refusion.decoding.scores.Scores`) is the model's
    output at the last context token in cache order, whose position id is
    ``last_position``; with a causal model it predicts position
    ``last_position + 1``. ``None`` when unknown (e.g. that token was committed
    without keys/values and is re-encoded by the next call); ``last_logits``
    is the same as a ``(vocab,)`` logits tensor. ``sampler`` is the decoder's
    sampler; use :meth:`sample`, which never drafts the mask token.
    ``memory`` is a dict kept for this sequence across iterations, for
    infillers that adapt (e.g. a speculation window); key it by your part's
    name. ``region_start`` is the position id of the generation region's
    first token (a slot's positions start at ``region_start + slot.offset``).
    """

    mask_token_id: int
    eos_token_ids: frozenset[int]
    last_scores: Scores | None
    last_position: int
    context_length: int
    sampler: Sampler = greedy
    memory: dict = attrs.field(factory=dict)
    region_start: int = 0

    @property
    def last_logits(self) -> torch.Tensor | None:
        return None if self.last_scores is None else self.last_scores.logits[0]

    def sample(self, logits: torch.Tensor | Scores) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft tokens and their probabilities from Scores (or logits of shape ``(n, vocab)``)."""
        return self.sampler(logits, exclude=self.mask_token_id)

    @property
    def root(self) -> Branch:
        """The empty branch: extends from it see the committed context only."""
        return ROOT

    def extend(self, tokens, positions, parent: Branch | None = None, *, reads=None) -> Extend:
        """An :class:`Extend` of ``parent`` (default: the committed context); ``reads``: see :class:`Extend`."""
        return Extend(parent if parent is not None else ROOT, tokens, positions, reads)

    def is_eos(self, tokens: torch.Tensor) -> torch.Tensor:
        """Boolean tensor, True where ``tokens`` is an EOS id."""
        if not self.eos_token_ids:
            return torch.zeros_like(tokens, dtype=torch.bool)
        if len(self.eos_token_ids) == 1:
            return tokens == next(iter(self.eos_token_ids))
        return torch.isin(tokens, _id_tensor(self.eos_token_ids).to(tokens.device))


@functools.lru_cache(maxsize=64)
def _id_tensor(ids: frozenset[int]) -> torch.Tensor:
    """The sorted ``ids`` as a tensor (made once per set)."""
    return torch.tensor(sorted(ids), dtype=torch.long)


class Infiller(Part):
    """Finishes chosen slots, verifying drafts with the model.

    ``batched`` (a trait, see :class:`Part`) names this infiller's batched form: a
    :class:`~refusion.decoding.forms.base.BatchedForm` subclass (or its ``"module:Class"`` path) that decides the
    rows of every decoder it accepts together, with tensor operations and one forward for all; ``None``: each row
    runs :meth:`infill` as its own program (the per-sequence adapter, on the same forwards).
    """

    kind = "infiller"
    traits = {"batched": (None, ("infill", "needs_drafts"))}
    batched: ClassVar[Any] = None

    @abstractmethod
    def infill(self, ctx: InfillContext, plan: Plan, chosen: tuple[int, ...]) -> InfillGenerator:
        """A generator: yield :class:`ModelCall` s, receive their outputs, return an :class:`InfillResult`.

        Receives the plan and the selected slot indices (sorted by position).
        Must return at least one :class:`Commit`, each for a distinct chosen
        slot, holding the slot's full token run (or a prefix ending in EOS) at
        the slot's own positions. May not touch the context cache; the number
        of model calls it may make is bounded by the decoder.
        """

    def needs_drafts(self, ctx: InfillContext, slots: tuple[Slot, ...]) -> bool:
        """Whether :meth:`infill` will read the plan's drafts for these candidate ``slots``; default: yes.

        When neither this nor the selector (``reads_scores``) needs the plan,
        the decoder skips the plan's forward and passes an undrafted plan.
        """
        return True


class CacheReorderer(Part):
    """Places committed slots into the context cache.

    ``commit_order`` (a trait, see :class:`Part`): True when :meth:`reorder` appends every commit with the
    infiller's keys/values right after the context, in commit order, and :meth:`start_block` asks for nothing
    (``commit-order``): a batched infiller may then keep the cache itself.
    """

    kind = "reorderer"
    traits = {"commit_order": (False, ("reorder", "start_block"))}
    commit_order: ClassVar[bool] = False

    @abstractmethod
    def reorder(self, cache: CacheEditor, result: InfillResult) -> None:
        """Receive the sequence's context (a :class:`~refusion.decoding.context.CacheEditor`) and the iteration's
        commits.

        EOS is already applied to ``result``. Must append every committed
        token exactly once (``cache.append``, in any order, with or without
        the infiller's keys/values); may drop keys/values of earlier entries
        (``cache.invalidate``) to have them re-encoded by the next model call.
        These two calls are all the editor offers; the decoder checks
        afterwards that exactly the committed positions were appended.
        """

    def start_block(self, start: int, stop: int) -> BlockReuse | None:
        """Serial block ``start:stop`` (absolute positions) begins; return a cache request for it, or ``None``.

        A cache policy (e.g. Fast-dLLM's prefix/dual cache) returns a
        :class:`~refusion.decoding.protocol.BlockReuse`; the engine then keeps what it
        asks for during the block. Must not touch anything. Default: ``None``.
        """
        return None


@attrs.frozen(eq=False)
class RevisionView:
    """The open block's accepted, not yet sealed tokens after an iteration's commits (what a reviser reads).

    ``offsets`` (shape ``(n,)``, region offsets in position order) and
    ``tokens`` are those tokens; ``accepted_now`` marks the ones this
    iteration accepted. ``verified`` (float64, ``(n,)``) is each token's
    probability under its leave-one-out row of this iteration's plan forward,
    computed before this iteration's acceptances (so ``NaN`` where
    ``accepted_now``); ``None`` unless the reviser :attr:`~Reviser.verifies`.
    ``masked`` counts the block's positions still masked; ``block`` is the
    serial block's index, ``block_start``/``block_stop`` its region offsets;
    ``memory`` is this sequence's scratch space for the block (emptied when
    a block starts). ``predicted`` (long, ``(n,)``) and
    ``predicted_probability`` (float32, ``(n,)``) are the argmax of this
    iteration's forward at each of these positions (which saw the token
    there) and its probability (with a sampler: the step's draw there, from
    the same draw over the block as the plan's drafts); ``None`` unless the reviser
    :attr:`~Reviser.predicts`. ``post_fill`` counts the edit-only passes
    this block had after its last mask was filled (0 before);
    ``mask_token_id`` is the model's. Read-only except ``memory``.
    """

    offsets: torch.Tensor
    tokens: torch.Tensor
    accepted_now: torch.Tensor
    verified: torch.Tensor | None
    masked: int
    block: int
    block_start: int
    block_stop: int
    memory: dict = attrs.field(factory=dict)
    predicted: torch.Tensor | None = None
    predicted_probability: torch.Tensor | None = None
    post_fill: int = 0
    mask_token_id: int = -1


def _integer(value: Any, what: str) -> int:
    """``value`` as an int if it is an integer (Python, NumPy, a 0-d integer tensor); ``5.7``, ``'7'`` and
    ``True`` raise TypeError (the decoder reports it as the reviser's error)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{what} must be integers; got {value!r:.60}")


def _offsets(value: Any) -> tuple[int, ...]:
    return tuple(_integer(x, "Revision.remask offsets") for x in value)


def _replacements(value: Any) -> dict[int, int]:
    return {_integer(k, "Revision.replace offsets"): _integer(t, "Revision.replace tokens") for k, t in value.items()}


@attrs.frozen
class Revision:
    """A reviser's answer: region offsets to mask again (``remask``) and tokens to put instead of the accepted
    ones (``replace``: offset -> token id). Both may name only offsets of the view; re-masked slots are decoded
    again, replaced tokens stay accepted. Offsets and tokens are integers: a float, text or a bool raises
    TypeError (never rounded or read as 0/1)."""

    remask: tuple[int, ...] = attrs.field(default=(), converter=_offsets)
    replace: Mapping[int, int] = attrs.field(factory=dict, converter=_replacements)

    def __bool__(self) -> bool:
        return bool(self.remask or self.replace)


class Reviser(Part):
    """Revises accepted tokens of the open block before they are sealed into the cache.

    With a reviser that :attr:`revises`, a block's accepted tokens stay
    revisable until no position of the block is masked and an iteration ends
    without a revision (plus up to :attr:`post_fill_passes` edit-only passes):
    then the whole block is sealed (EOS applied, the reorderer called once).
    The default ``none`` revises nothing and seals every commit at once
    (ReFusion's cache reuse, unchanged).
    """

    kind = "reviser"
    traits = {"revises": (True, ("revise",))}
    #: False only for ``none``: commits are sealed at once
    revises: ClassVar[bool] = True
    #: the plan's forward also runs a leave-one-out row per position of the open block (``Extend.verify``; the
    #: ``canvas`` engine), and :attr:`RevisionView.verified` holds each accepted token's probability under it
    verifies: ClassVar[bool] = False
    #: :attr:`RevisionView.predicted` and ``predicted_probability`` hold the forward's argmax at each accepted position
    predicts: ClassVar[bool] = False
    #: the selector whose acceptances the rule assumes (``None``: any), and whether it needs one-token slots; a
    #: decoder pairing it otherwise is refused before any work (the rule's progress guarantee would not hold)
    pairs_with: ClassVar[str | None] = None
    token_slots: ClassVar[bool] = False

    @property
    def post_fill_passes(self) -> int:
        """Edit-only passes a block may get once its last mask is filled: each runs one forward over the block
        and calls :meth:`revise` with nothing accepted now; the block is sealed after a pass that revises
        nothing, or after this many (default 0: sealed as soon as no mask is left and an iteration revised
        nothing). An integer in ``[0, MAX_POST_FILL_PASSES]`` (:mod:`refusion.limits`), the same for the
        reviser's whole life: a decoder refuses another value when it is built (a ConfigError naming
        ``post_fill_passes`` when it is the reviser's own parameter, else a PluginError)."""
        return 0

    @abstractmethod
    def revise(self, view: RevisionView) -> Revision | None:
        """Receive the open block's accepted tokens after this iteration's commits; return what to re-mask or
        replace (``None`` or an empty :class:`Revision`: nothing). Must not touch ``view`` except its ``memory``.
        Decoding still terminates: a block is revised at most ``calls_per_token`` times its length."""


__all__ = [
    "BlockReuse",
    "Branch",
    "CacheEditor",
    "CacheReorderer",
    "Commit",
    "Extend",
    "ExtendOutput",
    "InfillContext",
    "InfillGenerator",
    "InfillProgram",
    "InfillResult",
    "Infiller",
    "ModelCall",
    "Partition",
    "Plan",
    "Plans",
    "Part",
    "Reviser",
    "Revision",
    "RevisionView",
    "Slot",
    "SlotPartitioner",
    "SlotSelector",
]
