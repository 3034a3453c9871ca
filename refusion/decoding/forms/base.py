"""What a group of rows decided together must do: the interface of a batched form.

The decode loop (:mod:`refusion.decoding.loop`) keeps one persistent batch of live rows; each row belongs to one
*form*, which decides for all of its rows at once:

* :meth:`BatchedForm.feed` adds what its rows feed this step to the step's :class:`~refusion.engines.feed.Feed`
  (every form's tokens go into the same forward);
* :meth:`BatchedForm.absorb` reads the forward's outputs and decides for its rows with tensor operations; choices a
  selector makes are asked of the step's :class:`~refusion.decoding.decisions.Decisions`, which groups every row of
  every form that uses the same selector into one ``choose``.

An infiller names its batched form (:attr:`Infiller.batched <refusion.strategies.base.Infiller>`); whether a decoder
may run in it is the form's to say (:meth:`BatchedForm.refuses`), from the parts' declared traits, never from
their classes. A decoder no form accepts runs per sequence, through the program adapter
(:mod:`refusion.decoding.forms.program`), on the same forwards. A form reports a row that finished with
:meth:`DecodeLoop.finish <refusion.decoding.loop.DecodeLoop.finish>` and one that failed with
:meth:`DecodeLoop.fail <refusion.decoding.loop.DecodeLoop.fail>` (only that row leaves; the loop gives its pages
back).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import Any, ClassVar


class BatchedForm(ABC):
    """Rows decided together (see the module docstring). ``loop`` is the decode loop the form serves; ``sessions``
    (an attribute or a property) lists the sessions of its live rows."""

    sessions: Any

    #: whether rows of this form keep iteration records (a decode asking for them runs elsewhere otherwise)
    records: ClassVar[bool] = False

    def __init__(self, loop: Any, decoder: Any):
        self.loop = loop
        self.engine = loop.engine
        self.decoder = decoder

    @classmethod
    @abstractmethod
    def refuses(cls, decoder: Any, engine: Any, record: bool) -> str | None:
        """Why rows of ``decoder`` on ``engine`` (``record``: keeping iteration records) cannot run in this form, as a
        short reason; ``None`` when they can."""

    @classmethod
    def key(cls, decoder: Any) -> Hashable:
        """Rows whose decoders have equal keys share one instance of the form (default: equal decoders)."""
        return (cls, hashable(decoder))

    @abstractmethod
    def __len__(self) -> int:
        """Live rows."""

    @abstractmethod
    def admit(self, session: Any) -> None:
        """Add ``session``'s row (its engine state was just admitted: the prompt is pending)."""

    @abstractmethod
    def remove(self, session: Any) -> bool:
        """Drop ``session``'s row (it finished, failed or was cancelled; the loop releases its engine state);
        False if it is not here."""

    @abstractmethod
    def feed(self, feed: Any) -> None:
        """Add every live row's tokens of this step to ``feed`` (a row that fails here is reported to the loop)."""

    @abstractmethod
    def absorb(self, scores: Any, decisions: Any) -> None:
        """After the forward: decide for every row that fed this step from ``scores`` (the forward's packed Scores;
        ``None`` when nothing was fed), asking ``decisions`` for the choices selectors make."""


def hashable(value: Any) -> Hashable:
    """``value`` when hashable (equal parts share a form), else its identity."""
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


def resolve(form: Any) -> type[BatchedForm] | None:
    """A form named by a class or a ``"module:Class"`` path (built-ins name theirs by path: forms import decoding
    machinery that parts may not)."""
    if form is None or isinstance(form, type):
        return form
    import importlib

    module, _, name = str(form).partition(":")
    return getattr(importlib.import_module(module), name)
