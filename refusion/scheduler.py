"""The scheduler: which waiting request joins the decode loop, and when, and the order of a step.

A :class:`Scheduler` holds the requests waiting to be admitted (:class:`Ticket` s) and the
:class:`~refusion.decoding.loop.DecodeLoop` of one engine. Each :meth:`Scheduler.step`:

1. drops the tickets cancelled since the last step (waiting ones, and running ones: their rows leave the loop and
   give their pages back);
2. admits waiting tickets in order while they fit: at most ``max_rows`` live rows, at most ``max_batch_tokens``
   positions (prompts plus generation regions) reserved, and the engine's key/value memory (a ticket waits until a
   running row gives its pages back; one that reuses prompt pages a live row is still encoding waits at most
   :data:`HOLD_FOR_PREFIX` steps, then takes them);
3. runs one loop step (one forward for every live row).

It reports what happened to each ticket (:class:`Outcome`). A ticket that could never fit is refused before it
waits (:meth:`Scheduler.refusal`). It knows nothing of threads, events or streams (the
:class:`~refusion.batcher.Batcher`'s) and nothing of how rows decode (the loop's).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import attrs

from refusion.decoding.loop import DecodeLoop
from refusion.errors import ConfigError
from refusion.limits import DEFAULT_MAX_ROWS

#: steps a ticket may wait, at the head of the queue, for a live row to publish prompt pages it shares (it then
#: reuses them instead of computing them: one forward of waiting; SGLang's in-batch prefix caching does the same)
HOLD_FOR_PREFIX = 2


@attrs.define(eq=False)
class Ticket:
    """One request as the scheduler sees it: its decoder, its checked prompt and partition (``prepared``, a
    :class:`~refusion.decoding.decoder.Prepared`), whether it keeps iteration records, and once admitted its
    session. ``owner``: whatever the caller attaches (the Generator's request)."""

    decoder: Any
    prepared: Any
    record: bool = False
    owner: Any = None
    session: Any = None
    held: int = 0
    cancelled: bool = False

    @property
    def prompt_length(self) -> int:
        return int(self.prepared.prompt.shape[0])

    @property
    def region_length(self) -> int:
        return int(self.prepared.partition.gen_length)


@attrs.define
class Outcome:
    """What one :meth:`Scheduler.step` did to the tickets: ``started`` (admitted, their session set),
    ``finished`` (with results), ``failed`` (with errors), ``cancelled``, and ``running`` (still live after it)."""

    started: list[Ticket] = attrs.field(factory=list)
    finished: list[tuple[Ticket, Any]] = attrs.field(factory=list)
    failed: list[tuple[Ticket, BaseException]] = attrs.field(factory=list)
    cancelled: list[Ticket] = attrs.field(factory=list)
    running: list[Ticket] = attrs.field(factory=list)


class Scheduler:
    """Admission and the step order for one engine (see the module docstring). ``model`` is the engine's model."""

    def __init__(
        self, engine: Any, model: Any, *, max_rows: int = DEFAULT_MAX_ROWS, max_batch_tokens: int | None = None
    ):
        self.engine = engine
        self.model = model
        self.max_rows = max_rows
        self.max_batch_tokens = max_batch_tokens
        self.loop = DecodeLoop(engine)
        self._waiting: deque[Ticket] = deque()
        self._running: dict[int, Ticket] = {}  # id(session) -> ticket
        self._lock = threading.Lock()  # guards the queue (submit may come from any thread)

    # -- the queue -----------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> list[Ticket]:
        return list(self._running.values())

    @property
    def reserved_tokens(self) -> int:
        """Positions (prompts plus generation regions) the running tickets reserved."""
        return sum(t.prompt_length + t.region_length for t in list(self._running.values()))

    def idle(self) -> bool:
        return not self._running and not self._waiting

    def holds(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` is waiting or running here."""
        return ticket in self._waiting or (ticket.session is not None and id(ticket.session) in self._running)

    def refusal(self, ticket: Ticket) -> ConfigError | None:
        """Why ``ticket`` could never be admitted, even alone (``None`` when it can): too many positions for
        ``max_batch_tokens``, or too much key/value memory for the engine's budget."""
        need = ticket.prompt_length + ticket.region_length
        if self.max_batch_tokens is not None and need > self.max_batch_tokens:
            return ConfigError(
                f"The request needs {need} positions (prompt plus generation), more than `max_batch_tokens` "
                f"({self.max_batch_tokens}); use a shorter prompt or gen_length.",
                param="max_batch_tokens",
            )
        room = self.engine.admission(ticket.prompt_length, ticket.region_length, alone=True)
        if room is not None:
            return ConfigError(f"The request cannot run: {room}.", param="kv_memory")
        return None

    def submit(self, ticket: Ticket) -> None:
        """Queue ``ticket`` (checked with :meth:`refusal` by the caller)."""
        with self._lock:
            self._waiting.append(ticket)

    def cancel(self, ticket: Ticket) -> None:
        """Cancel ``ticket`` at the next step (waiting or running)."""
        ticket.cancelled = True

    # -- one step --------------------------------------------------------------------
    def step(self) -> Outcome:
        """Cancellations, admissions, one loop step (see the module docstring)."""
        outcome = Outcome()
        self._cancel(outcome)
        self._admit(outcome)
        if len(self.loop):
            try:
                finished = self.loop.step()
            except Exception:  # the loop failed every live row with the step's error: their tickets only
                finished = []
            for session, result in finished:
                outcome.finished.append((self._running.pop(id(session)), result))
        self._collect_failures(outcome)
        outcome.running = list(self._running.values())
        return outcome

    def _cancel(self, outcome: Outcome) -> None:
        outcome.cancelled += self.drop_cancelled()

    def drop_cancelled(self) -> list[Ticket]:
        """Take the tickets cancelled so far out now (waiting ones from the queue, running ones from the loop,
        their pages given back); returns them."""
        with self._lock:
            dropped = [t for t in self._waiting if t.cancelled]
            for ticket in dropped:
                self._waiting.remove(ticket)
        for key, ticket in list(self._running.items()):
            if ticket.cancelled:
                self.loop.cancel(ticket.session)
                del self._running[key]
                dropped.append(ticket)
        return dropped

    def _admit(self, outcome: Outcome) -> None:
        while True:
            with self._lock:
                if not self._waiting or len(self._running) >= self.max_rows:
                    return
                ticket = self._waiting[0]
                need = ticket.prompt_length + ticket.region_length
                if self.max_batch_tokens is not None and self.reserved_tokens + need > self.max_batch_tokens:
                    return
                short = self.engine.admission(ticket.prompt_length, ticket.region_length)
                if short is not None and self._running:
                    return  # it fits once a running row gives its pages back (the caller checked it fits alone)
                if (
                    self._running
                    and ticket.held < HOLD_FOR_PREFIX
                    and self.engine.awaited_prefix(ticket.prepared.prompt)
                ):
                    ticket.held += 1  # a live row is encoding pages of this prompt: take them next step
                    return
                self._waiting.popleft()
            if ticket.cancelled:
                outcome.cancelled.append(ticket)
                continue
            if short is not None:  # nothing runs and it still does not fit (the device lost memory): no waiting
                outcome.failed.append(
                    (ticket, ConfigError(f"The request cannot be admitted: {short}.", param="kv_memory"))
                )
                continue
            try:
                session = ticket.decoder.start(self.model, self.engine, ticket.prepared, record=ticket.record)
            except Exception as error:  # e.g. an option the engine refuses: this ticket alone fails
                outcome.failed.append((ticket, error))
                continue
            ticket.session = session
            self._running[id(session)] = ticket
            outcome.started.append(ticket)
            done = self.loop.add(session)
            if done is not None:
                outcome.finished.append((self._running.pop(id(session)), done))
            self._collect_failures(outcome)

    def _collect_failures(self, outcome: Outcome) -> None:
        for session, error in self.loop.failures:
            ticket = self._running.pop(id(session), None)
            if ticket is not None:
                outcome.failed.append((ticket, error))
        self.loop.failures.clear()

    def fail_running(self, error: BaseException) -> list[Ticket]:
        """Fail every running ticket with ``error`` (a fault of the caller's own bookkeeping); their rows leave."""
        failed = list(self._running.values())
        for ticket in failed:
            try:
                self.loop.cancel(ticket.session)
            except Exception:
                pass
        self._running.clear()
        return failed


def decode_all(engine: Any, model: Any, tickets: list[Ticket]) -> list[Any]:
    """Decode ``tickets`` to the end on ``engine`` (admitted as they fit, all at once where memory allows); their
    results in order. The first failure is raised once every other ticket is done or cancelled."""
    scheduler = Scheduler(engine, model, max_rows=max(1, len(tickets)))
    for ticket in tickets:
        refused = scheduler.refusal(ticket)
        if refused is not None:
            raise refused
    before = engine.counters.as_dict()  # an engine lent again: these tickets' part of its counters
    for ticket in tickets:
        scheduler.submit(ticket)
    results: dict[int, Any] = {}
    failure: BaseException | None = None
    while not scheduler.idle():
        outcome = scheduler.step()
        for ticket, result in outcome.finished:
            results[id(ticket)] = result
        if outcome.failed and failure is None:
            failure = outcome.failed[0][1]
            for ticket in tickets:  # the first failure ends the batch
                scheduler.cancel(ticket)
        if not (outcome.started or outcome.finished or outcome.failed or outcome.cancelled or outcome.running):
            if not scheduler.idle():  # pragma: no cover - a ticket that fits alone is always admitted
                raise RuntimeError("internal error: the scheduler stalled")
    if failure is not None:
        raise failure
    totals = _since(engine.counters.as_dict(), before)
    return [attrs.evolve(results[id(t)], engine_totals=totals) for t in tickets]


def _since(now: Any, before: Any) -> Any:
    """Counters (nested numbers) ``now`` less ``before``."""
    if isinstance(now, dict):
        return {key: _since(value, before.get(key, 0)) for key, value in now.items()}
    if hasattr(now, "_asdict"):
        return type(now)(*(a - b for a, b in zip(now, before)))
    return now - before
