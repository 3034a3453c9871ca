"""``POST /v1/completions`` and ``POST /v1/chat/completions``: plain answers or ``stream: true`` server-sent events.

A request is parsed, validated and planned (its prompt tokenised) in a
worker thread, one at a time, so the event loop (``/health``, the streams)
never waits on it; then it joins the running batch (:class:`LiveRequest`).
The body must be JSON (``Content-Type: application/json``, or no content
type at all); a client that hangs up before its body arrived is one line in
the log at INFO, not an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from refusion.errors import APIError, ConfigError, InvalidJSON, QueueFull
from refusion.serve import responses
from refusion.serve.errors import invalid_json, validation_error
from refusion.serve.options import RequestPlan, plan_request
from refusion.serve.schema import ChatCompletionRequest, CompletionRequest, parse_body
from refusion.serve.session import LiveRequest, pieces
from refusion.serve.state import ServerState, server_of

router = APIRouter()
log = logging.getLogger("refusion.serve")
#: the status logged for a request whose client hung up before it was answered (nginx's "client closed request")
CLIENT_CLOSED = 499

#: a finished request's ``finish_reason`` -> its ``outcome`` label in the metrics
OUTCOMES = {"stop": "stop", "length": "length", "abort": "cancelled", "error": "error", None: "cancelled"}


@router.post("/v1/completions")
async def completions(request: Request) -> Any:
    return await answer(request, CompletionRequest, "completions")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    return await answer(request, ChatCompletionRequest, "chat")


def prepare(server: ServerState, raw: bytes, schema: Any) -> tuple[Any, RequestPlan]:
    """The request as ``schema`` and its plan; raises :class:`APIError`. Runs in a worker thread."""
    try:
        body = parse_body(raw, schema)
    except InvalidJSON as exc:
        raise invalid_json(str(exc), exc.param) from None
    except ValidationError as exc:
        raise validation_error(exc) from None
    if body.model != server.model_name:
        raise APIError(
            404,
            f"`model` {body.model!r} is not served here; this server serves {server.model_name!r}.",
            type="not_found_error",
            param="model",
            code="model_not_found",
        )
    if server.batcher.closing:
        raise server.unavailable("The server is shutting down; it takes no new requests.", "shutting_down")
    with server.planning:
        return body, plan_request(body, server.batcher, server.defaults, server.policy)


def check_content_type(request: Request) -> None:
    """415 unless the body is declared JSON (``application/json`` or ``application/*+json``) or not declared."""
    declared = request.headers.get("content-type")
    if declared is None:
        return
    kind = declared.split(";")[0].strip().lower()
    if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
        raise APIError(
            415,
            f"The body must be JSON, sent with `Content-Type: application/json`; got {declared[:100]!r}.",
            param=None,
            code="unsupported_media_type",
        )


async def answer(request: Request, schema: Any, endpoint: str) -> Any:
    """Plan the request, submit it, and answer it whole or as a stream."""
    server = server_of(request)
    check_content_type(request)
    try:
        raw = await request.body()
    except ClientDisconnect:
        log.info("%s %s: the client hung up before sending the whole body", request.method, request.url.path)
        return Response(status_code=CLIENT_CLOSED)
    body, plan = await run_in_threadpool(prepare, server, raw, schema)
    try:
        live = LiveRequest(server.batcher, plan, asyncio.get_running_loop())
    except QueueFull as exc:
        server.metrics.requests.labels(endpoint, "rejected").inc()
        raise server.unavailable(str(exc), "queue_full") from None
    except ConfigError as exc:
        if server.batcher.closing:
            raise server.unavailable(str(exc), "shutting_down") from None
        raise plan.config_error(exc) from None
    server.metrics.prompt_tokens.inc(len(plan.prompt_ids))
    length = {responses.MAX_TOKENS_HEADER: str(plan.gen_length)}
    if body.stream:
        return StreamingResponse(
            stream(server, live, body, endpoint),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **length},
        )
    response = await whole(server, live, request, endpoint)
    response.headers.update(length)
    return response


async def whole(server: ServerState, live: LiveRequest, request: Request, endpoint: str) -> JSONResponse:
    """The whole answer once the request ends; cancelled if the client disconnects first."""
    chat, text, last = endpoint == "chat", list[str](), None
    metrics = server.metrics
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
        raise server.unavailable("The request was cancelled (the server is shutting down).", "cancelled")
    if last.error is not None:
        raise APIError(500, f"Decoding failed: {last.error}", type="server_error", code="decode_failed")
    return JSONResponse(
        responses.completion(
            responses.new_id(chat),
            server.model_name,
            chat,
            "".join(text),
            last.finish_reason,
            len(live.plan.prompt_ids),
            last.tokens,
            last.forwards,
            live.plan.gen_length,
            live.plan.note,
        )
    )


async def stream(server: ServerState, live: LiveRequest, body: Any, endpoint: str):
    """The answer's server-sent events: text deltas, the finish reason, usage if asked, then ``[DONE]``."""
    chat, ident, reason, sent_text = endpoint == "chat", responses.new_id(endpoint == "chat"), None, False
    name, metrics = server.model_name, server.metrics
    try:
        if chat:
            yield responses.sse(responses.chunk(ident, name, chat, None, first=True))
        async for piece in pieces(live):
            if piece.error is not None:
                reason = "error"
                yield responses.sse(
                    APIError(500, f"Decoding failed: {piece.error}", type="server_error", code="decode_failed").body()
                )
                break
            steps = (
                {"refusion": {"step": piece.step, "commits": list(piece.commits), "prefix_length": piece.prefix_length}}
                if body.stream_steps
                else None
            )
            if piece.text and not sent_text:
                sent_text = True
                metrics.first_token.labels(endpoint).observe(time.perf_counter() - live.started)
            if piece.finish_reason is None:
                if piece.text or (steps and piece.commits):
                    yield responses.sse(responses.chunk(ident, name, chat, piece.text, extra=steps))
                continue
            reason = piece.finish_reason
            if piece.text or steps:
                yield responses.sse(responses.chunk(ident, name, chat, piece.text, extra=steps))
            final = {
                "refusion": responses.refusion_info(piece.tokens, piece.forwards, live.plan.gen_length, live.plan.note)
            }
            yield responses.sse(responses.chunk(ident, name, chat, None, reason, extra=final))
            if body.stream_options is not None and body.stream_options.include_usage:
                yield responses.sse(
                    responses.usage_chunk(ident, name, chat, len(live.plan.prompt_ids), len(piece.tokens))
                )
        yield responses.sse("[DONE]")
    finally:
        live.cancel()
        metrics.finished(endpoint, OUTCOMES[reason], len(live.text.tokens), time.perf_counter() - live.started)
