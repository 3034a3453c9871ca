"""OpenAI-style error responses: ``{"error": {"message", "type", "param", "code"}}``, with the HTTP status."""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from refusion.errors import APIError, ConfigError, renamed


def error_response(error: APIError) -> JSONResponse:
    """The HTTP response of ``error``: its status, its headers and OpenAI's error body."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


#: decoder-side names that a request spells differently
REQUEST_FIELDS = {"gen_length": "max_tokens", "prompt_ids": "prompt"}


def bad_request(error: ConfigError, *, prompt_field: str = "prompt", params: Any = ()) -> APIError:
    """A 400 for a :class:`ConfigError`, naming the request field from the error's ``param``.

    A part parameter sent in ``params`` is named ``params.<key>`` (``params.selector.steps`` when it was sent
    for one part); the prompt
    is ``prompt_field`` (``messages`` for chat).
    """
    names = dict(REQUEST_FIELDS, prompt=prompt_field)
    if prompt_field != "prompt":
        names["prompt_ids"] = prompt_field
    if error.param is not None and error.param in params:
        names[error.param] = f"params.{error.param}"
    elif error.param is not None:  # a part's parameter sent for one part (`selector.steps`): that key
        dotted = [key for key in params if isinstance(key, str) and key.endswith(f".{error.param}")]
        if len(dotted) == 1:
            names[error.param] = f"params.{dotted[0]}"
    request = renamed(error, names)
    message = str(request).replace("gen_length <=", "max_tokens <=")
    return APIError(400, message, param=request.param, code="invalid_value")


def validation_error(error: RequestValidationError | ValidationError) -> APIError:
    """A 400 for pydantic's first complaint (from FastAPI or from validating a body), naming the field as
    ``messages[0].content``."""
    first = error.errors()[0]
    loc = [part for part in first.get("loc", ()) if part != "body"]
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not (param and part in ("str", "list", "int", "float", "bool")) and "[" not in str(part):
            param += f".{part}" if param else str(part)
    if first.get("type") == "json_invalid":
        return APIError(400, f"The body is not valid JSON: {first.get('msg')}.", code="invalid_json")
    if first.get("type") == "missing":
        return APIError(400, f"`{param}` is required.", param=param or None, code="missing")
    if first.get("type") == "extra_forbidden":
        return APIError(
            400,
            f"`{param}` is not a field of this endpoint (see docs/serving.md for the fields).",
            param=param or None,
            code="unknown_field",
        )
    got = repr(first.get("input"))
    got = got if len(got) <= 200 else got[:200] + "..."  # the field may be huge; the error need not be
    return APIError(400, f"`{param}`: {first.get('msg')}; got {got}.", param=param or None, code="invalid_type")


def invalid_json(reason: str, param: str | None = None) -> APIError:
    """A 400 for a body that is not one JSON object; ``param`` names the field at fault when one is."""
    return APIError(400, f"The body is not valid JSON: {reason}.", param=param, code="invalid_json")


def too_large(limit: int) -> APIError:
    """The 413 for a body over ``limit`` bytes."""
    return APIError(
        413,
        f"The request body is larger than this server's limit of {limit} bytes (`--max-body-bytes`).",
        param=None,
        code="request_too_large",
    )
