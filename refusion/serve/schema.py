"""Request bodies of the OpenAI endpoints, with refusion's own fields; pydantic checks the types.

Unknown fields are refused (400 naming the field) rather than ignored, so a
typo or an unsupported OpenAI option never passes silently.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar, Union

from refusion.errors import InvalidJSON
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

ParamValue = Union[StrictBool, StrictInt, StrictFloat, StrictStr, None]
Body = TypeVar("Body", bound=BaseModel)


JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}


def _no_constant(name: str) -> Any:
    raise InvalidJSON(f"{name} is not a JSON number")


def parse_body(raw: bytes, schema: type[Body]) -> Body:
    """``raw`` (a request body) as ``schema``: raises :class:`InvalidJSON` or pydantic's ``ValidationError``.

    Strict JSON: ``NaN`` and ``Infinity`` are refused, as are nesting deeper
    than Python's recursion limit and integers of more than 4300 digits.
    """
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except InvalidJSON:
        raise
    except RecursionError:
        raise InvalidJSON("it is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer with too many digits
        raise InvalidJSON(str(exc)) from None
    if not isinstance(data, dict):
        raise InvalidJSON(f"the body must be a JSON object, not {JSON_TYPES.get(type(data), 'that')}")
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
    params: dict[StrictStr, ParamValue] | list[StrictStr] | None = None
    stream_steps: bool = False

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
        if stops is not None and (len(stops) > 4 or any(not s for s in stops)):
            raise ValueError("stop must be at most 4 non-empty strings")
        return value

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(DecodingFields):
    """``POST /v1/completions``: ``prompt`` is text or token ids (or a list holding one of them)."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]

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

    @property
    def length(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
