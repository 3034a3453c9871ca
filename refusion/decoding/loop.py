"""The decode loop: one persistent batch of live rows on one engine, one forward per step, whatever they decode.

:class:`DecodeLoop` owns the decode step. Every live row belongs to one form (:mod:`refusion.decoding.forms`): the
batched form its infiller names when the form accepts its decoder (its rows are decided together with tensor
operations), else the per-sequence adapter (its row runs its decode as a program). Each :meth:`DecodeLoop.step`:

1. every form adds what its rows feed to one :class:`~refusion.engines.feed.Feed` (on an engine that takes one;
   any other engine gets the programs' calls through its ``run``);
2. the engine runs one forward for all of it;
3. every form reads the outputs and decides for its rows; the choices selectors make and the LM-head projections
   programs ask for are answered together for every row of every form (:class:`~refusion.decoding.decisions.
   Decisions`): one ``choose`` per distinct selector.

Rows join (:meth:`DecodeLoop.add`) and leave (finished, failed, :meth:`DecodeLoop.cancel`) between steps; a row that
leaves gives its engine state (its pages and reservation) back at once. A part that raises, returns a malformed
answer or calls ``sys.exit()`` fails its own row only; the others continue and get what they get alone. What only
the forward or a form's own code raises (nothing a part did) fails every row of the step.
:func:`drive` runs a fixed set of sessions to the end; the scheduler (:mod:`refusion.scheduler`) feeds the loop
requests as they arrive.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable
from typing import Any

import attrs
import torch

from refusion.decoding.decisions import Decisions
from refusion.decoding.forms import form_for
from refusion.decoding.forms.base import BatchedForm
from refusion.decoding.forms.program import ProgramForm
from refusion.decoding.types import DecodeResult
from refusion.engines.feed import Feed

log = logging.getLogger("refusion.loop")


class DecodeLoop:
    """The live rows of one engine and the step that decodes them (see the module docstring).

    ``batched=False`` runs every row per sequence (the programs' baseline, for comparisons).
    """

    def __init__(self, engine: Any, *, batched: bool = True):
        self.engine = engine
        self.batched = batched
        #: forwards in which a batched form fed tokens
        self.batched_forwards = 0
        #: the per-sequence rows
        self.programs = ProgramForm(self)
        #: the batched forms, by their key (rows of equal decoders share one)
        self.forms: dict[Hashable, BatchedForm] = {}
        self._form_of: dict[int, BatchedForm] = {}
        self._done: list[tuple[Any, DecodeResult]] = []
        #: rows that failed since the last look, with their errors (they have left the loop)
        self.failures: list[tuple[Any, BaseException]] = []
        #: why each decoder seen runs per sequence (by decoder identity), for :meth:`explain`
        self._reasons: dict[int, str | None] = {}

    def __len__(self) -> int:
        return len(self._form_of)

    @property
    def sessions(self) -> list[Any]:
        return [s for form in (*self.forms.values(), self.programs) for s in form.sessions]

    def explain(self, session: Any) -> str | None:
        """Why ``session``'s row runs per sequence (``None``: in a batched form)."""
        return self._reasons.get(id(session.decoder))

    # -- rows joining and leaving ---------------------------------------------------------
    def add(self, session: Any) -> DecodeResult | None:
        """A row joins (its engine state was just admitted); returns its result at once if it needs no forward.
        Its failure at once is in :attr:`failures`."""
        record = bool(getattr(session, "record", False))
        cls, reason = form_for(session.decoder, self.engine, record)
        if not self.batched:
            cls, reason = ProgramForm, "batched forms are off in this loop"
        if id(session.decoder) not in self._reasons:
            self._reasons[id(session.decoder)] = reason
            if reason is not None:
                log.debug("decoder %r runs per sequence: %s", session.decoder, reason)
        if cls is ProgramForm:
            form: BatchedForm = self.programs
        else:
            key = cls.key(session.decoder)
            form = self.forms.get(key)  # type: ignore[assignment]
            if form is None:
                form = self.forms[key] = cls(self, session.decoder)
        self._form_of[id(session)] = form
        with torch.no_grad():
            form.admit(session)
        for i, (done, result) in enumerate(self._done):
            if done is session:
                del self._done[i]
                return result
        return None

    def finish(self, session: Any, result: DecodeResult) -> None:
        """A form reports ``session``'s row finished with ``result``: it leaves, its engine state is released."""
        if self._leave(session):
            self._done.append((session, attrs.evolve(result, engine_totals=self.engine.counters.as_dict())))

    def fail(self, session: Any, error: BaseException) -> None:
        """A form reports ``session``'s row failed: it alone leaves (its engine state released)."""
        if self._leave(session):
            self.failures.append((session, error))

    def cancel(self, session: Any) -> bool:
        """Stop ``session``'s row and free it; False if it was not live."""
        return self._leave(session)

    def _leave(self, session: Any) -> bool:
        form = self._form_of.pop(id(session), None)
        if form is None:
            return False
        form.remove(session)
        self.engine.release(session.state)
        return True

    def abort(self, error: BaseException) -> None:
        """The step failed as a whole: every live row fails with ``error``."""
        for session in self.sessions:
            self.fail(session, error)
        self.forms = {key: form for key, form in self.forms.items() if len(form)}

    # -- one step ---------------------------------------------------------------------------
    def step(self) -> list[tuple[Any, DecodeResult]]:
        """One forward for every live row; returns the rows that finished, with their results (the rows that
        failed are in :attr:`failures`). If the forward itself fails, every row of the step fails with it and the
        error is raised."""
        forms = [form for form in self.forms.values() if len(form)]
        if len(self.programs):
            forms.append(self.programs)
        if not forms:
            return []
        engine = self.engine
        decisions = Decisions(engine.model.mask_token_id)
        try:
            with torch.no_grad():
                if getattr(engine, "lays_out", False):
                    feed = Feed()
                    for form in forms:
                        form.feed(feed)
                    scores = engine.forward(feed) if len(feed) else None
                    self.batched_forwards += int(scores is not None and forms[0] is not self.programs)
                else:  # an engine that runs calls: only programs live here
                    calls = self.programs.calls
                    self.programs.outputs = engine.run(dict(calls)) if calls else {}
                    scores = None
                for form in forms:
                    form.absorb(scores, decisions)
                decisions.resolve()
        except BaseException as error:
            self.abort(error)
            raise
        self.forms = {key: form for key, form in self.forms.items() if len(form)}
        done, self._done = self._done, []
        return done


def drive(engine: Any, sessions: Iterable[Any], *, batched: bool = True) -> list[DecodeResult]:
    """Run ``sessions`` together on ``engine`` to the end; results in the sessions' order (the first failure is
    raised). Every result's ``engine_totals`` holds the engine's counters for the whole run. ``batched=False``:
    every session as its per-sequence program."""
    return run_to_end(DecodeLoop(engine, batched=batched), sessions)


def run_to_end(loop: DecodeLoop, sessions: Iterable[Any]) -> list[DecodeResult]:
    """Add ``sessions`` to ``loop`` and step it until they are done (see :func:`drive`)."""
    engine = loop.engine
    sessions = list(sessions)
    results: dict[int, DecodeResult] = {}
    index = {id(s): i for i, s in enumerate(sessions)}
    try:
        for i, session in enumerate(sessions):
            done = loop.add(session)
            if done is not None:
                results[i] = done
            _raise_failure(loop)
        while len(loop):
            for session, result in loop.step():
                results[index[id(session)]] = result
            _raise_failure(loop)
    except BaseException:
        for session in loop.sessions:
            loop.cancel(session)
        raise
    totals = engine.counters.as_dict()
    return [attrs.evolve(results[i], engine_totals=totals) for i in range(len(sessions))]


def _raise_failure(loop: DecodeLoop) -> None:
    if loop.failures:
        raise loop.failures[0][1]
