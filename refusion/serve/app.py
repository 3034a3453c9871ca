"""The FastAPI application: OpenAI's completions and chat completions on a running :class:`Generator`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (plain or
``stream: true`` server-sent events), ``GET /v1/models``, ``GET /health``,
``GET /metrics``. Every error is an OpenAI error body. The app starts the
generator's thread when it starts and, when it stops, cancels what uvicorn's
graceful shutdown left unfinished.

Bodies are bounded (:class:`~refusion.serve.body_limit.BodyLimit`); parsing,
validating and planning a request (tokenising its prompt) run in a worker
thread, one request at a time, so the event loop (``/health``, the streams)
never waits on them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from refusion.errors import ConfigError, QueueFull
from refusion.generator import Generator
from refusion.serve import responses
from refusion.serve.errors import APIError, invalid_json, validation_error
from refusion.serve.body_limit import BodyLimit
from refusion.serve.metrics import ServerMetrics
from refusion.serve.options import Plan, ServeDefaults, ServePolicy, plan_request
from refusion.serve.schema import ChatCompletionRequest, CompletionRequest, InvalidJSON, parse_body
from refusion.serve.session import LiveRequest, pieces

OUTCOMES = {"stop": "stop", "length": "length", "abort": "cancelled", "error": "error", None: "cancelled"}


def create_app(generator: Generator, *, model_name: str = "refusion", defaults: ServeDefaults | None = None,
               retry_after: int = 1, manage_generator: bool = True, policy: ServePolicy | None = None) -> FastAPI:
    """An app serving ``generator`` under the name ``model_name``.

    ``defaults`` are the decoding defaults of every request; ``policy`` what
    requests may send (body size, prompt length, imports, special tokens). A
    full queue answers 503 with ``Retry-After: retry_after``. With
    ``manage_generator`` the app starts the generator's thread on start-up and
    closes it on shutdown (leave it off to drive the generator yourself in
    tests).
    """
    defaults = defaults or ServeDefaults()
    policy = policy or ServePolicy()
    metrics = ServerMetrics(generator)
    planning = threading.Lock()  # the tokenizer and the registry are not promised to be thread-safe

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_generator:
            generator.start()
        yield
        if manage_generator:
            await asyncio.to_thread(generator.close, drain=False, timeout=30)

    app = FastAPI(title="refusion", lifespan=lifespan)
    app.state.generator, app.state.metrics, app.state.policy = generator, metrics, policy
    app.add_middleware(BodyLimit, max_bytes=policy.max_body_bytes)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError) -> JSONResponse:
        metrics.refused(request.url.path, error.status)
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        answer = validation_error(error)
        metrics.refused(request.url.path, answer.status)
        return answer.response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return APIError(error.status_code, str(error.detail), type=kind).response()

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {"status": "closing" if generator.closing else "ok", "live_rows": generator.live_rows,
                "waiting": generator.waiting}
        return JSONResponse(body, status_code=503 if generator.closing or not generator.running else 200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "refusion"}]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await _answer(request, CompletionRequest, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await _answer(request, ChatCompletionRequest, "chat")

    def _prepare(raw: bytes, schema: Any) -> tuple[Any, Plan]:
        """The request as ``schema`` and its plan; raises :class:`APIError`. Runs in a worker thread."""
        try:
            body = parse_body(raw, schema)
        except InvalidJSON as exc:
            raise invalid_json(str(exc)) from None
        except ValidationError as exc:
            raise validation_error(exc) from None
        if body.model != model_name:
            raise APIError(404, f"`model` {body.model!r} is not served here; this server serves {model_name!r}.",
                           type="not_found_error", param="model", code="model_not_found")
        if generator.closing:
            raise _unavailable("The server is shutting down; it takes no new requests.", "shutting_down", retry_after)
        with planning:
            return body, plan_request(body, generator, defaults, policy)

    async def _answer(request: Request, schema: Any, endpoint: str) -> Any:
        body, plan = await run_in_threadpool(_prepare, await request.body(), schema)
        try:
            live = LiveRequest(generator, plan, asyncio.get_running_loop())
        except QueueFull as exc:
            metrics.requests.labels(endpoint, "rejected").inc()
            raise _unavailable(str(exc), "queue_full", retry_after) from None
        except ConfigError as exc:
            if generator.closing:
                raise _unavailable(str(exc), "shutting_down", retry_after) from None
            raise plan.config_error(exc) from None
        metrics.prompt_tokens.inc(len(plan.prompt_ids))
        if body.stream:
            return StreamingResponse(_stream(live, body, endpoint), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _whole(live, body, request, endpoint)

    async def _whole(live: LiveRequest, body: Any, request: Request, endpoint: str) -> JSONResponse:
        chat, text, last = endpoint == "chat", [], None
        try:
            async for piece in pieces(live, disconnected=request.is_disconnected):
                if piece.text and not text:
                    metrics.first_token.labels(endpoint).observe(time.perf_counter() - live.started)
                text.append(piece.text)
                last = piece
        finally:
            reason = last.finish_reason if last is not None else None
            metrics.finished(endpoint, OUTCOMES[reason], len(live.text.tokens), time.perf_counter() - live.started)
        if last is None or last.finish_reason == "abort":
            raise _unavailable("The request was cancelled (the server is shutting down).", "cancelled", retry_after)
        if last.error is not None:
            raise APIError(500, f"Decoding failed: {last.error}", type="server_error", code="decode_failed")
        return JSONResponse(responses.completion(responses.new_id(chat), model_name, chat, "".join(text),
                                                 last.finish_reason, len(live.plan.prompt_ids), last.tokens,
                                                 last.forwards))

    async def _stream(live: LiveRequest, body: Any, endpoint: str):
        chat, ident, reason, sent_text = endpoint == "chat", responses.new_id(endpoint == "chat"), None, False
        try:
            if chat:
                yield responses.sse(responses.chunk(ident, model_name, chat, None, first=True))
            async for piece in pieces(live):
                if piece.error is not None:
                    reason = "error"
                    yield responses.sse(APIError(500, f"Decoding failed: {piece.error}", type="server_error",
                                                 code="decode_failed").body())
                    break
                steps = {"refusion": {"step": piece.step, "commits": list(piece.commits),
                                      "prefix_length": piece.prefix_length}} if body.stream_steps else None
                if piece.text and not sent_text:
                    sent_text = True
                    metrics.first_token.labels(endpoint).observe(time.perf_counter() - live.started)
                if piece.finish_reason is None:
                    if piece.text or (steps and piece.commits):
                        yield responses.sse(responses.chunk(ident, model_name, chat, piece.text, extra=steps))
                    continue
                reason = piece.finish_reason
                if piece.text or steps:
                    yield responses.sse(responses.chunk(ident, model_name, chat, piece.text, extra=steps))
                final = {"refusion": responses.refusion_info(piece.tokens, piece.forwards)}
                yield responses.sse(responses.chunk(ident, model_name, chat, None, reason, extra=final))
                if body.stream_options is not None and body.stream_options.include_usage:
                    yield responses.sse(responses.usage_chunk(ident, model_name, chat, len(live.plan.prompt_ids),
                                                              len(piece.tokens)))
            yield responses.sse("[DONE]")
        finally:
            live.cancel()
            metrics.finished(endpoint, OUTCOMES[reason], len(live.text.tokens), time.perf_counter() - live.started)

    return app


def _unavailable(message: str, code: str, retry_after: int) -> APIError:
    return APIError(503, message, type="server_overloaded" if code == "queue_full" else "service_unavailable",
                    code=code, headers={"Retry-After": str(retry_after)})
