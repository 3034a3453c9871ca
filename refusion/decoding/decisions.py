"""The decisions rows of one step share: LM-head projections and selections, grouped across every form.

A form or a program asks :meth:`Decisions.project` for rows of Scores to be projected to the vocabulary and
:meth:`Decisions.select` for a selector's choice among a plan's slots, each with what to do next. :meth:`resolve`
answers them in rounds: every projection of a round in one LM-head pass, every selection of a round by one
``choose`` per distinct selector over all the rows it decides for, whatever form they belong to; answering may ask
for more (a program yields its next request), until nothing is asked. A selector that raises or returns a
malformed answer for its group is asked again row by row, so only the rows it fails on fail (their ``fail``
callbacks get a :class:`~refusion.errors.PluginError` naming it); the others get what ``select`` would give them
alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from refusion.decoding.checks import call_part, checked_selection, checks_answers, plugin_error
from refusion.decoding.plans import LazyPlans, Plans
from refusion.decoding.scores import project
from refusion.errors import PluginError


class _Selection:
    """One row's selection request: its plan (or what makes it), what the form knows of it, and what follows."""

    __slots__ = ("selector", "plan", "first_confidence", "length", "then", "fail")

    def __init__(self, selector, plan, first_confidence, length, then, fail):
        self.selector, self.plan, self.first_confidence, self.length = selector, plan, first_confidence, length
        self.then, self.fail = then, fail

    def made(self) -> Any:
        if callable(self.plan):
            self.plan = self.plan()
        return self.plan


class Decisions:
    """The pending projections and selections of one step (see the module docstring). ``mask``: the mask id,
    never a draft."""

    def __init__(self, mask: int | None):
        self.mask = mask
        self._projections: list[tuple[Any, Any, Callable[[], None]]] = []
        self._selections: list[_Selection] = []

    def project(self, scores: Any, rows: Any, then: Callable[[], None]) -> None:
        """Project ``rows`` of ``scores`` with the round's other rows, then call ``then()``."""
        self._projections.append((scores, rows, then))

    def select(
        self,
        selector: Any,
        plan: Any,
        then: Callable[[tuple[int, ...]], None],
        fail: Callable[[BaseException], None],
        *,
        first_confidence: torch.Tensor | None = None,
        length: int | None = None,
    ) -> None:
        """Ask ``selector`` to choose among ``plan``'s slots (a :class:`~refusion.decoding.types.Plan`, or a
        callable that makes it when first read); ``then(chosen)`` gets the checked, sorted choice, ``fail(error)``
        the selector's failure for this row. ``first_confidence`` and ``length``: the plan's slot confidences and
        slot count when known without the plan (a selector reading only those never makes it)."""
        self._selections.append(_Selection(selector, plan, first_confidence, length, then, fail))

    def resolve(self) -> None:
        """Answer every request, in rounds, until none is left."""
        while self._projections or self._selections:
            projections, self._projections = self._projections, []
            if projections:
                project([(s, r) for s, r, _ in projections if s.batchable], self.mask)
                for _, _, then in projections:
                    then()
            selections, self._selections = self._selections, []
            groups: dict[Any, list[_Selection]] = {}
            for request in selections:
                groups.setdefault(_key(request.selector), []).append(request)
            for group in groups.values():
                self._choose(group)

    def _choose(self, group: list[_Selection]) -> None:
        """One ``choose`` for the group; on its failure, each row alone."""
        selector = group[0].selector
        checked = checks_answers(selector)
        plans = _plans(group)
        try:
            chosen = call_part(selector, selector.choose, plans)
            if not isinstance(chosen, Sequence) or len(chosen) != len(group):
                raise plugin_error(
                    selector, f"choose returned {chosen!r:.80}; expected one choice per plan ({len(group)})."
                )
            answers = [
                checked_selection(selector, plans[i], c) if checked else tuple(sorted(c)) for i, c in enumerate(chosen)
            ]
        except PluginError:
            if len(group) == 1:
                return self._alone(group[0])
            for request in group:
                self._alone(request)
            return
        for request, answer in zip(group, answers):
            request.then(answer)

    def _alone(self, request: _Selection) -> None:
        """The selector for one row (its group failed): the row's own answer, or the row fails."""
        selector = request.selector
        try:
            plans = _plans([request])
            chosen = call_part(selector, selector.choose, plans)
            if not isinstance(chosen, Sequence) or len(chosen) != 1:
                raise plugin_error(selector, f"choose returned {chosen!r:.80}; expected one choice per plan (1).")
            answer = checked_selection(selector, plans[0], chosen[0])
        except PluginError as error:
            request.fail(error)
            return
        request.then(answer)


def _plans(group: list[_Selection]) -> Plans:
    """The group's plans, with the slot confidences and counts the forms know stacked without making a plan."""
    known = [r.first_confidence for r in group]
    lengths = [r.length for r in group]
    plans = LazyPlans(len(group), lambda i: group[i].made())
    stacked: dict[str, Any] = {}
    if all(n is not None for n in lengths):
        stacked["lengths"] = torch.tensor(lengths, dtype=torch.long)
    return Plans(plans, stacked=stacked, known={"first_confidence": known})


def _key(selector: Any) -> Any:
    """Group key of a selector: equal (frozen, same fields) selectors decide together."""
    try:
        hash(selector)
    except TypeError:
        return id(selector)
    return (type(selector), selector)
