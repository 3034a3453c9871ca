"""Data passed between the parts of the decoder.

All of it is immutable (``attrs`` frozen classes); classes holding tensors use
``eq=False``. Shapes are given as ``(n,)`` for flat per-token tensors.
Position ids are absolute (prompt tokens come first, from 0); a slot's
``offset`` counts from the start of the generation region.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import torch

from refusion.protocol import KVSegment


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
    """

    gen_length: int
    slots: tuple[Slot, ...]
    blocks: tuple[tuple[int, ...], ...]


@attrs.frozen(eq=False)
class Plan:
    """The diffusion step's drafts for the still-masked slots of the current block.

    ``slots`` (k slots, position order) are laid out one after another in the
    flat tensors: slot ``i`` occupies rows ``offsets[i]:offsets[i+1]``.
    ``positions``, ``tokens`` (draft ids) and ``confidence`` (probability of
    each draft token) have shape ``(n,)``; ``logits`` has shape ``(n, vocab)``.
    ``generator`` is the prompt's random generator (seeded by the decoder's
    ``seed``), for selectors that draw at random.
    """

    slots: tuple[Slot, ...]
    positions: torch.Tensor
    logits: torch.Tensor
    tokens: torch.Tensor
    confidence: torch.Tensor
    offsets: tuple[int, ...]
    generator: torch.Generator | None = None

    def __len__(self) -> int:
        return len(self.slots)

    def rows(self, i: int) -> slice:
        """Rows of slot ``i`` in the flat tensors."""
        return slice(self.offsets[i], self.offsets[i + 1])

    @functools.cached_property
    def first_rows(self) -> torch.Tensor:
        """Row of each slot's first token, shape ``(k,)``."""
        return torch.tensor(self.offsets[:-1], dtype=torch.long, device=self.tokens.device)

    @functools.cached_property
    def first_confidence(self) -> torch.Tensor:
        """Probability of each slot's first draft token (the paper's slot score), shape ``(k,)``."""
        return self.confidence[self.first_rows]

    @functools.cached_property
    def first_probs(self) -> torch.Tensor:
        """Softmax over the vocabulary at each slot's first token, shape ``(k, vocab)``."""
        return torch.softmax(self.logits[self.first_rows].float(), dim=-1)

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

    ``next_logits`` (shape ``(vocab,)``) are the logits at the last committed
    token in commit order, when the infiller has them; with a causal model they
    predict the token after it.
    """

    commits: tuple[Commit, ...] = attrs.field(converter=tuple)
    next_logits: torch.Tensor | None = None


@attrs.frozen
class StepRecord:
    """One decoder iteration: which slots were planned, selected and committed.

    ``committed`` holds ``(slot index, tokens kept)`` pairs in commit order;
    ``forwards`` counts the model forwards of this iteration.
    """

    iteration: int
    block: int
    planned: tuple[int, ...]
    selected: tuple[int, ...]
    committed: tuple[tuple[int, int], ...]
    forwards: int


@attrs.frozen(eq=False)
class DecodeResult:
    """The outcome of decoding one prompt.

    ``tokens``: generated ids in position order, up to and including the first
    EOS (shape ``(m,)``). ``commit_step``: for each position of the generation
    region, the iteration that committed it (-1 if never, e.g. after EOS).
    ``forwards``: model forwards run, prompt prefill included.
    ``tokens_per_forward``: ``len(tokens) / forwards``.
    """

    tokens: torch.Tensor
    prompt_length: int
    partition: Partition
    commit_step: torch.Tensor
    forwards: int
    steps: tuple[StepRecord, ...]
    stopped_at_eos: bool
    text: str | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)

    @property
    def tokens_per_forward(self) -> float:
        return len(self.tokens) / max(self.forwards, 1)
