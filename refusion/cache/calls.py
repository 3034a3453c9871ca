"""What a strategy asks of the model: extensions of the committed context.

An infiller never calls the model. It *yields* a :class:`ModelCall` and gets
back one :class:`ExtendOutput` per :class:`Extend`. Each extend feeds tokens
after the committed context plus a :class:`Branch` (tokens already accepted on
that branch, with their keys/values); the fed tokens attend causally to
themselves, their branch and the committed context, and to nothing else. The
executor decides how to run the extends (one batched forward today).

Branches are immutable: ``branch.extended(output, n)`` returns a new branch
that also holds the first ``n`` fed tokens of ``output``.
"""

from __future__ import annotations

import functools
from typing import Sequence

import attrs
import torch

from refusion.cache.kv import KVSegment


def _as_long_1d(name: str, value) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.long)
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

    def extended(self, output: "ExtendOutput", n: int) -> "Branch":
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


@attrs.frozen(eq=False)
class Extend:
    """Feed ``tokens`` at ``positions`` (both shape ``(q,)``) after ``parent``."""

    parent: Branch
    tokens: torch.Tensor = attrs.field(converter=lambda v: _as_long_1d("tokens", v))
    positions: torch.Tensor = attrs.field(converter=lambda v: _as_long_1d("positions", v))

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
    def of(cls, *extends: Extend) -> "ModelCall":
        return cls(extends)


class Epoch:
    """Counts model calls; outputs of an earlier call may no longer read keys/values."""

    def __init__(self) -> None:
        self.value = 0


@attrs.frozen(eq=False)
class ExtendOutput:
    """The model's answer to one :class:`Extend`.

    ``logits`` has shape ``(q, vocab)``: row ``i`` is the model's output at fed
    token ``i``. ``kv`` holds the fed tokens' keys and values; it can be read
    (or a branch extended with it) until the sequence's next model call, after
    which the executor may reuse the memory.
    """

    extend: Extend
    logits: torch.Tensor
    _layers: Sequence[tuple[torch.Tensor, torch.Tensor]] = attrs.field(repr=False)
    _batch: int = attrs.field(repr=False)
    _start: int = attrs.field(repr=False)
    _epoch: Epoch | None = attrs.field(default=None, repr=False)
    _issued: int = attrs.field(default=0, repr=False)

    @functools.cached_property
    def kv(self) -> KVSegment:
        if not self._layers:
            raise RuntimeError("this model call produced no reusable keys/values (bidirectional model)")
        if self._epoch is not None and self._epoch.value != self._issued:
            raise RuntimeError(
                "ExtendOutput.kv was read after a later model call; take the keys/values you need "
                "(e.g. branch.extended(output, n)) before yielding the next ModelCall."
            )
        return KVSegment.from_layers(self._layers, self._batch, self._start, self._start + len(self.extend.tokens))
