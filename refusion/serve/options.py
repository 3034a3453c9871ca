"""From a request's fields to what the generator takes: prompt ids, a decoder, a length and a seed.

Everything is checked here, before the request is queued, so bad input is a
400 naming the field and never reaches the running batch. The server's own
defaults (``refusion serve --preset/--selector/-p ...``) hold for every
request; a request's fields override them.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from refusion.api import build_decoder
from refusion.prompts import encode_prompt
from refusion.config import PART_KINDS, SAMPLING_PARAMS
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError, UnknownNameError
from refusion.config.params import parse_param
from refusion.plugins.registry import registry
from refusion.serve.errors import APIError, bad_request
from refusion.serve.schema import ChatCompletionRequest, CompletionRequest, DecodingFields

@attrs.frozen
class ServeDefaults:
    """The server's decoding defaults: a preset, part names, flat part parameters and the default ``max_tokens``."""

    preset: Any = None  # a preset name or a loaded Preset (``--preset-file``)
    parts: Mapping[str, str] = attrs.field(factory=dict, converter=dict)
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    gen_length: int | None = None


@attrs.frozen
class Plan:
    """A checked request: prompt ids, the decoder (``None``: the generator's own), length, seed and stop strings."""

    prompt_ids: list[int]
    decoder: Decoder | None
    gen_length: int
    seed: int | None
    stops: tuple[str, ...]
    options: Mapping[str, Any]  # what ``refusion.generate`` takes for the same tokens
    prompt_field: str = "prompt"
    request_params: frozenset[str] = frozenset()

    def config_error(self, error: ConfigError) -> APIError:
        """The 400 for a :class:`ConfigError` that the generator raised at submit, naming this request's field."""
        return bad_request(error, prompt_field=self.prompt_field, params=self.request_params)


def request_params(body: DecodingFields) -> dict[str, Any]:
    """The request's part parameters as a flat mapping (``params`` as a mapping or as ``key=value`` strings)."""
    if body.params is None:
        return {}
    if isinstance(body.params, dict):
        return dict(body.params)
    parsed = {}
    for i, text in enumerate(body.params):
        try:
            key, value = parse_param(text)
        except ValueError as exc:
            raise APIError(400, f"`params[{i}]`: {exc}.", param=f"params[{i}]", code="invalid_value") from None
        parsed[key] = value
    return parsed


def decoding_options(body: DecodingFields, defaults: ServeDefaults) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(options, request_params)``: keywords for :func:`refusion.api.decoder_spec` (preset, parts, parameters)."""
    own = request_params(body)
    options: dict[str, Any] = dict(defaults.parts)
    options.update(defaults.params)
    preset = body.preset if body.preset is not None else defaults.preset
    if preset is not None:
        options["preset"] = preset
    for kind in PART_KINDS:
        if getattr(body, kind) is not None:
            options[kind] = getattr(body, kind)
    for name in SAMPLING_PARAMS:  # OpenAI's sampling fields are the spec's sampling parameters
        if getattr(body, name) is not None:
            options[name] = getattr(body, name)
    for key, value in own.items():
        if key in PART_KINDS or key == "preset":
            raise APIError(400, f"`params.{key}`: name the {key} as the top-level field `{key}`.",
                           param=f"params.{key}", code="invalid_value")
        options[key] = value
    return options, own


def chat_prompt(body: ChatCompletionRequest, tokenizer: Any) -> Any:
    """The chat template applied to the messages; without a template, their texts joined by newlines."""
    if tokenizer is None:
        raise APIError(400, "`messages` need a model with a tokenizer.", param="messages", code="invalid_value")
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": m.role, "content": m.text} for m in body.messages],
                                            add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return "\n".join(m.text for m in body.messages)


def plan_request(body: CompletionRequest | ChatCompletionRequest, generator: Any, defaults: ServeDefaults) -> Plan:
    """Check ``body``'s parts, parameters and prompt; raises :class:`APIError` (400) naming the field.

    The generator's ``submit`` makes the remaining checks (length against the
    model, seed); map its :class:`ConfigError` with :meth:`Plan.config_error`.
    """
    model = generator.model
    chat = isinstance(body, ChatCompletionRequest)
    prompt_field = "messages" if chat else "prompt"
    options, own = decoding_options(body, defaults)
    try:
        for kind in PART_KINDS:
            if kind in options and isinstance(options[kind], str):
                try:
                    registry().get(kind, options[kind])
                except UnknownNameError as exc:
                    raise APIError(400, str(exc), param=kind, code="unknown_name") from None
        decoder = build_decoder(model, **options)[0] if options else None
        raw = chat_prompt(body, model.tokenizer) if chat else body.prompt
        if isinstance(raw, str) and not raw:
            raise APIError(400, f"`{prompt_field}` is empty.", param=prompt_field, code="invalid_value")
        ids = encode_prompt(raw, model.tokenizer, False) if isinstance(raw, str) else list(raw)
        limit = model.max_positions
        if limit is not None and len(ids) >= limit:
            raise APIError(400, f"`{prompt_field}` is {len(ids)} tokens long; the model holds {limit} positions, "
                           "prompt and answer together.", param=prompt_field, code="context_length_exceeded")
        length = body.length if chat else body.max_tokens
        length = length or defaults.gen_length or generator.gen_length
    except ConfigError as exc:
        raise bad_request(exc, prompt_field=prompt_field, params=own) from None
    offline = dict(options, gen_length=length)
    if body.seed is not None:
        offline["seed"] = body.seed
    return Plan(ids, decoder, length, body.seed, body.stops, offline, prompt_field, frozenset(own))
