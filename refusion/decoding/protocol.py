"""What strategies exchange with whatever runs the model: model calls, their outputs, keys/values.

An infiller never calls the model. It *yields* a :class:`ModelCall` and gets
back one :class:`ExtendOutput` per :class:`Extend`. Each extend feeds tokens
after the committed context plus a :class:`Branch` (tokens already accepted on
that branch, with their keys/values); the fed tokens attend causally to
themselves, their branch and the committed context, and to nothing else. How
the calls run (one forward for many sequences, a cache per sequence, a
bidirectional canvas) is the business of an engine (:mod:`refusion.engines`);
nothing here names one.

Branches are immutable: ``branch.extended(output, n)`` returns a new branch
that also holds the first ``n`` fed tokens of ``output``. A
:class:`KVSegment` carries the keys and values of a run of tokens for every
layer at once; it is what an infiller hands to a cache reorderer.
:class:`BlockReuse` is how a cache reorderer asks an engine to reuse
approximate keys/values within a block (Fast-dLLM's prefix and dual caches).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import attrs
import torch

from refusion.cache.segment import KVSegment
from refusion.decoding.scores import Scores


def _as_long_1d(name: str, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor) and value.dtype == torch.long and value.dim() == 1:
        return value
    raw = torch.as_tensor(value)
    if raw.numel() and (raw.is_floating_point() or raw.is_complex() or raw.dtype == torch.bool):
        raise ValueError(f"`{name}` must be integer ids; got dtype {raw.dtype}.")
    t = raw.to(torch.long)
    if t.dim() != 1:
        raise ValueError(f"`{name}` must be a 1-D sequence of ints; got shape {tuple(t.shape)}.")
    return t


@attrs.frozen(eq=False)
class Branch:
    """Tokens accepted after the committed context on one speculative branch.

    ``tokens`` and ``positions`` have shape ``(n,)``; ``kv`` holds their keys and
    values (``None`` when ``n == 0``). ``Branch()`` is the empty branch: an
    extend from it sees only the committed context.
    """

    tokens: torch.Tensor = attrs.field(factory=lambda: torch.empty(0, dtype=torch.long))
    positions: torch.Tensor = attrs.field(factory=lambda: torch.empty(0, dtype=torch.long))
    kv: KVSegment | None = None

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def extended(self, output: ExtendOutput, n: int) -> Branch:
        """This branch plus the first ``n`` tokens fed by ``output`` (which must extend this branch)."""
        parent = output.extend.parent
        if parent is not self and (len(parent) or len(self)):
            raise ValueError("`output` does not extend this branch")
        if not 0 <= n <= len(output.extend.tokens):
            raise ValueError(f"`n` must be in [0, {len(output.extend.tokens)}]; got {n}.")
        if n == 0:
            return self
        ext = output.extend
        return Branch(
            tokens=torch.cat((self.tokens, ext.tokens[:n].to(self.tokens.device))),
            positions=torch.cat((self.positions, ext.positions[:n].to(self.positions.device))),
            kv=KVSegment.cat((self.kv, output.kv[:n])),
        )


#: the empty branch (branches are immutable: one serves every extend from the committed context)
ROOT = Branch()


@attrs.frozen(eq=False)
class Extend:
    """Feed ``tokens`` at ``positions`` (both shape ``(q,)``) after ``parent``.

    ``reads`` (optional: a slice or index tensor over the fed tokens) names
    the rows whose argmax statistics the caller will read (``scores.greedy()``,
    ``scores.probability(...)``); they are then projected to the vocabulary
    together with the other sequences' rows in one LM-head pass. Rows not
    named are still available, computed on demand.

    ``verify`` (bidirectional models on the ``canvas`` engine only) also
    runs a *leave-one-out* row per fed position, in the same forward: a mask
    token at that position that sees the whole canvas except the token at its
    twin position (WINO's verification block). The output then has ``2q``
    rows: the fed positions', then their leave-one-out rows.
    """

    parent: Branch
    tokens: torch.Tensor = attrs.field(converter=lambda v: _as_long_1d("tokens", v))
    positions: torch.Tensor = attrs.field(converter=lambda v: _as_long_1d("positions", v))
    reads: slice | torch.Tensor | None = None
    verify: bool = False

    def __attrs_post_init__(self):
        if self.tokens.shape != self.positions.shape:
            raise ValueError(
                f"`tokens` and `positions` must have the same length; got {len(self.tokens)} and {len(self.positions)}."
            )
        if len(self.tokens) == 0:
            raise ValueError("`tokens` must not be empty.")


@attrs.frozen(eq=False)
class ModelCall:
    """One request to the model: several extends, run together as one forward."""

    extends: tuple[Extend, ...] = attrs.field(converter=tuple)

    def __attrs_post_init__(self):
        if not self.extends or not all(isinstance(e, Extend) for e in self.extends):
            raise ValueError("a ModelCall needs at least one Extend")

    @classmethod
    def of(cls, *extends: Extend) -> ModelCall:
        return cls(extends)


class Epoch:
    """Counts model calls; outputs of an earlier call may no longer read keys/values."""

    def __init__(self) -> None:
        self.value = 0


@attrs.frozen(eq=False)
class ExtendOutput:
    """The model's answer to one :class:`Extend`.

    ``scores`` (a :class:`~refusion.decoding.scores.Scores` of ``q`` rows) is the
    model's output at each fed token: ``scores.greedy()`` for the argmax and
    its probability, ``scores.probability(tokens)``, or ``logits`` (shape
    ``(q, vocab)``, materialised on first use). ``kv`` holds the fed tokens'
    keys and values; it can be read (or a branch extended with it) until the
    sequence's next model call, after which the engine may reuse the memory.
    """

    extend: Extend
    scores: Scores = attrs.field(converter=Scores.of)
    #: per-layer ``(keys, values)`` of shape (rows, heads, length, dim), one buffer tensor of shape
    #: (layers, 2, rows, heads, capacity, dim), or a reader whose ``entries(start, stop)`` gives
    #: (layers, 2, heads, n, dim) (a paged engine's row)
    _layers: Any = attrs.field(repr=False)
    _batch: int = attrs.field(repr=False)
    _start: int = attrs.field(repr=False)
    _epoch: Epoch | None = attrs.field(default=None, repr=False)
    _issued: int = attrs.field(default=0, repr=False)

    @property
    def logits(self) -> torch.Tensor:
        """Full logits at the fed tokens, shape ``(q, vocab)``."""
        return self.scores.logits

    @functools.cached_property
    def kv(self) -> KVSegment:
        if not isinstance(self._layers, torch.Tensor) and not self._layers:
            raise RuntimeError("this model call produced no reusable keys/values (bidirectional model)")
        if self._epoch is not None and self._epoch.value != self._issued:
            raise RuntimeError(
                "ExtendOutput.kv was read after a later model call; take the keys/values you need "
                "(e.g. branch.extended(output, n)) before yielding the next ModelCall."
            )
        stop = self._start + len(self.extend.tokens)
        if hasattr(self._layers, "entries"):  # a paged engine's row
            return KVSegment(self._layers.entries(self._start, stop))
        if isinstance(self._layers, torch.Tensor):  # an engine's buffer (layers, 2, rows, heads, capacity, dim)
            return KVSegment(self._layers[:, :, self._batch, :, self._start : stop].clone())
        return KVSegment.from_layers(self._layers, self._batch, self._start, stop)


@attrs.frozen(eq=False)
class Projection:
    """A request, yielded by the decoder's program, to project ``rows`` of ``scores`` to the vocabulary.

    The driver collects the requests of all live sequences and resolves them in
    one fused LM-head pass (:func:`refusion.decoding.scores.project`), then resumes each
    program with ``None``; the statistics are cached on ``scores``.
    """

    scores: Scores
    rows: slice | torch.Tensor


@attrs.frozen(eq=False)
class Selection:
    """A request, yielded by the decoder's program, for ``selector`` to choose among ``plan``'s slots.

    The driver collects the requests of all live sequences, calls each distinct
    selector's :meth:`~refusion.strategies.base.SlotSelector.choose` once with
    the plans of every sequence it decides for (:class:`~refusion.decoding.plans.Plans`),
    and resumes each program with its row's choice.
    """

    selector: Any
    plan: Any


@attrs.frozen(eq=False)
class Encode:
    """A canvas-denoising model's call (:mod:`refusion.models.denoiser`): run its causal encoder over ``tokens``
    (1-D ids: the prompt, then each finished canvas), appending them to the sequence's context.
    The engine answers with an empty tuple."""

    tokens: torch.Tensor


@attrs.frozen(eq=False)
class Denoise:
    """A canvas-denoising model's call: one denoiser pass over ``canvas`` (1-D ids, the model's canvas length)
    after the sequence's context, with the previous step's processed logits as ``self_conditioning``
    (``(canvas, vocab)``; ``None`` at a canvas's first step). The engine answers with ``(logits,)``:
    float32 ``(canvas, vocab)``."""

    canvas: torch.Tensor
    self_conditioning: torch.Tensor | None = None


@attrs.frozen
class BlockReuse:
    """A cache reorderer's request for one block: reuse keys/values computed outside it.

    ``mode="prefix"``: keys/values of every position before the block are
    computed once, at the block's first call, and reused by its later calls
    (Fast-dLLM's prefix cache, Wu et al., arXiv 2505.22618); ``mode="dual"``:
    the masked suffix after the block is kept as well (its dual cache). Both
    are approximations on a bidirectional model; an engine whose cache is
    exact has nothing to approximate and may ignore the request.

    On a model whose logits are shifted (Dream: position ``p`` is predicted
    at ``p - 1``) the reused prefix ends one position before the block by
    default (``prefix_at_block=False``), so that the block's first position
    is predicted from keys/values recomputed with the block. With
    ``prefix_at_block=True`` it ends at the block, as Fast-dLLM's Dream block
    decoder does (which decodes the block's first position from the block's
    first, full forward and never predicts it from the cache).

    ``mode="decoded"`` (dKV-Cache's delayed cache, Ma et al., arXiv 2505.15781): a decoded token's keys/values are
    computed once more in the forward after the one that decoded it (with the token in place) and reused from then
    on; masks are always recomputed. The block's first two calls and every ``reload_every``-th call after them
    feed the whole canvas (a refresh); the others feed only the positions that were still masks at the previous
    call and attend to the kept keys/values of the rest. Models with logit shift 0 only.

    ``mode="sub-block"`` (Fast-dLLM v2's two-level cache, Wu et al., arXiv 2509.26328; block-diffusion models, the
    ``block`` engine): the model's block is cut into sub-blocks of ``sub_block`` positions from its first one. A
    call whose wanted positions all lie in one sub-block whose first position holds a token, once a full forward
    of the block has kept the block's keys/values, feeds only that sub-block (its keys/values written over the
    kept ones) and attends to the whole kept block; any other call feeds the whole block and keeps its
    keys/values when the block's first position holds a token (a call that decides that position does not).

    ``mode="periodic"`` (d3LLM's delayed and periodically refreshed prefix cache, arXiv 2601.07568,
    ``generate_multi_block_kv_cache``; models with logit shift 0): the block is cut into chunks of ``chunk``
    positions from its first one, everything before the block being chunk 0. Walking the chunks in order from the
    kept prefix's end, a chunk with no mask left is *complete* from the call that first sees it so (chunk 0 from
    call 0, before the block's first; a chunk's clock starts only once every chunk before it is kept), and joins
    the kept prefix ``delay`` calls later; the walk stops at the first chunk that has a mask or is still waiting. A
    call that extends the kept prefix, or, once something is kept, one with no chunk waiting and a call number
    (from 1) not a multiple of ``reload_every``, feeds the columns from the kept prefix's end on and attends to the
    kept keys/values before it (those of the new chunks come from this call); every other call feeds the whole
    canvas (a refresh: the kept keys/values are rewritten by it). A mask before the kept prefix's end (a
    reviser's) moves the end back to its chunk. With ``chunk_causal=True`` the chunks attend block-causally
    (D2F's attention, arXiv 2508.09192): a position sees its own chunk and the chunks before it, chunk 0 itself
    only (positions after the block see the whole canvas); the kept prefix of finished chunks is then exact, and
    on a model with a logit shift of 1 its last position, whose output predicts the next one, is fed again with
    the positions after it.
    """

    mode: Literal["prefix", "dual", "decoded", "sub-block", "periodic"] = attrs.field(
        validator=attrs.validators.in_(("prefix", "dual", "decoded", "sub-block", "periodic"))
    )
    prefix_at_block: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    #: ``mode="decoded"`` and ``"periodic"``: the full forward's period within the block (see the class docstring)
    reload_every: int = attrs.field(default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)])
    #: ``mode="sub-block"``: the sub-block's length (see the class docstring)
    sub_block: int = attrs.field(default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)])
    #: ``mode="periodic"``: the chunk's length, and the calls a complete chunk waits before it is kept
    chunk: int = attrs.field(default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)])
    delay: int = attrs.field(default=0, validator=[attrs.validators.instance_of(int), attrs.validators.ge(0)])
    chunk_causal: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


__all__ = [
    "ROOT",
    "BlockReuse",
    "Branch",
    "Denoise",
    "Encode",
    "Epoch",
    "Extend",
    "ExtendOutput",
    "KVSegment",
    "ModelCall",
    "Projection",
]
