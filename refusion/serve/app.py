"""The FastAPI application: OpenAI's completions and chat completions on a running :class:`Batcher`.

Routes (:mod:`refusion.serve.routes`): ``POST /v1/completions``,
``POST /v1/chat/completions`` (plain or ``stream: true`` server-sent
events), ``GET /v1/models``, ``GET /health``, ``GET /metrics``. Every error
is an OpenAI error body. The app starts the batcher's thread when it starts
and, when it stops, cancels what uvicorn's graceful shutdown left unfinished.
Bodies are bounded (:class:`~refusion.serve.body_limit.BodyLimit`).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from refusion.batcher import Batcher
from refusion.errors import APIError
from refusion.serve.body_limit import BodyLimit
from refusion.serve.errors import error_response, validation_error
from refusion.serve.metrics import ServerMetrics
from refusion.serve.options import ServeDefaults, ServePolicy
from refusion.serve.routes import ROUTERS
from refusion.serve.state import ServerState


def create_app(
    batcher: Batcher,
    *,
    model_name: str = "refusion",
    defaults: ServeDefaults | None = None,
    retry_after: int = 1,
    manage_generator: bool = True,
    policy: ServePolicy | None = None,
) -> FastAPI:
    """An app serving ``batcher`` under the name ``model_name``.

    ``defaults`` are the decoding defaults of every request; ``policy`` what
    requests may send (body size, prompt length, imports, special tokens). A
    full queue answers 503 with ``Retry-After: retry_after``. With
    ``manage_generator`` the app starts the batcher's thread on start-up and
    closes it on shutdown (leave it off to drive the batcher yourself in
    tests).
    """
    policy = policy or ServePolicy()
    server = ServerState(batcher, model_name, defaults or ServeDefaults(), policy, ServerMetrics(batcher), retry_after)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_generator:
            batcher.start()
        yield
        if manage_generator:
            await asyncio.to_thread(batcher.close, drain=False, timeout=30)

    app = FastAPI(title="refusion", lifespan=lifespan)
    app.state.server = server
    app.add_middleware(BodyLimit, max_bytes=policy.max_body_bytes)
    # Starlette types handlers as taking any Exception; each of these is registered for its own class
    app.add_exception_handler(APIError, api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unexpected_error)
    for router in ROUTERS:
        app.include_router(router)
    return app


async def api_error(request: Request, error: APIError) -> JSONResponse:
    """Any :class:`APIError` a route raised, as its response (refused requests are counted)."""
    request.app.state.server.metrics.refused(request.url.path, error.status)
    return error_response(error)


async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
    """FastAPI's own validation failures, as OpenAI error bodies naming the field."""
    answer = validation_error(error)
    request.app.state.server.metrics.refused(request.url.path, answer.status)
    return error_response(answer)


async def http_error(request: Request, error: HTTPException) -> JSONResponse:
    """Starlette's errors (404 for an unknown path, 405 for a wrong method) as OpenAI error bodies."""
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return error_response(APIError(error.status_code, str(error.detail), type=kind))


async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
    """Anything else a route raised (a bug, not the client's): an OpenAI error body with status 500 naming the
    error's type only (its text may hold server details; the server's log has the traceback), never Starlette's
    plain-text page."""
    return error_response(
        APIError(
            500,
            f"The server failed on this request ({type(error).__name__}); its log has the details.",
            type="server_error",
            code="internal_error",
        )
    )
