"""Request bodies of the OpenAI endpoints, with refusion's own fields; pydantic checks the types.

Unknown fields are refused (400 naming the field) rather than ignored, so a
typo never passes silently. OpenAI's fields that refusion cannot honour
(penalties, ``logit_bias``, ``logprobs``, ``echo``, ``best_of``, ``suffix``,
tools, response formats) are accepted with their neutral values, which stock
clients send (LangChain's OpenAI wrapper sends ``frequency_penalty: 0``), and
refused with any other value, naming the field (:func:`unhonoured`), as vLLM
does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from refusion.errors import InvalidJSON

ParamValue = StrictBool | StrictInt | StrictFloat | StrictStr | None
#: stop strings a request may send (OpenAI takes 4; lm-evaluation-harness sends a task's stops and the EOS text)
MAX_STOPS = 16
Body = TypeVar("Body", bound=BaseModel)


JSON_TYPES = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


class _Constant(float):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a body, kept (as a float that says which) until its field is known."""

    name: str


def _constant(name: str) -> _Constant:
    value = _Constant({"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name])
    value.name = name
    return value


def _find_constant(value: Any, path: str = "") -> tuple[str, str] | None:
    """``(field path, constant)`` of the first ``NaN``/``Infinity`` in ``value`` (``temperature``, ``params.k``)."""
    if isinstance(value, _Constant):
        return path, value.name
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _find_constant(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key)
        if found is not None:
            return found
    return None


def parse_body(raw: bytes, schema: type[Body]) -> Body:
    """``raw`` (a request body) as ``schema``: raises :class:`InvalidJSON` or pydantic's ``ValidationError``.

    Strict JSON: ``NaN`` and ``Infinity`` are refused naming the field that
    holds them (``param``), as are nesting deeper than Python's recursion limit
    and integers of more than 4300 digits.
    """
    try:
        data = json.loads(raw, parse_constant=_constant)
    except RecursionError:
        raise InvalidJSON("it is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer with too many digits
        raise InvalidJSON(str(exc)) from None
    if not isinstance(data, dict):
        raise InvalidJSON(f"the body must be a JSON object, not {JSON_TYPES.get(type(data), 'that')}")
    found = _find_constant(data)
    if found is not None:
        raise InvalidJSON(f"`{found[0]}` is {found[1]}, which is not a JSON number", param=found[0])
    return schema.model_validate(data)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class DecodingFields(BaseModel):
    """Fields shared by both endpoints: OpenAI's sampling and length fields plus refusion's parts and parameters.

    ``params`` holds part parameters as a mapping (``{"k": 2, "selector.k": 2}``)
    or as ``-p``-style strings (``["k=2"]``). ``stream_steps`` adds a
    ``refusion`` object with the committed slots to every stream chunk.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    model: StrictStr
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=0)
    stop: StrictStr | list[StrictStr] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    preset: StrictStr | None = None
    partitioner: StrictStr | None = None
    selector: StrictStr | None = None
    infiller: StrictStr | None = None
    reorderer: StrictStr | None = None
    reviser: StrictStr | None = None
    params: dict[StrictStr, ParamValue] | list[StrictStr] | None = None
    stream_steps: bool = False
    # OpenAI's fields that refusion cannot honour: accepted with their neutral values only (:func:`unhonoured`)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[StrictStr, float] | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else value
        if stops is not None and (len(stops) > MAX_STOPS or any(not s for s in stops)):
            raise ValueError(f"stop must be at most {MAX_STOPS} non-empty strings")
        return value

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(DecodingFields):
    """``POST /v1/completions``: ``prompt`` is text or token ids (or a list holding one of them)."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: bool | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and not isinstance(value[0], int):
            if len(value) != 1:
                raise ValueError("send one prompt per request (a list must hold exactly one)")
            value = value[0]
        if not value:
            raise ValueError("the prompt is empty")
        return value


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(DecodingFields):
    """``POST /v1/chat/completions``: ``messages`` in OpenAI's format (text content only)."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: StrictInt | None = None
    response_format: dict[StrictStr, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: StrictStr | dict[StrictStr, Any] | None = None
    parallel_tool_calls: bool | None = None

    @property
    def length(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


#: OpenAI fields refusion cannot honour: field -> (is the value neutral?, what to send instead)
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "frequency_penalty": (lambda v: v == 0, "0 (refusion applies no penalties)"),
    "presence_penalty": (lambda v: v == 0, "0 (refusion applies no penalties)"),
    "logit_bias": (lambda v: not v, "{} (refusion does not bias logits)"),
    "logprobs": (lambda v: v is False, "false or null (refusion returns no log probabilities)"),
    "top_logprobs": (lambda v: v == 0, "0 or null (refusion returns no log probabilities)"),
    "echo": (lambda v: v is False, "false (the prompt is not repeated in the answer)"),
    "best_of": (lambda v: v == 1, "1 (one answer per request)"),
    "suffix": (lambda v: v == "", "an empty string (refusion does not insert text before a suffix)"),
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"} (no JSON mode)'),
    "tools": (lambda v: not v, "[] (refusion serve does not call tools)"),
    "tool_choice": (lambda v: v in ("none", "auto"), '"none" (refusion serve does not call tools)'),
}


def unhonoured(body: BaseModel) -> tuple[str, Any, str] | None:
    """``(field, value, what is accepted)`` for the first OpenAI field of ``body`` that asks for something refusion
    cannot do (a non-neutral value of a :data:`NEUTRAL` field; ``tool_choice`` other than ``none`` or ``auto``, or
    ``auto`` with tools), else ``None``. Fields left out or ``null`` are neutral."""
    fields = type(body).model_fields
    for name, (neutral, accepted) in NEUTRAL.items():
        if name not in fields:
            continue
        value = getattr(body, name)
        if value is not None and not neutral(value):
            return name, value, accepted
    return None
