"""``GET /health``, ``GET /v1/models`` and ``GET /metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from refusion.serve.state import server_of

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 while the batcher runs, 503 (``closing``) once it stops taking requests; its rows and queue."""
    batcher = server_of(request).batcher
    body = {
        "status": "closing" if batcher.closing else "ok",
        "live_rows": batcher.live_rows,
        "waiting": batcher.waiting,
    }
    return JSONResponse(body, status_code=503 if batcher.closing or not batcher.running else 200)


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """The one served model, in OpenAI's list format."""
    name = server_of(request).model_name
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "refusion"}]}


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    """The server's Prometheus metrics (:mod:`refusion.serve.metrics`)."""
    metrics = server_of(request).metrics
    return Response(metrics.render(), media_type=metrics.content_type)
