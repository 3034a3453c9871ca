"""A bound on request bodies, as pure ASGI middleware: bytes are counted as they stream in.

A declared ``Content-Length`` over the limit is refused before anything is
read; a body that turns out longer (chunked, or a lying header) is refused as
soon as the count passes the limit. Either way the answer is a 413 with an
OpenAI error body, and at most one chunk over the limit is ever held.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from refusion.errors import BodyTooLarge
from refusion.serve.errors import error_response, too_large

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def declared_length(scope: Message) -> int | None:
    """The request's ``Content-Length`` (``None`` when absent or not a number)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    """Wrap ``app`` so that an HTTP request body over ``max_bytes`` bytes gets 413 instead of reaching it.

    Once the limit is passed, whatever the app answers (it may turn the
    failed read into an error of its own) is dropped for the 413.
    """

    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen, over, started = 0, False, False

        async def counted() -> Message:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    over = True
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def unless_over(message: Message) -> None:
            nonlocal started
            if over:
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counted, unless_over)
        except BodyTooLarge:
            pass
        if over and not started:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Message, receive: Receive, send: Send) -> None:
        await error_response(too_large(self.max_bytes))(scope, receive, send)
