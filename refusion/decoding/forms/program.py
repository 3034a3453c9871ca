"""The per-sequence adapter: rows whose decoder no batched form accepts, each running its decode as a program.

A session's :meth:`program <refusion.decoding.session.DecodeSession.program>` is a generator that yields the model
calls it needs (and the projections and selections it wants decided with the other rows) and receives their
outputs. :class:`ProgramForm` keeps every such row of the loop: each step it lays out every program's pending call
into the step's forward (a paged engine) or hands them to the engine's ``run`` (any other), sends each program its
outputs, and answers what the programs then ask (:class:`~refusion.decoding.decisions.Decisions`) until each waits on
its next call. Any plugin part runs here, slower than in a batched form and with identical tokens; a program that
raises (a plugin that fails) fails its own row only.
"""

from __future__ import annotations

from typing import Any

from refusion.decoding.forms.base import BatchedForm
from refusion.decoding.protocol import ExtendOutput, ModelCall, Projection, Selection

#: exceptions a program raises that end its row (a plugin's SystemExit included), not the loop
CONTAINED = (Exception, SystemExit, KeyboardInterrupt)


def contained(error: BaseException) -> Exception:
    """``error`` as the row's failure: an ``Exception`` as it is, a ``SystemExit``/``KeyboardInterrupt`` that a
    part's code raised wrapped in a :class:`~refusion.errors.RefusionError` (so that waiting for the row never
    exits the waiting thread)."""
    if isinstance(error, Exception):
        return error
    from refusion.errors import RefusionError

    wrapped = RefusionError(f"the decode raised {type(error).__name__}: {error}")
    wrapped.__cause__ = error
    return wrapped


class ProgramForm(BatchedForm):
    """Every per-sequence row of one loop (see the module docstring); it accepts any decoder."""

    records = True

    def __init__(self, loop: Any):
        super().__init__(loop, None)
        self._live: dict[Any, tuple[Any, Any]] = {}  # state -> (session, program)
        #: each waiting program's next model call
        self.calls: dict[Any, ModelCall] = {}
        self._finishers: dict[Any, Any] = {}
        #: outputs of the engine's ``run`` (engines that take no feed), set by the loop before :meth:`absorb`
        self.outputs: dict[Any, tuple[ExtendOutput, ...]] | None = None

    @classmethod
    def refuses(cls, decoder: Any, engine: Any, record: bool) -> str | None:
        return None

    def __len__(self) -> int:
        return len(self._live)

    @property
    def sessions(self) -> list[Any]:
        return [session for session, _ in self._live.values()]

    def admit(self, session: Any) -> None:
        from refusion.decoding.decisions import Decisions

        self._live[session.state] = (session, session.program())
        decisions = Decisions(self.engine.model.mask_token_id)
        self._send(session.state, None, decisions, start=True)
        decisions.resolve()

    def remove(self, session: Any) -> bool:
        state = session.state
        entry = self._live.pop(state, None)
        self.calls.pop(state, None)
        self._finishers.pop(state, None)
        if entry is None:
            return False
        entry[1].close()
        return True

    # -- one step ------------------------------------------------------------------
    def feed(self, feed: Any) -> None:
        """Lay every waiting program's call out into ``feed`` (a row whose call cannot be laid out fails alone)."""
        for state, call in list(self.calls.items()):
            mark = feed.checkpoint()
            try:
                self._finishers[state] = self.engine.lay_out(state, call, feed)
            except CONTAINED as error:
                feed.rollback(mark)
                self.loop.fail(self._live[state][0], contained(error))

    def absorb(self, scores: Any, decisions: Any) -> None:
        """Send every program its outputs (from ``scores`` through its finisher, or from the engine's ``run``)."""
        from refusion.decoding.scores import project

        if self.outputs is not None:
            outputs, self.outputs = self.outputs, None
        else:
            outputs = {}
            for state, finish in list(self._finishers.items()):
                try:
                    outputs[state] = finish(scores)
                except CONTAINED as error:
                    self.loop.fail(self._live[state][0], contained(error))
        self._finishers.clear()
        self.calls.clear()
        project(_reads(outputs), self.engine.model.mask_token_id)
        for state, value in outputs.items():
            if state in self._live:
                self._send(state, value, decisions)

    def _send(self, state: Any, value: Any, decisions: Any, start: bool = False) -> None:
        """Send the program of ``state`` its value; route what it yields next (a call waits for the next step)."""
        session, program = self._live[state]
        try:
            item = next(program) if start else program.send(value)
        except StopIteration as stop:
            self.loop.finish(session, stop.value)
            return
        except CONTAINED as error:  # this program failed (e.g. a plugin raised): it alone leaves
            self.loop.fail(session, contained(error))
            return
        if isinstance(item, Projection):
            decisions.project(item.scores, item.rows, lambda: self._resume(state, None, decisions))
        elif isinstance(item, Selection):
            decisions.select(
                item.selector,
                item.plan,
                lambda chosen: self._resume(state, chosen, decisions),
                lambda error: self._throw(state, error),
            )
        else:
            self.calls[state] = item

    def _resume(self, state: Any, value: Any, decisions: Any) -> None:
        if state in self._live:
            self._send(state, value, decisions)

    def _throw(self, state: Any, error: BaseException) -> None:
        """A decision failed for this row: it fails."""
        entry = self._live.get(state)
        if entry is not None:
            self.loop.fail(entry[0], error)


def _reads(outputs: dict) -> list[tuple]:
    """What a step's outputs will be read for: each extend's declared rows (with the tokens it fed, for the
    probability of each next one), and each sequence's new next-token row (an AR step reads it)."""
    requests: list[tuple] = [
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
