"""Data passed between the parts of the decoder.

All of it is immutable (``attrs`` frozen classes); classes holding tensors use
``eq=False``. Shapes are given as ``(n,)`` for flat per-token tensors.
Position ids are absolute (prompt tokens come first, from 0); a slot's
``offset`` counts from the start of the generation region.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from refusion.decoding.protocol import KVSegment
from refusion.decoding.scores import Scores
from refusion.dtypes import reduction_dtype


@attrs.frozen
class Slot:
    """A run of ``length`` generation positions, decoded as a unit.

    ``index`` is the slot's place in the partition (slots are numbered in
    position order), ``offset`` the index of its first token within the
    generation region, ``block`` the serial block it belongs to.
    """

    index: int
    offset: int
    length: int
    block: int

    @property
    def stop(self) -> int:
        """Offset one past the slot's last token."""
        return self.offset + self.length


@attrs.frozen
class Partition:
    """The generation region cut into slots, grouped into serial blocks.

    ``slots`` cover ``0:gen_length`` exactly once, in position order;
    ``blocks[b]`` lists the indices of the slots of block ``b``. Blocks are
    decoded left to right, the slots inside a block in any order.
    ``answer_length``: where the answer ends when the region was padded past
    it (a partitioner decoding the model's whole last block, as SDAR and
    LLaDA 2.x do): the padding is decoded, never returned
    (:func:`answer_end`); ``None``: the whole region is the answer.
    """

    gen_length: int
    slots: tuple[Slot, ...]
    blocks: tuple[tuple[int, ...], ...]
    answer_length: int | None = None


def answer_end(partition: Partition, eos_offset: int | None) -> tuple[int, bool]:
    """``(end, stopped_at_eos)``: where a decode's answer ends in its generation region, the one length rule of
    every decoder. The answer is the region's first ``partition.answer_length`` positions (the whole region when
    none is set), cut after the first EOS (``eos_offset``, a region offset, or ``None``) when that EOS lies inside
    it: the peers' own cut, ``x[:, prompt_length : prompt_length + gen_length]`` then the first EOS, however far
    their decode padded the region to the model's block grid."""
    length = partition.gen_length if partition.answer_length is None else partition.answer_length
    if eos_offset is not None and eos_offset < length:
        return eos_offset + 1, True
    return length, False


class Drafts:
    """Draft tokens and confidences of a plan's rows (a plan's private memo).

    With ``lazy`` (greedy drafting on Scores that hold hidden states) a row is
    projected to the vocabulary only when someone reads it, and rows read
    together are projected together; the statistics live in the Scores'
    cache (:func:`refusion.decoding.scores.project`), so rows projected in a batch
    with other sequences cost nothing more here. With ``rowwise`` (a sampler
    whose answer for a row depends on that row alone, e.g.
    :class:`~refusion.decoding.sampling.Greedy` in the authors' precision)
    ``draw`` is called on the rows read only, when read. Otherwise
    ``draw(scores)`` turns all rows into ``(tokens, confidence)`` at once, so
    that a sampler's random draws happen in one fixed order.
    """

    def __init__(
        self,
        scores: Scores | None,
        draw: Callable[[Scores], tuple[torch.Tensor, torch.Tensor]] | None,
        n: int,
        lazy: bool,
        exclude: int | None = None,
        rowwise: bool = False,
    ):
        self.scores, self.exclude = scores, exclude
        self.lazy = lazy and scores is not None and scores.batchable
        self.draw = draw if rowwise and not self.lazy and scores is not None else None
        self.tokens = self.confidence = None
        self._known: torch.Tensor | None = None  # rows drawn so far (rowwise)
        if scores is not None and not self.lazy and self.draw is None:
            tokens, confidence = draw(scores)
            self.tokens, self.confidence = tokens.cpu(), confidence.cpu()

    def rows(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, confidence)`` of ``index`` (a slice or index tensor), projecting the rows not known yet."""
        if self.scores is None:
            raise RuntimeError(
                "this plan was not drafted: its selector reads no scores and its infiller asked for no "
                "drafts (see SlotSelector.reads_scores and Infiller.needs_drafts)"
            )
        if self.draw is not None:
            return self._drawn(index)
        if not self.lazy:
            return self.tokens[index], self.confidence[index]
        cache = self.scores._cache
        if cache is None or cache.exclude != self.exclude or not cache.all_known(index):
            from refusion.decoding.scores import project

            project([(self.scores, index)], self.exclude)
            cache = self.scores._cache
        return cache.tokens[index], cache.prob[index]  # host tensors

    def _drawn(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Rowwise drafting: the rows of ``index`` not drawn yet, in one call, remembered."""
        n = len(self.scores)
        rows = torch.arange(n)[index] if not isinstance(index, torch.Tensor) else index.cpu()
        if self._known is None:
            self._known = torch.zeros(n, dtype=torch.bool)
        missing = rows[~self._known[rows]].unique()
        if len(missing):
            tokens, confidence = self.draw(self.scores[missing])
            if self.tokens is None:
                self.tokens = torch.zeros(n, dtype=torch.long)
                self.confidence = torch.zeros(n, dtype=confidence.dtype)
            self.tokens[missing], self.confidence[missing] = tokens.cpu(), confidence.cpu()
            self._known[missing] = True
        return self.tokens[rows], self.confidence[rows]


@attrs.frozen(eq=False)
class Plan:
    """The diffusion step's drafts for the still-masked slots of the current block.

    ``slots`` (k slots, position order) are laid out one after another in the
    flat tensors: slot ``i`` occupies rows ``offsets[i]:offsets[i+1]``.
    ``positions`` has shape ``(n,)``; ``scores`` (n rows,
    :class:`~refusion.decoding.scores.Scores`) is the model's output there.
    ``tokens`` (draft ids) and ``confidence`` (probability of each draft token)
    have shape ``(n,)`` and ``logits`` shape ``(n, vocab)``; all three are
    computed when first read, and :meth:`slot_tokens`, :meth:`first_confidence`
    compute only the rows they need. A plan drafts only the slots its selector
    may pick (:meth:`~refusion.strategies.base.SlotSelector.candidates`).
    ``generator`` is the prompt's random generator (seeded by the decoder's
    ``seed``), for selectors that draw at random. ``canvas_length`` (prompt
    plus generation region; 0 if unknown), ``num_blocks`` (serial blocks of
    the partition) and ``memory`` (a dict kept for the sequence across
    iterations; key it by your part's name) serve schedule-driven selectors.
    """

    slots: tuple[Slot, ...]
    positions: torch.Tensor
    scores: Scores | None
    offsets: tuple[int, ...]
    generator: torch.Generator | None = None
    _drafts: Drafts | None = attrs.field(default=None, repr=False)
    canvas_length: int = 0
    num_blocks: int = 1
    memory: dict = attrs.field(factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.slots)

    @classmethod
    def from_logits(
        cls,
        slots: tuple[Slot, ...],
        positions: torch.Tensor,
        logits: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> Plan:
        """A plan with greedy drafts from full logits ``(n, vocab)`` (for tests and hand-made plans)."""
        from refusion.decoding.sampling import greedy

        offsets = [0]
        for slot in slots:
            offsets.append(offsets[-1] + slot.length)
        scores = Scores(logits=logits)
        return cls(
            slots, positions, scores, tuple(offsets), generator, Drafts(scores, greedy, len(positions), lazy=False)
        )

    def rows(self, i: int) -> slice:
        """Rows of slot ``i`` in the flat tensors."""
        return slice(self.offsets[i], self.offsets[i + 1])

    @property
    def drafted(self) -> bool:
        """False when the decoder skipped the plan's forward (nobody needed its scores)."""
        return self.scores is not None

    def _table(self) -> Drafts:
        if self._drafts is None:
            raise RuntimeError("this plan has no drafts")
        return self._drafts

    @property
    def logits(self) -> torch.Tensor:
        """Full logits at every planned position, shape ``(n, vocab)`` (materialised on first use)."""
        if self.scores is None:
            self._table().rows(slice(0, 0))  # raises the explanation
        return self.scores.logits

    @property
    def tokens(self) -> torch.Tensor:
        """Draft token at every planned position, shape ``(n,)``."""
        return self._table().rows(slice(None))[0]

    @property
    def confidence(self) -> torch.Tensor:
        """Probability of each draft token, shape ``(n,)``."""
        return self._table().rows(slice(None))[1]

    def slot_tokens(self, i: int) -> torch.Tensor:
        """Draft tokens of slot ``i`` (computing only its rows)."""
        return self._table().rows(self.rows(i))[0]

    def slots_tokens(self, indices: Sequence[int]) -> torch.Tensor:
        """Draft tokens of the slots ``indices``, concatenated in that order (one projection for all)."""
        if len(indices) == 1:
            return self.slot_tokens(indices[0])
        rows = torch.cat([torch.arange(self.offsets[i], self.offsets[i + 1]) for i in indices])
        return self._table().rows(rows)[0]

    @functools.cached_property
    def first_rows(self) -> torch.Tensor:
        """Row of each slot's first token, shape ``(k,)``."""
        return torch.as_tensor(self.offsets[:-1], dtype=torch.long)

    @functools.cached_property
    def first_confidence(self) -> torch.Tensor:
        """Probability of each slot's first draft token (the paper's slot score), shape ``(k,)``."""
        return self._table().rows(self.first_rows)[1]

    @functools.cached_property
    def first_logits(self) -> torch.Tensor:
        """Logits at each slot's first token, shape ``(k, vocab)`` (only those rows are projected)."""
        if self.scores is None:
            self._table().rows(slice(0, 0))  # raises the explanation
        return self.scores[self.first_rows].logits

    @functools.cached_property
    def first_probs(self) -> torch.Tensor:
        """Softmax over the vocabulary at each slot's first token, shape ``(k, vocab)``."""
        logits = self.first_logits
        return torch.softmax(logits.to(reduction_dtype(logits.dtype)), dim=-1)

    @functools.cached_property
    def first_margin(self) -> torch.Tensor:
        """Top-1 minus top-2 probability at each slot's first token, shape ``(k,)``."""
        top = torch.topk(self.first_probs, k=min(2, self.first_probs.shape[-1]), dim=-1).values
        return top[:, 0] - (top[:, 1] if top.shape[1] > 1 else 0)

    @functools.cached_property
    def first_entropy(self) -> torch.Tensor:
        """Entropy (nats) of the distribution at each slot's first token, shape ``(k,)``."""
        p = self.first_probs
        return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


@attrs.frozen(eq=False)
class Commit:
    """A finished slot: its tokens, their position ids and (optionally) their keys/values.

    ``tokens`` and ``positions`` have shape ``(m,)`` with ``m == slot.length``,
    or fewer when the last token is an EOS. ``kv`` covers all ``m`` tokens or a
    prefix of them (the rest is re-encoded by the next forward). Consecutive
    commits with the same ``chain`` were computed one after the other (e.g.
    verified as one concatenation); different chains were computed
    independently against the same context.
    """

    slot: Slot
    tokens: torch.Tensor
    positions: torch.Tensor
    kv: KVSegment | None = None
    chain: int = 0


@attrs.frozen(eq=False)
class InfillResult:
    """What an infiller returns: the slots it finished, in commit order.

    ``next_logits`` is the model's output at the last committed token in commit
    order (logits of shape ``(vocab,)`` or one-row :class:`~refusion.decoding.scores.Scores`),
    when the infiller has it; with a causal model it predicts the token after it.
    """

    commits: tuple[Commit, ...] = attrs.field(converter=tuple)
    next_logits: torch.Tensor | Scores | None = None


def _measured(default: Any) -> Any:
    """A measurement: kept out of equality, so two decodes with the same decisions compare equal."""
    return attrs.field(default=default, eq=False)


@attrs.frozen
class IterationRecord:
    """One decoder iteration: which slots were planned, selected and committed, and what it cost.

    Built only when asked for (``record=True``, a trace, a benchmark): a plain
    decode keeps none (:attr:`DecodeResult.num_iterations` still counts them).

    ``planned`` are the open slots of the block, ``drafted`` those the plan
    drafted (the selector's candidates; empty when no plan forward ran),
    ``selected`` the selector's choice, ``committed`` ``(slot index, tokens
    kept)`` pairs in commit order. ``forwards`` counts the model forwards of
    this iteration (the first iteration's includes the prompt prefill).
    ``revised``: slots a reviser masked again (their tokens are decoded
    again) or replaced tokens of, after this iteration's commits (with a
    revising reviser ``committed`` means accepted, sealed when the block is
    finished).

    Measured, not compared by ``==``: ``confidence`` (first-token confidence
    of each drafted slot, when the selector read them; else empty),
    ``fed_tokens`` (query tokens of each forward), the cache entries
    committed with keys/values (``kv_appended``) and without (``kv_pending``,
    encoded by a later forward), pending entries this iteration's forwards
    encoded (``kv_encoded``: the prompt in the first iteration, re-encodes
    later), entries whose keys/values the reorderer dropped
    (``kv_invalidated``), bytes of cached keys/values copied again
    (``kv_copied_bytes``) and of new ones written (``kv_written_bytes``), and
    the iteration's wall time in ``seconds`` (in a batch, waits for the other
    sequences' calls included).
    """

    iteration: int
    block: int
    planned: tuple[int, ...]
    selected: tuple[int, ...]
    committed: tuple[tuple[int, int], ...]
    forwards: int
    drafted: tuple[int, ...] = ()
    revised: tuple[int, ...] = ()
    confidence: tuple[float, ...] = _measured(())
    fed_tokens: tuple[int, ...] = _measured(())
    kv_appended: int = _measured(0)
    kv_pending: int = _measured(0)
    kv_encoded: int = _measured(0)
    kv_invalidated: int = _measured(0)
    kv_copied_bytes: int = _measured(0)
    kv_written_bytes: int = _measured(0)
    seconds: float = _measured(0.0)


#: the former name of :class:`IterationRecord` (an iteration is not a forward "step")
StepRecord = IterationRecord


@attrs.frozen
class KVBytes:
    """Bytes of keys/values one sequence's decode moved: ``context`` copied again, ``new`` written once."""

    context: int = 0
    new: int = 0


@attrs.frozen(eq=False)
class DecodeResult:
    """The outcome of decoding one prompt.

    ``tokens``: generated ids in position order, up to and including the first
    EOS (shape ``(m,)``). ``commit_step``: for each position of the generation
    region, the iteration that committed it (-1 if never, e.g. after EOS).
    ``forwards``: model forwards run, prompt prefill included.
    ``tokens_per_forward``: ``len(tokens) / forwards``.

    ``num_iterations``: decoder iterations run; ``iterations``: their
    :class:`IterationRecord` s, only when the decode was asked to record them
    (``record=True`` or a trace), else empty. ``region_tokens``: every
    position of the generation region, -1 where nothing was committed (after
    an EOS). ``engine``: the engine's name; ``fed_tokens`` and ``kv_bytes``:
    what this sequence fed the network and the keys/values it moved;
    ``engine_totals``: the engine's counters for the whole run (every sequence
    decoded with it). A result read back from a trace also has ``decoder``
    (the trace header's decoder spec) and ``pieces`` (position -> token
    text). ``extra``: anything a plugin or tool adds.
    """

    tokens: torch.Tensor
    prompt_length: int
    partition: Partition
    commit_step: torch.Tensor
    forwards: int
    stopped_at_eos: bool
    num_iterations: int = 0
    iterations: tuple[IterationRecord, ...] = ()
    region_tokens: list[int] = attrs.field(factory=list)
    engine: str | None = None
    fed_tokens: int = 0
    kv_bytes: KVBytes = attrs.field(factory=KVBytes)
    engine_totals: dict[str, Any] | None = None
    decoder: dict[str, Any] | None = None
    pieces: dict[int, str] | None = None
    text: str | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)

    def region(self) -> list[int]:
        """Every position of the generation region: its token, -1 where nothing was committed."""
        if self.region_tokens:
            return self.region_tokens
        tokens = self.tokens.tolist()
        return tokens + [-1] * (self.partition.gen_length - len(tokens))

    @property
    def tokens_per_forward(self) -> float:
        return len(self.tokens) / max(self.forwards, 1)

    @property
    def steps(self) -> tuple[IterationRecord, ...]:
        """The former name of :attr:`iterations`: each iteration's record, only when the decode was asked to
        record them (``record=True`` or a trace), else empty (:attr:`num_iterations` still counts them)."""
        return self.iterations
