"""The one loop that runs decode programs on an engine.

A :class:`Runner` holds the live programs of one engine. :meth:`Runner.step`
answers one pending call of every live program with a single
:meth:`Engine.run <refusion.engines.base.Engine.run>` and sends each its
outputs; a program that returns has finished and its sequence is released.
Rows the extends declare they will read (``Extend.reads``), and the
:class:`~refusion.decoding.protocol.Projection` s programs yield, are projected to the
vocabulary for all sequences together, one LM-head pass each time.
Programs may be added between steps (continuous batching) and cancelled.
Sessions whose decoder has a whole-batch form on the engine
(:func:`refusion.decoding.columnar.whole_batch_loop`: the lossless loop or the
plan-and-infill loop) join that loop instead of running a program: one forward and one set of tensor decisions
for all of them per step.
:func:`drive` runs a fixed set of sessions to the end; the
:class:`~refusion.generator.Generator` adds requests as they arrive.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import torch

from refusion.decoding.checks import call_part, plugin_error
from refusion.decoding.plans import Plans
from refusion.decoding.protocol import ExtendOutput, ModelCall, Projection, Selection
from refusion.decoding.scores import project
from refusion.decoding.types import DecodeResult
from refusion.engines.base import Engine, SequenceState


class Runner:
    """Steps many decode sessions together on one engine."""

    def __init__(self, engine: Engine, *, columnar: bool = True):
        self.engine = engine
        #: whether sessions with a whole-batch form run in a columnar loop (False: every session as a program)
        self.columnar = columnar
        #: the whole-batch loops, by the key of the parts and options they decide with (``whole_batch_loop``)
        self._loops: dict[Any, Any] = {}
        self._calls: dict[SequenceState, ModelCall] = {}
        self._live: dict[SequenceState, tuple[Any, Any]] = {}  # state -> (session, program)
        #: sessions whose program raised, with the exception (they have left the runner)
        self.failures: list[tuple[Any, BaseException]] = []

    def __len__(self) -> int:
        return len(self._live) + sum(len(loop) for loop in self._loops.values())

    @property
    def sessions(self) -> list[Any]:
        return [session for session, _ in self._live.values()] + [
            session for loop in self._loops.values() for session in loop.sessions
        ]

    def add(self, session: Any) -> DecodeResult | None:
        """Start ``session``'s program (or give its row to a columnar loop); returns its result at once if it needs
        no model call."""
        if self.columnar and self._join_loop(session):
            return None
        program = session.program()
        self._live[session.state] = (session, program)
        finished: list = []
        with torch.no_grad():
            self._advance({session.state: None}, finished, start=True)
        return finished[0][1] if finished else None

    def _join_loop(self, session: Any) -> bool:
        from refusion.decoding.columnar import whole_batch_loop

        if not getattr(type(session), "plan_and_infill", False):  # another loop's session (canvas denoising)
            return False
        found = whole_batch_loop(session.decoder, self.engine, session.record)
        if found is None:
            return False
        key, make = found
        loop = self._loops.get(key)
        if loop is None:
            loop = self._loops[key] = make()
        loop.admit(session)
        return True

    def step(self) -> list[tuple[Any, DecodeResult]]:
        """One engine run for every live session; returns the sessions that finished, with their results."""
        finished: list = []
        with torch.no_grad():
            for loop in self._loops.values():
                if len(loop):
                    try:
                        done = loop.step()
                    except BaseException:
                        self._abort_all()
                        raise
                    finished += [
                        (session, self._finish(session, result))  # the loop freed the row; _finish adds the totals
                        for session, result in done
                    ]
        if not self._calls:
            return finished
        with torch.no_grad():
            try:
                outputs = self.engine.run(self._calls)
                project(_reads(outputs), self.engine.model.mask_token_id)
            except BaseException:
                self._abort_all()
                raise
            self._calls = {}
            self._advance(outputs, finished)
        return finished

    def _advance(self, sends: dict, finished: list, start: bool = False) -> None:
        """Send each program its value; resolve the Projections and Selections they yield in batches (one LM-head
        pass, one ``choose`` per selector) until each waits on a call."""
        mask = self.engine.model.mask_token_id
        while sends:
            projections: dict[SequenceState, Projection] = {}
            selections: dict[SequenceState, Selection] = {}
            for state, value in sends.items():
                session, program = self._live[state]
                try:
                    item = next(program) if start else program.send(value)
                except StopIteration as stop:
                    del self._live[state]
                    finished.append((session, self._finish(session, stop.value)))
                    continue
                except Exception as exc:  # this program failed (e.g. a plugin raised): it alone leaves
                    del self._live[state]
                    program.close()
                    self.engine.release(state)
                    self.failures.append((session, exc))
                    continue
                if isinstance(item, Projection):
                    projections[state] = item
                elif isinstance(item, Selection):
                    selections[state] = item
                else:
                    self._calls[state] = item
            start = False
            if projections:
                project([(p.scores, p.rows) for p in projections.values()], mask)
            sends = {state: None for state in projections}
            sends.update(self._choose(selections))

    def _choose(self, selections: dict[SequenceState, Selection]) -> dict[SequenceState, Any]:
        """Each distinct selector's ``choose`` once, over the plans of every sequence it decides for; a selector
        that raises fails the sequences of its group (they leave the runner, as a failing program does)."""
        groups: dict[Any, list[SequenceState]] = {}
        for state, item in selections.items():
            groups.setdefault(_key(item.selector), []).append(state)
        out: dict[SequenceState, Any] = {}
        for states in groups.values():
            selector = selections[states[0]].selector
            plans = Plans([selections[s].plan for s in states])
            try:
                chosen = call_part(selector, selector.choose, plans)
                if not isinstance(chosen, (list, tuple)) or len(chosen) != len(states):
                    raise plugin_error(
                        selector, f"choose returned {chosen!r:.80}; expected one choice per plan ({len(states)})."
                    )
            except Exception as exc:  # the group's programs receive it as their own failure
                for state in states:
                    session, program = self._live.pop(state)
                    program.close()
                    self.engine.release(state)
                    self.failures.append((session, exc))
                continue
            out.update(zip(states, chosen))
        return out

    def cancel(self, session: Any) -> bool:
        """Stop ``session``'s program and free its sequence; False if it was not live."""
        state = session.state
        if state not in self._live:
            return any(loop.cancel(session) for loop in self._loops.values())
        _, program = self._live.pop(state)
        self._calls.pop(state, None)
        program.close()
        self.engine.release(state)
        return True

    def _finish(self, session: Any, result: DecodeResult) -> DecodeResult:
        self.engine.release(session.state)
        return attrs.evolve(result, engine_totals=self.engine.counters.as_dict())

    def _abort_all(self) -> None:
        """A program raised: stop every live program and free every sequence, then let the error out."""
        for state, (_, program) in list(self._live.items()):
            program.close()
            self.engine.release(state)
        self._live.clear()
        for loop in self._loops.values():
            loop.abort()
        self._calls = {}


def _key(selector: Any) -> Any:
    """Group key of a selector: equal (frozen, same fields) selectors decide together."""
    try:
        hash(selector)
    except TypeError:
        return id(selector)
    return (type(selector), selector)


def _reads(outputs: dict) -> list[tuple]:
    """What a step's outputs will be read for: each extend's declared rows (with the tokens it fed, for the
    probability of each next one), and each sequence's new next-token row (an AR step reads it)."""
    requests = [
        (o.scores, o.extend.reads, o.extend.tokens)
        for outs in outputs.values()
        for o in outs
        if isinstance(o, ExtendOutput) and o.extend.reads is not None
    ]
    for state in outputs:
        last = getattr(state.context, "last_scores", None)  # a canvas-denoising sequence keeps no Scores
        if last is not None and last.batchable and not last.projected:
            requests.append((last, slice(None)))
    return requests


def drive(engine: Engine, sessions: Iterable[Any], *, columnar: bool = True) -> list[DecodeResult]:
    """Run ``sessions`` together on ``engine`` to the end; results in the sessions' order.

    Every result's ``engine_totals`` holds the engine's counters for the whole run. ``columnar=False`` runs every
    session as its per-sequence program (no whole-batch loop).
    """
    sessions = list(sessions)
    runner = Runner(engine, columnar=columnar)
    results: dict[int, DecodeResult] = {}
    index = {id(s): i for i, s in enumerate(sessions)}
    try:
        for i, session in enumerate(sessions):
            done = runner.add(session)
            if done is not None:
                results[i] = done
            _raise_failure(runner)
        while len(runner):
            for session, result in runner.step():
                results[index[id(session)]] = result
            _raise_failure(runner)
    except BaseException:
        runner._abort_all()
        raise
    totals = engine.counters.as_dict()
    return [attrs.evolve(results[i], engine_totals=totals) for i in range(len(sessions))]


def _raise_failure(runner: Runner) -> None:
    if runner.failures:
        raise runner.failures[0][1]
