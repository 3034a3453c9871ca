"""One HTTP request on the batcher: submit, receive its events in asyncio, stop early, cancel on abandon.

The batcher's thread calls ``on_event``; events are handed to the event
loop with ``call_soon_threadsafe``. :func:`pieces` turns them into
:class:`Piece` s of text for both the streaming and the plain responses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import attrs

from refusion.batcher import Batcher, Progress, Request
from refusion.serve.options import RequestPlan
from refusion.serve.text import StreamText


@attrs.frozen
class Piece:
    """What one step added: ``text`` to show, the step's committed slots, and at the end ``finish_reason``.

    ``error`` is set when the request failed (e.g. a plugin raised);
    ``tokens`` are the answer's tokens so far (cut at ``max_tokens``).
    """

    text: str
    commits: tuple[dict, ...] = ()
    step: int | None = None
    prefix_length: int = 0
    finish_reason: str | None = None
    error: BaseException | None = None
    tokens: tuple[int, ...] = ()
    forwards: int | None = None


class LiveRequest:
    """A submitted request and the asyncio queue its events arrive on; ``started`` is the submit time."""

    def __init__(self, batcher: Batcher, plan: RequestPlan, loop: asyncio.AbstractEventLoop):
        self.queue: asyncio.Queue[Progress] = asyncio.Queue()
        self.started = time.perf_counter()
        self.plan = plan

        def on_event(event: Progress) -> None:
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, event)
            except RuntimeError:  # the event loop is closed: nobody listens any more
                pass

        self.request: Request = batcher.submit(
            plan.prompt_ids, decoder=plan.decoder, gen_length=plan.gen_length, seed=plan.seed, on_event=on_event
        )
        model = batcher.model
        self.text = StreamText(model.tokenizer, model.eos_token_ids, max_tokens=plan.gen_length, stops=plan.stops)

    def cancel(self) -> None:
        if not self.request.done:
            self.request.cancel()


def request_forwards(request: Any) -> int | None:
    """Forwards that served ``request`` so far: from its live session, or from its result once it has finished."""
    session = request.session
    if session is not None:
        return session.forwards
    result = request.result  # the batcher sets the result before it drops the session
    return None if result is None else result.forwards


async def pieces(live: LiveRequest, *, poll: float = 0.5, disconnected: Any = None) -> AsyncIterator[Piece]:
    """The request's pieces until it ends; cancels it on a stop string, a disconnect or when abandoned.

    ``disconnected`` (an async callable) is asked about every ``poll``
    seconds; when it says True the request is cancelled.
    """
    text, checked = live.text, time.perf_counter()
    try:
        while True:
            try:
                event = await asyncio.wait_for(live.queue.get(), poll)
            except asyncio.TimeoutError:
                event = None
            if disconnected is not None and time.perf_counter() - checked >= poll:
                checked = time.perf_counter()
                if await disconnected():
                    live.cancel()
                    return
            if event is None:
                continue
            commits = tuple({"slot": c.slot, "offset": c.offset, "tokens": list(c.tokens)} for c in event.commits)
            if event.finished:
                if event.error is not None:
                    yield Piece("", finish_reason="error", error=event.error, tokens=tuple(text.tokens))
                    return
                if event.cancelled:  # only the server cancels: the client is gone or the server stops
                    yield Piece(text.finish("abort"), finish_reason=text.finish_reason, tokens=tuple(text.tokens))
                    return
                delta = text.finish("length")
                yield Piece(
                    delta,
                    finish_reason=text.finish_reason,
                    tokens=tuple(text.tokens),
                    forwards=event.result.forwards if event.result is not None else None,
                    prefix_length=event.prefix_length,
                )
                return
            delta = text.feed(event.prefix_tokens)
            if text.done:  # the answer is complete for the client (EOS, stop string or max_tokens)
                forwards = request_forwards(live.request)
                live.cancel()
                yield Piece(
                    delta,
                    commits,
                    event.iteration,
                    event.prefix_length,
                    text.finish_reason,
                    tokens=tuple(text.tokens),
                    forwards=forwards,
                )
                return
            yield Piece(delta, commits, event.iteration, event.prefix_length)
    finally:
        live.cancel()
