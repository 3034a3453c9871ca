"""vLLM's tokenizer endpoints: ``GET /tokenizer_info``, ``POST /tokenize`` and ``POST /detokenize``.

Clients that count tokens on the server use them (lm-evaluation-harness's
``local-completions`` model finds them and tokenises with the served model's
own tokenizer, as it does against vLLM). Bodies are bounded like every other
(:class:`~refusion.serve.body_limit.BodyLimit`); prompt text longer than the
server's prompt bound is refused before it is tokenised.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from refusion.errors import APIError, InvalidJSON
from refusion.serve.errors import invalid_json, validation_error
from refusion.serve.routes.completions import CLIENT_CLOSED
from refusion.serve.schema import parse_body
from refusion.serve.state import ServerState, server_of

router = APIRouter()


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: ``prompt`` text, tokenised as is (``add_special_tokens`` adds the tokenizer's BOS/EOS)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: StrictStr
    model: StrictStr | None = None
    add_special_tokens: StrictBool = True


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: ``tokens``, token ids of the served model."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tokens: list[StrictInt]
    model: StrictStr | None = None


def _tokenizer(server: ServerState) -> Any:
    tokenizer = server.batcher.model.tokenizer
    if tokenizer is None:
        raise APIError(
            404,
            "This server's model has no tokenizer; prompts must be token ids.",
            code="no_tokenizer",
            type="not_found_error",
        )
    return tokenizer


def _check_model(server: ServerState, name: str | None) -> None:
    if name is not None and name != server.model_name:
        raise APIError(
            404,
            f"`model` {name!r} is not served here; this server serves {server.model_name!r}.",
            type="not_found_error",
            param="model",
            code="model_not_found",
        )


async def _read(request: Request, schema: Any) -> tuple[ServerState, Any, Any] | None:
    """``(server, body, tokenizer)`` of a tokenizer request (``None`` when the client hung up mid-body); a bad body,
    another model's name or a model without a tokenizer raise :class:`APIError`."""
    server = server_of(request)
    try:
        raw = await request.body()
    except ClientDisconnect:
        return None
    try:
        body = parse_body(raw, schema)
    except InvalidJSON as exc:
        raise invalid_json(str(exc), exc.param) from None
    except ValidationError as exc:
        raise validation_error(exc) from None
    _check_model(server, body.model)
    return server, body, _tokenizer(server)


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> dict[str, Any]:
    """The tokenizer's special tokens, chat template and the model's positions (vLLM's fields)."""
    server = server_of(request)
    tokenizer = _tokenizer(server)
    return {
        "tokenizer_class": type(tokenizer).__name__,
        "eos_token": tokenizer.eos_token,
        "bos_token": tokenizer.bos_token,
        "pad_token": tokenizer.pad_token,
        "chat_template": getattr(tokenizer, "chat_template", None),
        "model_max_length": server.batcher.model.max_positions,
    }


@router.post("/tokenize")
async def tokenize(request: Request) -> Any:
    """``{"count", "max_model_len", "tokens"}`` of ``prompt``."""
    read = await _read(request, TokenizeRequest)
    if read is None:
        return Response(status_code=CLIENT_CLOSED)
    server, body, tokenizer = read
    bound = server.policy.prompt_chars(server.batcher.model)
    if bound is not None and len(body.prompt) > bound:
        raise APIError(
            400,
            f"`prompt` holds {len(body.prompt)} characters of text; this server takes at most {bound} "
            "(`--max-prompt-chars`).",
            param="prompt",
            code="context_length_exceeded",
        )

    def encode() -> list[int]:
        with server.planning:
            return list(tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"])

    tokens = await run_in_threadpool(encode)
    return {"count": len(tokens), "max_model_len": server.batcher.model.max_positions, "tokens": tokens}


@router.post("/detokenize")
async def detokenize(request: Request) -> Any:
    """``{"prompt"}``: the text of ``tokens``."""
    read = await _read(request, DetokenizeRequest)
    if read is None:
        return Response(status_code=CLIENT_CLOSED)
    server, body, tokenizer = read
    vocab = server.batcher.model.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(
            400, f"`tokens` must be token ids in [0, {vocab}); got {bad[:5]}.", param="tokens", code="invalid_value"
        )
    return {"prompt": tokenizer.decode(body.tokens)}
