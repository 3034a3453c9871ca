"""Continuous batching: requests join and leave a running engine between steps.

A :class:`Generator` owns one live engine for one model and a
:class:`~refusion.scheduler.Scheduler` over it. :meth:`Generator.submit`
checks a request at once (bad input fails there, not later) and queues it;
each :meth:`Generator.step` lets the scheduler admit queued requests while
there is room (the :class:`~refusion.config.runtime.RuntimeConfig`'s
``max_rows`` live rows, ``max_batch_tokens`` reserved positions, the engine's
key/value memory) and run one step of the decode loop for every live
request, and reports what each gained as :class:`Progress` events. Finished and cancelled requests leave at once and
their rows and keys/values are reused. Requests may differ in everything a
decoder holds (parts, parameters, sampling, seed) and in ``gen_length``; a
request's tokens are the same as decoding it alone.

Drive it yourself (``generator.step()`` in your own loop, or iterate a
request, which steps the generator until that request has news), or call
:meth:`Generator.start` to step it in a background thread; ``submit``,
``cancel`` and iteration are thread-safe.

Requests are isolated: a request whose ``on_event`` callback raises fails
alone (:class:`~refusion.errors.CallbackError`, its row freed), a step that
raises fails the requests it was running and the generator goes on, and a
request that can make no more progress raises
:class:`~refusion.errors.StalledError` from :meth:`Request.wait` instead of
waiting forever. The model may be shared with other generators and threads
(:func:`refusion.models.base.exclusive`).

Slots commit out of order: ``Progress.prefix_tokens`` are the tokens that
extend the *contiguous committed prefix* of the answer (what a stream can
show), ``Progress.commits`` every slot committed in the step, wherever it is.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from refusion.config.runtime import RuntimeConfig
from refusion.decoding.decoder import Decoder, Prepared, with_text
from refusion.decoding.session import DecodeSession
from refusion.decoding.types import DecodeResult, IterationRecord
from refusion.engines import engine_class
from refusion.engines.factory import check_invariance
from refusion.errors import CallbackError, ConfigError, QueueFull, StalledError
from refusion.scheduler import HOLD_FOR_PREFIX, Scheduler, Ticket
from refusion.validators import check_integer

__all__ = ["HOLD_FOR_PREFIX", "Batcher", "CommittedSlot", "Progress", "Request"]


@attrs.frozen
class CommittedSlot:
    """A slot committed in one step: its index, first offset in the generation region and tokens."""

    slot: int
    offset: int
    tokens: tuple[int, ...]


@attrs.frozen(eq=False)
class Progress:
    """What one request gained in one step of the generator.

    ``iteration`` is the index of the decoder iteration that finished
    (``None`` when the request only finished or was cancelled) and ``step``
    its :class:`~refusion.decoding.types.IterationRecord` when the request
    was submitted with ``record=True``; ``commits`` the slots it committed;
    ``prefix_tokens`` the tokens that extend the contiguous committed prefix
    of the answer, which is now ``prefix_length`` long.
    The last event of a request has ``finished=True`` and carries its
    ``result`` (``None`` if it was cancelled, then ``cancelled=True``, or if
    it failed, then ``error`` holds the exception, e.g. a plugin's).
    """

    request: Request
    step: IterationRecord | None
    commits: tuple[CommittedSlot, ...]
    prefix_tokens: tuple[int, ...]
    prefix_length: int
    iteration: int | None = None
    finished: bool = False
    cancelled: bool = False
    result: DecodeResult | None = None
    error: BaseException | None = None


class Request:
    """A submitted prompt: its state, its events and, once finished, its result.

    ``status`` is ``"waiting"``, ``"running"``, ``"finished"``,
    ``"cancelled"`` or ``"failed"`` (then ``error`` holds the exception). Iterate it for its :class:`Progress` events
    as they
    happen; :meth:`wait` returns the :class:`~refusion.decoding.types.DecodeResult`.
    """

    def __init__(
        self,
        batcher: Batcher,
        index: int,
        decoder: Decoder,
        prepared: Prepared,
        on_event: Callable[[Progress], None] | None,
        *,
        record: bool = False,
    ):
        self.batcher = batcher
        self.id = index
        self.decoder = decoder
        self.prepared = prepared
        self.on_event = on_event
        self.record = record
        self.status = "waiting"
        self.result: DecodeResult | None = None
        self.error: BaseException | None = None
        self.session: DecodeSession | None = None
        self.prefix = 0  # contiguous committed positions reported so far
        self.ended = False  # the prefix reached an EOS: nothing more to stream
        self._seen_steps = 0
        self._events: deque[Progress] = deque()
        self._cancel = False
        self._callback_error: CallbackError | None = None
        self._changed = threading.Condition()
        #: what the scheduler knows of it
        self.ticket = Ticket(decoder, prepared, record=record, owner=self)

    @property
    def prompt_length(self) -> int:
        return self.prepared.prompt.shape[0]

    @property
    def region_length(self) -> int:
        return self.prepared.partition.gen_length

    @property
    def callback_error(self) -> CallbackError | None:
        """The error of this request's ``on_event`` callback, if it raised (the callback is then detached).

        Before the final event it fails the request (``error`` is this);
        on the final event the request has already ended as it did.
        """
        return self._callback_error

    @property
    def done(self) -> bool:
        return self.status in ("finished", "cancelled", "failed")

    def cancel(self) -> None:
        """Stop this request at the next step and free its row (no effect once it is done)."""
        self._cancel = True
        self.batcher._wake()

    def __iter__(self) -> Iterator[Progress]:
        """Its events, in order, until the final one; steps the generator when nobody else does."""
        while True:
            with self._changed:
                if not self._events and self.batcher._thread is not None and not self.done:
                    self._changed.wait(timeout=0.1)
                event = self._events.popleft() if self._events else None
            if event is not None:
                yield event
                if event.finished:
                    return
                continue
            if self.done and not self._events:
                return
            if self.batcher._thread is None:
                self.batcher._step_for(self)

    def wait(self, timeout: float | None = None) -> DecodeResult | None:
        """Block until the request is done (or ``timeout`` seconds passed: then ``None``); its result (``None`` if
        cancelled); re-raises its failure. Without a background thread it steps the generator itself and raises
        :class:`~refusion.errors.StalledError` if a step leaves it with nothing to run."""
        if self.batcher._thread is None:
            import time

            deadline = None if timeout is None else time.monotonic() + timeout
            while not self.done and (deadline is None or time.monotonic() < deadline):
                self.batcher._step_for(self)
        else:
            with self._changed:
                self._changed.wait_for(lambda: self.done, timeout=timeout)
        if self.error is not None:
            raise self.error
        return self.result

    def _emit(self, event: Progress) -> None:
        with self._changed:
            self._events.append(event)
            self._changed.notify_all()
        if self.on_event is not None and self._callback_error is None:
            try:
                self.on_event(event)
            except Exception as exc:  # the caller's code: this request alone pays for it
                error = CallbackError(
                    f"The `on_event` callback of request {self.id} raised {type(exc).__name__}: "
                    f"{exc}; the request fails, the others go on."
                )
                error.__cause__ = exc
                self._callback_error, self._cancel = error, True
                self.batcher._wake()


class Batcher:
    """A long-lived engine session to which prompts can be added while others decode.

    ``model``: a model adapter, a transformers model or a checkpoint path
    (default: the shipped model). The default decoder comes from ``decoder``
    or from ``preset`` and ``params`` as in :func:`refusion.generate`;
    ``gen_length`` is the default length (else the preset's). ``runtime`` (a
    :class:`~refusion.config.runtime.RuntimeConfig`) says which engine runs the
    calls and what it may hold: at most ``max_rows`` requests are live at once,
    their prompts plus generation regions reserve at most ``max_batch_tokens``
    positions, their keys/values at most ``kv_memory`` bytes; others wait in
    the queue (a single request that can never fit is refused at submit).
    ``engine``, ``max_rows``, ``max_tokens`` (``max_batch_tokens``),
    ``prefix_cache`` and ``kv_memory`` may be given as keywords instead. With
    ``max_queue`` set, a submit that finds that many requests waiting raises
    :class:`~refusion.errors.QueueFull`. If a step raises, the requests it was
    running fail with that error and the generator goes on.
    ``prefix_cache``: requests whose prompts start alike reuse the keys and
    values of the full pages they share (:mod:`refusion.cache.prefix`) instead
    of computing them; ``None`` (default) turns it on where the engine can
    (the ``branch`` engine without ``batch_invariant``), ``True`` requires it.
    A request whose prompt shares full pages with a live request's prompt
    that is still being encoded waits (at most :data:`HOLD_FOR_PREFIX` steps)
    and then reuses them, so requests that arrive together with a common
    prefix compute it once.
    """

    def __init__(
        self,
        model: Any = None,
        decoder: Decoder | None = None,
        *,
        runtime: RuntimeConfig | None = None,
        engine: Any = None,
        max_rows: int | None = None,
        max_tokens: int | None = None,
        max_queue: int | None = None,
        gen_length: int | None = None,
        preset: str | None = None,
        tokenizer: Any = None,
        chat: bool | None = None,
        prefix_cache: bool | None = None,
        kv_memory: int | None = None,
        **params: Any,
    ):
        from refusion.api import build_decoder, load_model

        runtime = RuntimeConfig.of(
            runtime,
            engine=engine,
            max_rows=max_rows,
            max_tokens=max_tokens,
            prefix_cache=prefix_cache,
            kv_memory=kv_memory,
        )
        if max_queue is not None:
            check_integer("max_queue", max_queue, 1, why="None = unbounded")
        self.max_queue = max_queue
        self.model = load_model(model, tokenizer=tokenizer)
        if decoder is None:
            decoder, default_length = build_decoder(self.model, preset=preset, **params)
        elif preset is not None or params:
            raise ConfigError("Pass either `decoder` or `preset`/parameters, not both.")
        else:
            default_length = 128
        self.decoder = decoder
        self.gen_length = default_length if gen_length is None else gen_length
        self.chat = chat
        self.runtime = RuntimeConfig.for_decoder(decoder, runtime)
        self.engine = self.runtime.open(self.model, decoder)
        self.scheduler = Scheduler(
            self.engine, self.model, max_rows=self.runtime.max_rows, max_batch_tokens=self.runtime.max_batch_tokens
        )
        self._ids = itertools.count()
        self._requests: dict[int, Request] = {}  # id(ticket) -> request, while waiting or live
        self._lock = threading.Lock()  # guards the queue
        self._step_lock = threading.Lock()  # one step at a time
        self._work = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closing = False

    @property
    def max_rows(self) -> int:
        return self.runtime.max_rows

    @property
    def max_tokens(self) -> int | None:
        """The positions the live requests may reserve (``max_batch_tokens``)."""
        return self.runtime.max_batch_tokens

    # -- requests ----------------------------------------------------------------
    def submit(
        self,
        prompt: Any,
        *,
        gen_length: int | None = None,
        seed: int | None = None,
        decoder: Decoder | None = None,
        on_event: Callable[[Progress], None] | None = None,
        preset: str | None = None,
        allow_special: bool = False,
        record: bool = False,
        **params: Any,
    ) -> Request:
        """Check ``prompt`` (text or token ids) and queue it; returns its :class:`Request`.

        The request decodes with ``decoder``, or with the generator's decoder
        rebuilt from ``preset``/``params`` when given (``temperature=``,
        ``selector="topk"``, ``k=2``, ...), for ``gen_length`` tokens (default:
        the generator's) with sampling seed ``seed`` (default: the decoder's).
        ``on_event`` is called with each :class:`Progress` from the thread
        that steps the generator. Bad input raises
        :class:`~refusion.errors.ConfigError` here (prompt text naming a
        special token too, unless ``allow_special``). ``record``: its events'
        ``step`` and its result's ``iterations`` carry the iteration records
        (without it events carry the commits only).
        """
        from refusion.api import build_decoder
        from refusion.prompts import encode_prompt

        if self._closing:
            raise ConfigError("This generator is closed; it takes no new requests.")
        if decoder is not None and (preset is not None or params):
            raise ConfigError("Pass either `decoder` or `preset`/parameters, not both.")
        length = self.gen_length if gen_length is None else gen_length
        if decoder is None:
            if preset or params:
                params = dict(params)
                params.setdefault("gen_length", length)  # a peer's arguments may depend on it (its step cap)
                decoder = build_decoder(self.model, preset=preset, **params)[0]
            else:
                decoder = self.decoder
        if decoder.engine is not None and engine_class(decoder.engine) is not type(self.engine):
            raise ConfigError(
                f"`engine` {decoder.engine!r} differs from this generator's engine {self.engine.name!r}.",
                param="engine",
            )
        check_invariance(self.engine, decoder.batch_invariant)
        ids = encode_prompt(prompt, self.model.tokenizer, self.chat, allow_special=allow_special)
        prepared = decoder.prepare(self.model, ids, length, seed=seed)
        request = Request(self, next(self._ids), decoder, prepared, on_event, record=bool(record))
        refused = self.scheduler.refusal(request.ticket)
        if refused is not None:
            raise refused
        with self._lock:
            if self.max_queue is not None and self.scheduler.waiting >= self.max_queue:
                raise QueueFull(f"The queue holds `max_queue` ({self.max_queue}) waiting requests; retry later.")
            self._requests[id(request.ticket)] = request
            self.scheduler.submit(request.ticket)
            self._work.notify_all()
        return request

    def cancel(self, request: Request) -> None:
        """Stop ``request`` at the next step (see :meth:`Request.cancel`); it must be a request this generator's
        :meth:`submit` returned (anything else is a :class:`ConfigError` naming ``request``)."""
        if not isinstance(request, Request) or request.batcher is not self:
            what = "another generator's request" if isinstance(request, Request) else repr(request)[:80]
            raise ConfigError(
                f"`request` must be a Request this generator's submit() returned; got {what}.", param="request"
            )
        request.cancel()

    # -- stepping ------------------------------------------------------------------
    @property
    def live_rows(self) -> int:
        """Requests decoding now."""
        return len(self.scheduler.running)

    @property
    def waiting(self) -> int:
        """Requests queued for admission."""
        return self.scheduler.waiting

    @property
    def reserved_tokens(self) -> int:
        """Positions (prompt plus generation region) reserved by the live requests."""
        return self.scheduler.reserved_tokens

    @property
    def closing(self) -> bool:
        """True once :meth:`close` was called: no new requests are taken."""
        return self._closing

    @property
    def running(self) -> bool:
        """True while a background thread steps the generator."""
        return self._thread is not None and self._thread.is_alive()

    def idle(self) -> bool:
        return self.scheduler.idle()

    def step(self) -> list[Progress]:
        """Apply cancellations, admit what fits, run one step of the decode loop; return the events it produced.

        Never raises for a request's failure: an engine or plugin error fails
        the requests that step was running (their ``error``), a raising
        callback fails its own request; the generator stays usable.
        """
        with self._step_lock:
            events: list[Progress] = []
            try:
                self._mark_cancelled()
                outcome = self.scheduler.step()
                for ticket in outcome.cancelled:
                    self._end_cancelled(ticket.owner, events)
                for ticket in outcome.started:
                    request = ticket.owner
                    request.session, request.status = ticket.session, "running"
                finished = {id(ticket) for ticket, _ in outcome.finished}
                for ticket, result in outcome.finished:
                    self._report(ticket.owner, events, result)
                for ticket, error in outcome.failed:
                    self._fail(ticket.owner, error, events)
                for ticket in outcome.running:
                    if id(ticket) not in finished:
                        self._report(ticket.owner, events, None)
                self._mark_cancelled()
                for ticket in self.scheduler.drop_cancelled():  # callbacks that raised during this step
                    self._end_cancelled(ticket.owner, events)
            except Exception as error:  # a fault of the generator's own bookkeeping: fail what was live, go on
                self._fail_running(error, events)
            return events

    def _mark_cancelled(self) -> None:
        for request in list(self._requests.values()):
            if request._cancel:
                self.scheduler.cancel(request.ticket)

    def _step_for(self, request: Request) -> None:
        """One :meth:`step` on behalf of ``request`` (a caller stepping the generator to wait for it)."""
        events = self.step()
        if not request.done and not events and not self.scheduler.holds(request.ticket):
            raise StalledError(
                f"Request {request.id} is {request.status!r} but nothing of it is queued or decoding; "
                "it can make no more progress."
            )

    def _fail_running(self, error: Exception, events: list[Progress]) -> None:
        for ticket in self.scheduler.fail_running(error):
            self._fail(ticket.owner, error, events)

    def _fail(self, request: Request, error: BaseException, events: list[Progress]) -> None:
        self._requests.pop(id(request.ticket), None)
        request.status, request.error, request.session = "failed", error, None
        events.append(self._final_failure(request, error))

    def _final_failure(self, request: Request, error: BaseException) -> Progress:
        event = Progress(request, None, (), (), request.prefix, finished=True, error=error)
        request._emit(event)
        return event

    def run_until_idle(self) -> None:
        """Step until no request is waiting or live."""
        while not self.idle():
            self.step()

    def _end_cancelled(self, request: Request, events: list[Progress]) -> None:
        """End a request taken out of the queue or the batch: cancelled, or failed if its callback raised."""
        self._requests.pop(id(request.ticket), None)
        request.session = None
        if request._callback_error is not None:
            request.status, request.error = "failed", request._callback_error
            events.append(self._final_failure(request, request._callback_error))
        else:
            request.status = "cancelled"
            events.append(self._final(request, None))

    def _report(self, request: Request, events: list[Progress], result: DecodeResult | None) -> None:
        """Events for the iterations ``request`` finished since the last report, and its end."""
        session = request.session
        seen, request._seen_steps = request._seen_steps, len(session.committed)
        new_steps = session.committed[seen:]
        if result is not None:
            result = with_text([result], self.model.tokenizer)[0]
        for i, committed in enumerate(new_steps):
            commits = tuple(
                CommittedSlot(
                    slot,
                    session.partition.slots[slot].offset,
                    tuple(
                        session.tokens[
                            session.partition.slots[slot].offset : session.partition.slots[slot].offset + n
                        ].tolist()
                    ),
                )
                for slot, n in committed
            )
            prefix = self._advance_prefix(request, session, result if i == len(new_steps) - 1 else None)
            record = session.records[seen + i] if session.record else None
            event = Progress(request, record, commits, prefix, request.prefix, iteration=seen + i)
            events.append(event)
            request._emit(event)
        if result is not None:
            self._requests.pop(id(request.ticket), None)
            request.result, request.status, request.session = result, "finished", None
            events.append(self._final(request, result))

    def _advance_prefix(self, request: Request, session: DecodeSession, result: DecodeResult | None) -> tuple[int, ...]:
        if request.ended:
            return ()
        start = request.prefix
        if result is not None:  # the answer is known: the prefix is all of it
            stop = len(result.tokens)
        else:
            missing = (~session.sealed[start:]).nonzero()  # only sealed tokens are final (a reviser may revise)
            stop = start + (int(missing[0]) if len(missing) else session.partition.gen_length - start)
        new = session.tokens[start:stop].tolist()
        eos = self.model.eos_token_ids
        for i, token in enumerate(new):
            if token in eos:
                new = new[: i + 1]
                request.ended = True
                break
        request.prefix = start + len(new)
        return tuple(new)

    def _final(self, request: Request, result: DecodeResult | None) -> Progress:
        event = Progress(request, None, (), (), request.prefix, finished=True, cancelled=result is None, result=result)
        request._emit(event)
        return event

    # -- a background thread -----------------------------------------------------------
    def start(self) -> Batcher:
        """Step the generator in a daemon thread until :meth:`close`; returns ``self``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="refusion-batcher", daemon=True)
            self._thread.start()
        return self

    def _wake(self) -> None:
        with self._lock:
            self._work.notify_all()

    def _loop(self) -> None:
        from refusion.decoding.forms.program import contained

        while True:
            with self._lock:
                while not self._closing and self.scheduler.idle():
                    self._work.wait()
                if self._closing and self.scheduler.idle():
                    return
            try:
                self.step()
            except BaseException as error:  # nothing a request's code raises ends this thread: its requests fail
                self._fail_running(contained(error), [])

    def close(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Take no new requests; finish the queued and live ones (``drain``) or cancel them, stop the thread."""
        with self._lock:
            self._closing = True
            pending = list(self._requests.values())
            self._work.notify_all()
        if not drain:
            for request in pending:
                request._cancel = True
        if self._thread is not None:
            self._wake()
            self._thread.join(timeout)
            self._thread = None
        else:
            self.run_until_idle()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(drain=exc[0] is None)
