"""The one loop that runs decode programs on an engine.

A :class:`Runner` holds the live programs of one engine. :meth:`Runner.step`
answers one pending call of every live program with a single
:meth:`Engine.run <refusion.engines.base.Engine.run>` and sends each its
outputs; a program that returns has finished and its sequence is released.
Programs may be added between steps (continuous batching) and cancelled.
:func:`drive` runs a fixed set of sessions to the end; the
:class:`~refusion.generator.Generator` adds requests as they arrive.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from refusion.engines.base import Engine, SequenceState
from refusion.protocol import ModelCall
from refusion.state import DecodeResult


class Runner:
    """Steps many decode sessions together on one engine."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._calls: dict[SequenceState, ModelCall] = {}
        self._live: dict[SequenceState, tuple[Any, Any]] = {}  # state -> (session, program)

    def __len__(self) -> int:
        return len(self._live)

    @property
    def sessions(self) -> list[Any]:
        return [session for session, _ in self._live.values()]

    def add(self, session: Any) -> DecodeResult | None:
        """Start ``session``'s program; returns its result at once if it needs no model call."""
        program = session.program()
        with torch.no_grad():
            try:
                call = next(program)
            except StopIteration as stop:
                return self._finish(session, stop.value)
        self._calls[session.state] = call
        self._live[session.state] = (session, program)
        return None

    def step(self) -> list[tuple[Any, DecodeResult]]:
        """One engine run for every live session; returns the sessions that finished, with their results."""
        if not self._calls:
            return []
        finished = []
        with torch.no_grad():
            outputs = self.engine.run(self._calls)
            following: dict[SequenceState, ModelCall] = {}
            for state, out in outputs.items():
                session, program = self._live[state]
                try:
                    following[state] = program.send(out)
                except StopIteration as stop:
                    del self._live[state]
                    finished.append((session, self._finish(session, stop.value)))
                except BaseException:
                    self._abort_all()
                    raise
        self._calls = following
        return finished

    def cancel(self, session: Any) -> bool:
        """Stop ``session``'s program and free its sequence; False if it was not live."""
        state = session.state
        if state not in self._live:
            return False
        _, program = self._live.pop(state)
        self._calls.pop(state, None)
        program.close()
        self.engine.release(state)
        return True

    def _finish(self, session: Any, result: DecodeResult) -> DecodeResult:
        self.engine.release(session.state)
        result.extra["engine_counters"] = self.engine.counters.as_dict()
        return result

    def _abort_all(self) -> None:
        """A program raised: stop every live program and free every sequence, then let the error out."""
        for state, (_, program) in list(self._live.items()):
            program.close()
            self.engine.release(state)
        self._live.clear()
        self._calls = {}


def drive(engine: Engine, sessions: Iterable[Any]) -> list[DecodeResult]:
    """Run ``sessions`` together on ``engine`` to the end; results in the sessions' order.

    Every result's ``extra["engine_counters"]`` holds the engine's totals for the whole run.
    """
    sessions = list(sessions)
    runner = Runner(engine)
    results: dict[int, DecodeResult] = {}
    index = {id(s): i for i, s in enumerate(sessions)}
    for i, session in enumerate(sessions):
        done = runner.add(session)
        if done is not None:
            results[i] = done
    while len(runner):
        for session, result in runner.step():
            results[index[id(session)]] = result
    totals = engine.counters.as_dict()
    for result in results.values():
        result.extra["engine_counters"] = totals
    return [results[i] for i in range(len(sessions))]
