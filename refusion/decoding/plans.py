"""The plans of several sequences, decided together: a selector's batched view.

:class:`Plans` holds one :class:`~refusion.decoding.types.Plan` per row (the
sequences a selector decides for in one engine step) and stacks their
per-slot scores as ``(rows, width)`` tensors, ``width`` the most slots of any
row, padded where a row has fewer slots (``valid`` says where). A selector's
:meth:`~refusion.strategies.base.SlotSelector.choose` reads them with tensor
operations over the whole group; the per-row :class:`Plan` stays available
(``plans[i]``) for what only it holds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch

from refusion.decoding.types import Plan


class LazyPlans(Sequence):
    """``n`` plans, row ``i``'s made by ``make(i)`` when first read (a whole-batch loop's rows: the per-sequence
    :class:`Plan` is built only for a selector that reads it)."""

    def __init__(self, n: int, make: Callable[[int], Plan]):
        self._made: list[Plan | None] = [None] * n
        self._make = make

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        plan = self._made[i]
        if plan is None:
            plan = self._made[i] = self._make(i)
        return plan


def _rows(plans: Sequence[Plan]) -> Sequence[Plan]:
    return plans if isinstance(plans, LazyPlans) else tuple(plans)


@attrs.frozen(eq=False)
class Plans:
    """One plan per row; stacked views of their slot scores (computed on first use, once).

    ``stacked``: views already known for every row (a batched form gives ``first_confidence`` and ``lengths`` from
    its columns), read instead of stacking the rows' plans; ``known``: per view, each row's values where known
    (``None`` where the row's plan must give them), so that a selector reading only those makes no plan.
    """

    plans: Sequence[Plan] = attrs.field(converter=_rows)
    stacked: Mapping[str, torch.Tensor] = attrs.field(factory=dict)
    known: Mapping[str, Sequence[torch.Tensor | None]] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self.plans)

    def __getitem__(self, row: int) -> Plan:
        return self.plans[row]

    def __iter__(self) -> Iterator[Plan]:
        return iter(self.plans)

    @functools.cached_property
    def lengths(self) -> torch.Tensor:
        """Slots of each row's plan, shape ``(rows,)``."""
        if "lengths" in self.stacked:
            return self.stacked["lengths"]
        return torch.tensor([len(p) for p in self.plans], dtype=torch.long)

    @functools.cached_property
    def width(self) -> int:
        return int(self.lengths.max()) if len(self.plans) else 0

    @functools.cached_property
    def valid(self) -> torch.Tensor:
        """``(rows, width)``: True where the row has a slot."""
        return torch.arange(self.width)[None, :] < self.lengths[:, None]

    def stack(self, per_plan: Callable[[Plan], torch.Tensor], pad: float, view: str | None = None) -> torch.Tensor:
        """``per_plan(plan)`` (one value per slot) of every row, as ``(rows, width)``, ``pad`` where no slot (a row's
        value of ``view`` taken from ``known`` where given)."""
        known = self.known.get(view) if view is not None else None
        values = []
        for i in range(len(self.plans)):
            value = known[i] if known is not None else None
            values.append((value if value is not None else per_plan(self.plans[i])).reshape(-1))
        # compared in their own dtype, as each row would be (rows of different dtypes: the widest)
        dtype = functools.reduce(torch.promote_types, (v.dtype for v in values)) if values else torch.float32
        out = torch.full((len(values), self.width), pad, dtype=dtype)
        for row, v in enumerate(values):
            out[row, : v.shape[0]] = v.to(dtype).cpu()
        return out

    @functools.cached_property
    def first_confidence(self) -> torch.Tensor:
        """Each slot's first-draft-token probability, ``(rows, width)``, ``-inf`` where no slot."""
        if "first_confidence" in self.stacked:
            return self.stacked["first_confidence"]
        return self.stack(lambda p: p.first_confidence, float("-inf"), "first_confidence")

    @functools.cached_property
    def first_margin(self) -> torch.Tensor:
        """Top-2 margin at each slot's first token, ``(rows, width)``, ``-inf`` where no slot."""
        return self.stack(lambda p: p.first_margin, float("-inf"))

    @functools.cached_property
    def first_entropy(self) -> torch.Tensor:
        """Entropy at each slot's first token, ``(rows, width)``, ``+inf`` where no slot."""
        return self.stack(lambda p: p.first_entropy, float("inf"))


def rows_to_lists(chosen: torch.Tensor) -> list[Sequence[int]]:
    """A ``(rows, width)`` boolean choice as one list of slot indices per row (one host read for all rows)."""
    rows, cols = chosen.nonzero(as_tuple=True)
    out: list[Sequence[int]] = [[] for _ in range(chosen.shape[0])]
    for r, c in zip(rows.tolist(), cols.tolist()):
        out[r].append(c)
    return out


def top_k_rows(scores: torch.Tensor, k: torch.Tensor | int, valid: torch.Tensor) -> torch.Tensor:
    """``(rows, width)`` boolean: each row's ``k`` highest ``scores`` among its ``valid`` slots (padding must
    score lowest), ties to the lowest index, as :func:`~refusion.strategies.selectors.scored.top_k` breaks them
    row by row."""
    if isinstance(k, int) and k == 1 and scores.shape[-1]:  # the first of equal maxima is the lowest: no sort
        best = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
        best[torch.arange(scores.shape[0]), scores.argmax(-1)] = True
        return best & valid
    order = torch.sort(scores.double(), dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(scores.shape[-1]).expand_as(order).contiguous())
    limit = min(k, scores.shape[-1]) if isinstance(k, int) else k[:, None]
    return (ranks < limit) & valid
