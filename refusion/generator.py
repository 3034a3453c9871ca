"""Continuous batching: requests join and leave a running engine between steps.

A :class:`Generator` owns one live engine for one model. :meth:`Generator.submit`
checks a request at once (bad input fails there, not later) and queues it;
each :meth:`Generator.step` admits queued requests while there is room
(``max_rows`` live sequences, ``max_tokens`` reserved context positions),
runs one engine step for every live request and reports what each gained as
:class:`Progress` events. Finished and cancelled requests leave at once and
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

from refusion.decoding.decoder import Decoder, Prepared, with_text
from refusion.decoding.loop import DecodeLoop
from refusion.decoding.session import DecodeSession
from refusion.decoding.types import DecodeResult, IterationRecord
from refusion.engines import engine_class, open_engine
from refusion.engines.choose import check_invariance
from refusion.errors import CallbackError, ConfigError, QueueFull, StalledError
from refusion.validators import check_boolean, check_integer

#: steps a request may wait, at the head of the queue, for a live request to publish prompt pages it shares (it
#: then reuses them instead of computing them: one forward of waiting; SGLang's in-batch prefix caching does the same)
HOLD_FOR_PREFIX = 2


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
        generator: Generator,
        index: int,
        decoder: Decoder,
        prepared: Prepared,
        on_event: Callable[[Progress], None] | None,
        *,
        record: bool = False,
    ):
        self.generator = generator
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
        self._held = 0  # steps it waited for a live request to publish the prompt pages it shares

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
        self.generator._wake()

    def __iter__(self) -> Iterator[Progress]:
        """Its events, in order, until the final one; steps the generator when nobody else does."""
        while True:
            with self._changed:
                if not self._events and self.generator._thread is not None and not self.done:
                    self._changed.wait(timeout=0.1)
                event = self._events.popleft() if self._events else None
            if event is not None:
                yield event
                if event.finished:
                    return
                continue
            if self.done and not self._events:
                return
            if self.generator._thread is None:
                self.generator._step_for(self)

    def wait(self, timeout: float | None = None) -> DecodeResult | None:
        """Block until the request is done (or ``timeout`` seconds passed: then ``None``); its result (``None`` if
        cancelled); re-raises its failure. Without a background thread it steps the generator itself and raises
        :class:`~refusion.errors.StalledError` if a step leaves it with nothing to run."""
        if self.generator._thread is None:
            import time

            deadline = None if timeout is None else time.monotonic() + timeout
            while not self.done and (deadline is None or time.monotonic() < deadline):
                self.generator._step_for(self)
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
                self.generator._wake()


class Generator:
    """A long-lived engine session to which prompts can be added while others decode.

    ``model``: a model adapter, a transformers model or a checkpoint path
    (default: the shipped model). The default decoder comes from ``decoder``
    or from ``preset`` and ``params`` as in :func:`refusion.generate`;
    ``gen_length`` is the default length (else the preset's). ``engine``
    (name, class or live instance) runs the calls (default: the best for the
    model). At most ``max_rows`` requests are live at once and, if given,
    their prompts plus generation regions reserve at most ``max_tokens``
    positions; others wait in the queue (a single request larger than
    ``max_tokens`` is refused at submit). With ``max_queue`` set, a submit
    that finds that many requests waiting raises
    :class:`~refusion.errors.QueueFull`. If an engine step raises, the
    requests it was running fail with that error and the generator goes on.
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
        engine: Any = None,
        max_rows: int = 16,
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

        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ConfigError(f"`max_rows` must be an integer >= 1; got {max_rows!r}.", param="max_rows")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise ConfigError(f"`max_tokens` must be None or an integer >= 1; got {max_tokens!r}.", param="max_tokens")
        if max_queue is not None and (isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1):
            raise ConfigError(f"`max_queue` must be None or an integer >= 1; got {max_queue!r}.", param="max_queue")
        if prefix_cache is not None:
            check_boolean("prefix_cache", prefix_cache)
        if kv_memory is not None:
            check_integer("kv_memory", kv_memory, 1)
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
        self.max_rows = max_rows
        self.max_tokens = max_tokens
        self.engine = open_engine(self.model, decoder, engine, prefix_cache=prefix_cache, kv_memory=kv_memory)
        self._runner = DecodeLoop(self.engine)
        self._ids = itertools.count()
        self._waiting: deque[Request] = deque()
        self._running: dict[int, Request] = {}  # id(session) -> request
        self._lock = threading.Lock()  # guards the queue
        self._step_lock = threading.Lock()  # one step at a time
        self._work = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closing = False

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
        if decoder is None:
            decoder = build_decoder(self.model, preset=preset, **params)[0] if (preset or params) else self.decoder
        if decoder.engine is not None and engine_class(decoder.engine) is not type(self.engine):
            raise ConfigError(
                f"`engine` {decoder.engine!r} differs from this generator's engine {self.engine.name!r}.",
                param="engine",
            )
        check_invariance(self.engine, decoder.batch_invariant)
        ids = encode_prompt(prompt, self.model.tokenizer, self.chat, allow_special=allow_special)
        prepared = decoder.prepare(self.model, ids, self.gen_length if gen_length is None else gen_length, seed=seed)
        need = prepared.prompt.shape[0] + prepared.partition.gen_length
        if self.max_tokens is not None and need > self.max_tokens:
            raise ConfigError(
                f"The request needs {need} positions (prompt plus generation), more than `max_tokens` "
                f"({self.max_tokens}); use a shorter prompt or gen_length."
            )
        room = self.engine.admission(prepared.prompt.shape[0], prepared.partition.gen_length, alone=True)
        if room is not None:
            raise ConfigError(f"The request cannot run: {room}.", param="kv_memory")
        request = Request(self, next(self._ids), decoder, prepared, on_event, record=bool(record))
        with self._lock:
            if self.max_queue is not None and len(self._waiting) >= self.max_queue:
                raise QueueFull(f"The queue holds `max_queue` ({self.max_queue}) waiting requests; retry later.")
            self._waiting.append(request)
            self._work.notify_all()
        return request

    def cancel(self, request: Request) -> None:
        """Stop ``request`` at the next step (see :meth:`Request.cancel`); it must be a request this generator's
        :meth:`submit` returned (anything else is a :class:`ConfigError` naming ``request``)."""
        if not isinstance(request, Request) or request.generator is not self:
            what = "another generator's request" if isinstance(request, Request) else repr(request)[:80]
            raise ConfigError(
                f"`request` must be a Request this generator's submit() returned; got {what}.", param="request"
            )
        request.cancel()

    # -- stepping ------------------------------------------------------------------
    @property
    def live_rows(self) -> int:
        """Requests decoding now."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests queued for admission."""
        return len(self._waiting)

    @property
    def reserved_tokens(self) -> int:
        """Positions (prompt plus generation region) reserved by the live requests."""
        return sum(r.prompt_length + r.region_length for r in list(self._running.values()))

    @property
    def closing(self) -> bool:
        """True once :meth:`close` was called: no new requests are taken."""
        return self._closing

    @property
    def running(self) -> bool:
        """True while a background thread steps the generator."""
        return self._thread is not None and self._thread.is_alive()

    def idle(self) -> bool:
        return not self._running and not self._waiting

    def step(self) -> list[Progress]:
        """Apply cancellations, admit what fits, run one engine step; return the events it produced.

        Never raises for a request's failure: an engine or plugin error fails
        the requests that step was running (their ``error``), a raising
        callback fails its own request; the generator stays usable.
        """
        with self._step_lock:
            events: list[Progress] = []
            try:
                self._cancel_requested(events)
                self._admit(events)
                if len(self._runner):
                    try:
                        finished = self._runner.step()
                    except Exception:  # the loop failed every live row with the step's error: their requests only
                        self._failed(events)
                        return events
                    for session, result in finished:
                        self._report(self._running.pop(id(session)), events, result)
                    self._failed(events)
                    for request in list(self._running.values()):
                        self._report(request, events, None)
                self._cancel_requested(events)  # callbacks that raised during this step
            except Exception as error:  # a fault of the generator's own bookkeeping: fail what was live, go on
                self._fail_running(error, events)
            return events

    def _step_for(self, request: Request) -> None:
        """One :meth:`step` on behalf of ``request`` (a caller stepping the generator to wait for it)."""
        events = self.step()
        if not request.done and not events and not self._running and request not in self._waiting:
            raise StalledError(
                f"Request {request.id} is {request.status!r} but nothing of it is queued or decoding; "
                "it can make no more progress."
            )

    def _fail_running(self, error: Exception, events: list[Progress]) -> None:
        for key, request in list(self._running.items()):
            try:
                self._runner.cancel(request.session)
            except Exception:
                pass
            del self._running[key]
            request.status, request.error, request.session = "failed", error, None
            events.append(self._final_failure(request, error))

    def _final_failure(self, request: Request, error: BaseException) -> Progress:
        event = Progress(request, None, (), (), request.prefix, finished=True, error=error)
        request._emit(event)
        return event

    def _failed(self, events: list[Progress]) -> None:
        for session, error in self._runner.failures:
            request = self._running.pop(id(session))
            request.status, request.error, request.session = "failed", error, None
            events.append(self._final_failure(request, error))
        self._runner.failures.clear()

    def run_until_idle(self) -> None:
        """Step until no request is waiting or live."""
        while not self.idle():
            self.step()

    def _admit(self, events: list[Progress]) -> None:
        while True:
            with self._lock:
                if not self._waiting or len(self._running) >= self.max_rows:
                    return
                request = self._waiting[0]
                need = request.prompt_length + request.region_length
                if self.max_tokens is not None and self.reserved_tokens + need > self.max_tokens:
                    return
                short = self.engine.admission(request.prompt_length, request.region_length)
                if short is not None and self._running:
                    return  # it fits once a running request gives its pages back (submit checked it fits alone)
                if (
                    self._running
                    and request._held < HOLD_FOR_PREFIX
                    and self.engine.awaited_prefix(request.prepared.prompt)
                ):
                    request._held += 1  # a live request is encoding pages of this prompt: take them next step
                    return
                self._waiting.popleft()
            if request._cancel:
                self._end_cancelled(request, events)
                continue
            if short is not None:  # nothing runs and it still does not fit (the device lost memory): no waiting
                request.status = "failed"
                request.error = ConfigError(f"The request cannot be admitted: {short}.", param="kv_memory")
                events.append(self._final_failure(request, request.error))
                continue
            try:
                session = request.decoder.start(self.model, self.engine, request.prepared, record=request.record)
            except Exception as error:  # e.g. no room for its cache: this request alone fails
                request.status, request.error = "failed", error
                events.append(self._final_failure(request, error))
                continue
            request.session, request.status = session, "running"
            self._running[id(session)] = request
            done = self._runner.add(session)
            if done is not None:
                self._report(self._running.pop(id(session)), events, done)
            self._failed(events)

    def _cancel_requested(self, events: list[Progress]) -> None:
        with self._lock:
            queued = [r for r in self._waiting if r._cancel]
            for r in queued:
                self._waiting.remove(r)
        for request in queued:
            self._end_cancelled(request, events)
        for key, request in list(self._running.items()):
            if request._cancel:
                self._runner.cancel(request.session)
                del self._running[key]
                request.session = None
                self._end_cancelled(request, events)

    def _end_cancelled(self, request: Request, events: list[Progress]) -> None:
        """End a request taken out of the queue or the batch: cancelled, or failed if its callback raised."""
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
    def start(self) -> Generator:
        """Step the generator in a daemon thread until :meth:`close`; returns ``self``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="refusion-generator", daemon=True)
            self._thread.start()
        return self

    def _wake(self) -> None:
        with self._lock:
            self._work.notify_all()

    def _loop(self) -> None:
        from refusion.decoding.forms.program import contained

        while True:
            with self._lock:
                while not self._closing and not self._waiting and not self._running:
                    self._work.wait()
                if self._closing and not self._running and not self._waiting:
                    return
            try:
                self.step()
            except BaseException as error:  # nothing a request's code raises ends this thread: its requests fail
                self._fail_running(contained(error), [])

    def close(self, *, drain: bool = True, timeout: float | None = None) -> None:
        """Take no new requests; finish the queued and live ones (``drain``) or cancel them, stop the thread."""
        with self._lock:
            self._closing = True
            pending = list(self._waiting) + list(self._running.values())
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

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(drain=exc[0] is None)
