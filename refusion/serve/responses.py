"""The OpenAI response objects: completions, chat completions, their stream chunks, usage.

Every object also carries ``refusion``: the answer's token ids (and, at the
end, the forwards it took, the ``max_tokens`` it was decoded for and, when the
server shortened its default ``max_tokens`` to fit the model, a ``note``), or
with ``stream_steps`` each step's committed slots.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


#: the response header that tells the client how many tokens the answer may hold (its ``max_tokens`` or the
#: server's default, shortened to fit the model when the client sent none)
MAX_TOKENS_HEADER = "X-Refusion-Max-Tokens"


def refusion_info(
    tokens: Any, forwards: int | None = None, max_tokens: int | None = None, note: str | None = None
) -> dict[str, Any]:
    """The ``refusion`` object of a finished answer: its token ids, forwards, ``max_tokens`` and any note."""
    info: dict[str, Any] = {"tokens": list(tokens)}
    if forwards is not None:
        info["forwards"] = forwards
    if max_tokens is not None:
        info["max_tokens"] = max_tokens
    if note is not None:
        info["note"] = note
    return info


def completion(
    ident: str,
    model: str,
    chat: bool,
    text: str,
    finish_reason: str | None,
    prompt_tokens: int,
    tokens: Any,
    forwards: int | None,
    max_tokens: int | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """A whole ``text_completion`` or ``chat.completion`` object."""
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish_reason,
            "logprobs": None,
        }
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return {
        "id": ident,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, len(tokens)),
        "refusion": refusion_info(tokens, forwards, max_tokens, note),
    }


def chunk(
    ident: str,
    model: str,
    chat: bool,
    text: str | None,
    finish_reason: str | None = None,
    *,
    first: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One stream chunk: a text delta (``None``: no choice delta) and, at the end, the finish reason."""
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
    body = {
        "id": ident,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    if extra:
        body.update(extra)
    return body


def usage_chunk(ident: str, model: str, chat: bool, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
    return {
        "id": ident,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def sse(data: Any) -> str:
    """One server-sent event: ``data: <json>`` and a blank line (``[DONE]`` as is)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
