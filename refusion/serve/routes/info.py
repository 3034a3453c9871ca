"""``GET /health``, ``GET /v1/models`` and ``GET /metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from refusion.serve.state import server_of

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 while the generator runs, 503 (``closing``) once it stops taking requests; its rows and queue."""
    generator = server_of(request).generator
    body = {
        "status": "closing" if generator.closing else "ok",
        "live_rows": generator.live_rows,
        "waiting": generator.waiting,
    }
    return JSONResponse(body, status_code=503 if generator.closing or not generator.running else 200)


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
