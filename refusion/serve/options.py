"""From a request's fields to what the batcher takes: prompt ids, a decoder, a length and a seed.

Everything is checked here, before the request is queued, so bad input is a
400 naming the field and never reaches the running batch. The server's own
defaults (``refusion serve --preset/--selector/-p ...``) hold for every
request; a request's fields override them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from refusion.api import build_decoder, fitted_length
from refusion.config import PART_KINDS, SAMPLING_PARAMS
from refusion.config.params import parse_param
from refusion.config.trust import is_import_path, refuse_import_paths
from refusion.decoding.decoder import Decoder
from refusion.engines.base import Engine
from refusion.errors import APIError, ConfigError, UnknownNameError
from refusion.limits import MAX_BODY_BYTES, prompt_chars
from refusion.plugins.registry import registry
from refusion.prompts import check_encodable, check_no_special_text, encode_prompt
from refusion.serve.errors import bad_request
from refusion.serve.schema import ChatCompletionRequest, CompletionRequest, DecodingFields, unhonoured
from refusion.validators import boolean, optional, positive_int


@attrs.frozen
class ServePolicy:
    """What a server accepts from its clients (the ``refusion serve`` flags in brackets).

    ``max_body_bytes`` bounds a request body (``--max-body-bytes``; larger is
    413); ``max_prompt_chars`` bounds prompt text, checked before it is
    tokenised (``--max-prompt-chars``; default :data:`~refusion.limits.CHARS_PER_POSITION` per model
    position). Requests may name parts by ``"module:Class"`` path only with
    ``allow_imports`` (``--allow-imports``), and put special-token text in
    prompts only with ``allow_special_tokens`` (``--allow-special-tokens``).
    """

    max_body_bytes: int = attrs.field(default=MAX_BODY_BYTES, validator=positive_int)
    max_prompt_chars: int | None = attrs.field(default=None, validator=optional(positive_int))
    allow_imports: bool = attrs.field(default=False, validator=boolean)
    allow_special_tokens: bool = attrs.field(default=False, validator=boolean)

    def prompt_chars(self, model: Any) -> int | None:
        """The most characters of prompt text ``model`` is sent (``None``: no bound but the body's)."""
        if self.max_prompt_chars is not None:
            return self.max_prompt_chars
        return prompt_chars(getattr(model, "max_positions", None))


@attrs.frozen
class ServeDefaults:
    """The server's decoding defaults: a preset, part names, flat part parameters and the default ``max_tokens``."""

    preset: Any = None  # a preset name or a loaded Preset (``--preset-file``)
    parts: Mapping[str, str] = attrs.field(factory=dict, converter=dict)
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    gen_length: int | None = None


@attrs.frozen
class RequestPlan:
    """A checked request: prompt ids, the decoder (``None``: the batcher's own), length, seed and stop strings.

    ``gen_length`` is the client's ``max_tokens``, else the server's default, shortened to fit the model after
    the prompt (``note`` then says so).
    """

    prompt_ids: list[int]
    decoder: Decoder | None
    gen_length: int
    seed: int | None
    stops: tuple[str, ...]
    options: Mapping[str, Any]  # what ``refusion.generate`` takes for the same tokens
    prompt_field: str = "prompt"
    request_params: frozenset[str] = frozenset()
    #: set when the request sent no ``max_tokens`` and the server's default was shortened to fit the model
    note: str | None = None

    def config_error(self, error: ConfigError) -> APIError:
        """The 400 for a :class:`ConfigError` that the batcher raised at submit, naming this request's field."""
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


def decoding_options(body: DecodingFields, defaults: ServeDefaults, own: Mapping[str, Any]) -> dict[str, Any]:
    """Keywords for :func:`refusion.api.build_decoder`: the server's defaults, then the request's fields and ``own``
    (its ``params``)."""
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
            raise APIError(
                400,
                f"`params.{key}`: name the {key} as the top-level field `{key}`.",
                param=f"params.{key}",
                code="invalid_value",
            )
        if key == "gen_length":
            raise APIError(
                400,
                "`params.gen_length`: set the answer's length with `max_tokens`.",
                param="params.gen_length",
                code="invalid_value",
            )
        options[key] = value
    return options


#: how a trusted deployment lets requests name classes by module path
IMPORT_OPT_IN = "A trusted deployment may allow it by starting the server with `--allow-imports`."


def refuse_imports(body: DecodingFields, own: Mapping[str, Any]) -> None:
    """400 naming the first part or engine the request names by ``"module:Class"`` path (nothing is imported).

    ``own`` is the request's ``params``; the server's own defaults are trusted
    and not checked.
    """
    fields: dict[str, Any] = {kind: getattr(body, kind) for kind in PART_KINDS}
    fields["params"] = dict(own)
    try:
        refuse_import_paths(fields, where="request", opt_in=IMPORT_OPT_IN)
    except ConfigError as exc:
        raise APIError(400, str(exc), param=exc.param, code="import_refused") from None


def refuse_unhonoured(body: DecodingFields) -> None:
    """400 naming the first OpenAI field whose value refusion cannot honour (a penalty, ``logprobs``, ``echo``, ...);
    their neutral values pass (:data:`~refusion.serve.schema.NEUTRAL`)."""
    found = unhonoured(body)
    if found is not None:
        field, value, accepted = found
        raise APIError(
            400,
            f"`{field}` = {value!r:.80} cannot be honoured by this server; send {accepted}, or leave it out.",
            param=field,
            code="unsupported_value",
        )


def check_prompt_size(body: CompletionRequest | ChatCompletionRequest, field: str, bound: int | None) -> None:
    """400 naming ``field`` when the prompt text (all messages together) is over ``bound`` characters.

    Checked before anything is tokenised; token-id prompts are bounded by the
    model's positions instead.
    """
    if bound is None:
        return
    if isinstance(body, ChatCompletionRequest):
        size = sum(len(m.text) for m in body.messages)
    else:
        size = len(body.prompt) if isinstance(body.prompt, str) else 0
    if size > bound:
        raise APIError(
            400,
            f"`{field}` holds {size} characters of text; this server takes at most {bound} (`--max-prompt-chars`).",
            param=field,
            code="context_length_exceeded",
        )


def chat_prompt(body: ChatCompletionRequest, tokenizer: Any, allow_special: bool = False) -> Any:
    """The chat template applied to the messages; without a template, their texts joined by newlines.

    Each message's text is checked first (``messages[i].content`` names it):
    valid Unicode, and, unless ``allow_special``, no special token's text; the
    template's own special tokens are not the client's and stay.
    """
    if tokenizer is None:
        raise APIError(400, "`messages` need a model with a tokenizer.", param="messages", code="invalid_value")
    for i, message in enumerate(body.messages):
        field = f"messages[{i}].content"
        check_encodable(message.text, field)
        if not allow_special:
            check_no_special_text(message.text, tokenizer, field)
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.text} for m in body.messages], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return "\n".join(m.text for m in body.messages)


def check_guidance(decoder: Decoder, engine: Any) -> None:
    """Refuse ``cfg_scale`` > 0 when ``engine`` has no classifier-free guidance (decoding would fail later)."""
    if decoder.cfg_scale > 0 and type(engine).guide is Engine.guide:
        raise ConfigError(
            f"`cfg_scale` > 0 needs an engine with classifier-free guidance; this server's engine "
            f"{engine.name!r} has none (use cfg_scale 0).",
            param="cfg_scale",
        )


def check_part_names(options: Mapping[str, Any]) -> None:
    """400 naming the part whose name is not registered (``"module:Class"`` paths are left to the build)."""
    for kind in PART_KINDS:
        name = options.get(kind)
        if isinstance(name, str) and not is_import_path(name):
            try:
                registry().get(kind, name)
            except UnknownNameError as exc:
                raise APIError(400, str(exc), param=kind, code="unknown_name") from None


def plan_request(
    body: CompletionRequest | ChatCompletionRequest,
    batcher: Any,
    defaults: ServeDefaults,
    policy: ServePolicy | None = None,
) -> RequestPlan:
    """Check ``body``'s parts, parameters and prompt; raises :class:`APIError` (400) naming the field.

    Under ``policy`` (default :class:`ServePolicy`): module paths are refused
    before anything is merged or built, prompt text is bounded before it is
    tokenised, special-token text is refused. The batcher's ``submit``
    makes the remaining checks (length against the model, seed); map its
    :class:`ConfigError` with :meth:`RequestPlan.config_error`.
    """
    policy = policy or ServePolicy()
    refuse_unhonoured(body)
    model = batcher.model
    chat = isinstance(body, ChatCompletionRequest)
    prompt_field = "messages" if chat else "prompt"
    own = request_params(body)
    if not policy.allow_imports:
        refuse_imports(body, own)
    check_prompt_size(body, prompt_field, policy.prompt_chars(model))
    options = decoding_options(body, defaults, own)
    try:
        check_part_names(options)
        decoder = build_decoder(model, **options)[0] if options else None
        check_guidance(decoder or batcher.decoder, batcher.engine)
        raw = (
            chat_prompt(body, model.tokenizer, policy.allow_special_tokens)
            if isinstance(body, ChatCompletionRequest)
            else body.prompt
        )
        if isinstance(raw, str) and not raw:
            raise APIError(400, f"`{prompt_field}` is empty.", param=prompt_field, code="invalid_value")
        ids = (
            encode_prompt(raw, model.tokenizer, False, allow_special=policy.allow_special_tokens)
            if isinstance(raw, str)
            else list(raw)
        )
        limit = model.max_positions
        if limit is not None and len(ids) >= limit:
            raise APIError(
                400,
                f"`{prompt_field}` is {len(ids)} tokens long; the model holds {limit} positions, "
                "prompt and answer together.",
                param=prompt_field,
                code="context_length_exceeded",
            )
        asked = body.length if isinstance(body, ChatCompletionRequest) else body.max_tokens
        length, note = (
            (asked, None)
            if asked is not None
            else default_length(decoder or batcher.decoder, model, ids, defaults.gen_length or batcher.gen_length)
        )
    except ConfigError as exc:
        raise bad_request(exc, prompt_field=prompt_field, params=own) from None
    offline = dict(options, gen_length=length)
    if body.seed is not None:
        offline["seed"] = body.seed
    return RequestPlan(ids, decoder, length, body.seed, body.stops, offline, prompt_field, frozenset(own), note)


def default_length(decoder: Decoder, model: Any, ids: list[int], wanted: int) -> tuple[int, str | None]:
    """The length of a request that sent no ``max_tokens``: the server's default ``wanted``, or, when that does
    not fit the model after the prompt, the longest length that fits, with a note saying so (as
    ``refusion.generate`` shortens a default it chose; a ``max_tokens`` the client sent is never shortened)."""
    fitted = fitted_length(decoder, model.max_positions, len(ids), wanted)
    if fitted is None:
        return wanted, None
    return fitted, (
        f"`max_tokens` not given: the server's default {wanted} plus the {len(ids)}-token prompt exceed the "
        f"model's {model.max_positions} positions, so at most {fitted} tokens are generated; send `max_tokens` "
        "to choose."
    )
