"""The model protocol: what the decoder needs from a diffusion language model.

A :class:`ModelAdapter` wraps a network and states what it can do
(:class:`ModelCapabilities`). The decoder and the strategies never touch the
network directly: they go through :meth:`ModelAdapter.forward`, which also
counts model forwards so that no strategy can misreport its cost.

Threads: one loaded model may be used by several threads and generators at
once. Every forward runs while holding :func:`exclusive` (one lock per
network, shared by every adapter that wraps it), and so does anything that
changes the network's state for a forward (the branch engine's attention
switch); a decode's own state lives in its engine and session. So forwards of
one model run one at a time, and every thread gets the tokens it would get
alone.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import attrs
import torch

from refusion.decoding.scores import Scores


@attrs.frozen
class ModelCapabilities:
    """What a model can do.

    ``causal``: a token attends only to earlier tokens (ReFusion, AR models).
    ``logit_shift``: 0 if the logits at a mask predict that position (ReFusion,
    LLaDA), 1 if they predict the next position (Dream).
    ``kv_cache``: keys/values of committed tokens can be cached and reused.
    ``block_length``: for block-diffusion models (SDAR, Fast-dLLM v2,
    LLaDA2-style), the length of the blocks inside which attention is
    bidirectional (causal across blocks); 0 for every other model.
    ``denoiser``: the model re-decides a whole canvas (of ``block_length``)
    per pass from noise, with a separate denoiser over an encoder's cache
    (DiffusionGemma; :mod:`refusion.models.denoiser`); decoded by the
    canvas-denoising loop (:mod:`refusion.decoding.denoising`), not by
    plan-and-infill.
    """

    causal: bool = True
    logit_shift: int = 0
    kv_cache: bool = True
    block_length: int = 0
    denoiser: bool = False


class AtLeast:
    """A part's requirement on an integer capability: any value ``>= least`` (``requires = {"block_length":
    AtLeast(1)}``: a block-diffusion model). Compares equal to the values it admits, so the decoder's checks of
    ``requires`` (capability ``==`` requirement) take it as they take a plain value."""

    __slots__ = ("least",)

    def __init__(self, least: int):
        self.least = least

    def __eq__(self, other: object) -> bool:
        return isinstance(other, int) and not isinstance(other, bool) and other >= self.least

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]  # equal to many values: not a key

    def __repr__(self) -> str:
        return f"{self.least} or more"


_LOCK_ATTRIBUTE = "_refusion_forward_lock"
_LOCKS_GUARD = threading.Lock()


def exclusive(model: Any) -> threading.RLock:
    """The re-entrant lock that serialises forwards of ``model``'s network (use it as ``with exclusive(model):``).

    ``model`` is an adapter or a network. The lock lives on the network
    (``model.model`` of an adapter when that is a ``torch.nn.Module``), so two
    adapters wrapping the same network share it. Engines hold it around each
    forward and around any change they make to the network for that forward.
    """
    network = model if isinstance(model, torch.nn.Module) else getattr(model, "model", None)
    owner = network if isinstance(network, torch.nn.Module) else model
    lock = getattr(owner, _LOCK_ATTRIBUTE, None)
    if lock is None:
        with _LOCKS_GUARD:
            lock = getattr(owner, _LOCK_ATTRIBUTE, None)
            if lock is None:
                lock = threading.RLock()
                object.__setattr__(owner, _LOCK_ATTRIBUTE, lock)
    return lock


class ModelAdapter(ABC):
    """A network plus the token ids the decoder needs.

    Attributes every adapter provides: ``mask_token_id`` (int), ``eos_token_ids``
    (frozenset of ints, may be empty), ``vocab_size``, ``max_positions`` (the
    longest prompt + generation it supports, or ``None``), ``device``,
    ``tokenizer`` (or ``None``), ``forwards`` (model forwards run so far) and
    ``family`` (the checkpoint family that loaded it, e.g. ``"llada"``, or
    ``None``; see :mod:`refusion.models.families`).
    """

    name: ClassVar[str]
    capabilities: ModelCapabilities = ModelCapabilities()

    mask_token_id: int
    eos_token_ids: frozenset[int]
    vocab_size: int
    max_positions: int | None
    tokenizer: Any | None
    forwards: int = 0
    family: str | None = None

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Device the model's inputs must live on."""

    def with_ids(self, *, mask_token_id: int | None = None, eos_token_ids: Any = None) -> ModelAdapter:
        """This adapter (the same network, tokenizer and counters' kind) with another mask id and/or EOS ids:
        what a peer's call sets when it passes its own (LLaDA 2.x's ``mask_id``, ``eos_id``). ``None`` keeps the
        adapter's; ids outside the vocabulary are a :class:`~refusion.errors.ConfigError` naming the field."""
        import copy

        from refusion.validators import check_integer

        twin = copy.copy(self)
        if mask_token_id is not None:
            twin.mask_token_id = check_integer("mask_token_id", mask_token_id, 0, self.vocab_size - 1)
        if eos_token_ids is not None:
            ids = [eos_token_ids] if not isinstance(eos_token_ids, (list, tuple, set, frozenset)) else eos_token_ids
            twin.eos_token_ids = frozenset(check_integer("eos_token_id", i, 0, self.vocab_size - 1) for i in ids)
        return twin

    @abstractmethod
    def new_cache(self) -> Any:
        """An empty key/value cache for one sequence (a transformers ``Cache``)."""

    def kv_shape(self) -> tuple[int, int, int, torch.dtype]:
        """``(layers, kv_heads, head_dim, dtype)`` of the cached keys/values (needed by the batched engine)."""
        raise NotImplementedError(f"{type(self).__name__} does not state its key/value shape; use engine='repeat'.")

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
        logits_to_keep: int = 0,
    ) -> torch.Tensor:
        """Run the network and return logits.

        Engines call it holding :func:`exclusive`; it may not change state
        that another thread's forward reads (besides ``forwards``).
        Receives ``input_ids`` and ``position_ids`` of shape ``(batch, q)``, an
        ``attention_mask`` of shape ``(batch, cached + q)`` (1 = attend) or a
        prepared 4-D mask, and ``cache`` holding ``cached`` entries, which the
        call extends by ``q`` entries. Returns logits of shape
        ``(batch, q, vocab)`` (or the last ``logits_to_keep`` rows when > 0).
        Must increment ``forwards`` by one.
        """

    def scores(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: Any, cache: Any) -> Scores:
        """Run the network like :meth:`forward`; the output at every fed position as
        :class:`~refusion.decoding.scores.Scores`.

        Engines call this. The default wraps :meth:`forward`'s full logits;
        an adapter that can separate the LM head returns hidden states plus
        the head, so that only the rows someone reads are projected to the
        vocabulary. Must increment ``forwards`` by one.
        """
        return Scores(logits=self.forward(input_ids, position_ids, attention_mask, cache))
