"""``refusion.generate``: one call from a prompt to a decoded answer."""

from __future__ import annotations

from typing import Any

from refusion.config import PART_KINDS, DecoderSpec
from refusion.config import preset as get_preset
from refusion.config.spec import DEFAULT_GEN_LENGTH
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError, warn_caller
from refusion.limits import MAX_GEN_LENGTH
from refusion.models.base import ModelAdapter
from refusion.models.loading import load_model
from refusion.prompts import encode_prompt
from refusion.validators import check_integer


def decoder_spec(
    adapter: ModelAdapter | None,
    *,
    preset: str | DecoderSpec | None = None,
    partitioner: Any = None,
    selector: Any = None,
    infiller: Any = None,
    reorderer: Any = None,
    reviser: Any = None,
    **params: Any,
) -> DecoderSpec:
    """The :class:`~refusion.config.spec.DecoderSpec` :func:`generate` would use.

    ``preset`` (a name or a spec, e.g. from :func:`refusion.load_preset`)
    defaults to the adapter's (:func:`~refusion.models.loading.load_model`:
    the checkpoint's ``refusion.json``, else its family's), else ``"paper"``.
    The family's preset takes the checkpoint's own generation defaults (e.g.
    DiffusionGemma's ``generation_config.json``: the adapter's
    ``preset_params``) whether it is the default or named. Explicit parts and
    ``params`` override it by :meth:`DecoderSpec.merged`'s one rule (a
    replaced part loses its parameters). A preset named after a peer takes
    that peer function's own arguments among ``params``
    (:mod:`refusion.peers`), checked against ``adapter``.
    """
    if isinstance(preset, DecoderSpec):
        chosen = preset
    elif preset is not None:
        chosen = named_preset(adapter, preset)
    else:
        chosen = getattr(adapter, "preset", None) or get_preset("paper")
    if isinstance(preset, str) and adapter is not None and chosen.peer is not None:
        from refusion.peers import peer_function

        function, caps = peer_function(chosen.peer), adapter.capabilities
        missing = {field: wanted for field, wanted in function.requires.items() if getattr(caps, field) != wanted}
        if missing:
            needs = ", ".join(f"`{field}={wanted}`" for field, wanted in missing.items())
            raise wrong_family(preset, adapter, f"it reproduces {function.name}, which decodes models with {needs}.")
    parts = dict(partitioner=partitioner, selector=selector, infiller=infiller, reorderer=reorderer, reviser=reviser)
    try:
        return chosen.merged(parts, params, model=adapter)
    except ConfigError as exc:  # a peer function refusing the model it was given: the preset does not fit it
        if exc.param == "model" and isinstance(preset, str) and adapter is not None:
            raise wrong_family(preset, adapter, str(exc)) from None
        raise


def named_preset(adapter: ModelAdapter | None, name: str) -> DecoderSpec:
    """The preset called ``name`` as ``adapter``'s checkpoint sets it: its family's preset takes the checkpoint's
    own generation defaults (the adapter's ``preset_params``, e.g. DiffusionGemma's ``generation_config.json``)
    exactly as when no preset is named; any other preset is the registered one."""
    chosen = get_preset(name)
    own = (getattr(adapter, "preset_params", None) or {}).get(name)
    return chosen.with_params(own) if own else chosen


def build_decoder(adapter: ModelAdapter | None, **options: Any) -> tuple[Decoder, int | None]:
    """``(decoder, gen_length)`` of :func:`decoder_spec` with the same arguments: the spec built, and its length.

    With a model, a preset named for it that cannot run on it (a part of the preset, not one the caller gave,
    needs a capability the model lacks) is a :class:`ConfigError` naming ``preset``."""
    spec = decoder_spec(adapter, **options)
    decoder = Decoder.from_spec(spec)
    named = options.get("preset")
    if adapter is not None and isinstance(named, str):
        try:
            decoder.check_model(adapter)
        except ConfigError as exc:
            if exc.param is None or (exc.param in PART_KINDS and options.get(exc.param) is None):
                raise wrong_family(named, adapter, str(exc)) from None
            raise
    return decoder, spec.gen_length


def wrong_family(preset: str, adapter: ModelAdapter, why: str) -> ConfigError:
    """The error for a named preset that does not run on ``adapter``: names ``preset`` and those that do."""
    from refusion.decoding.decoder import presets_for

    family = getattr(adapter, "family", None) or type(adapter).__name__
    return ConfigError(
        f"`preset` {preset!r} does not run on this model ({family}): {why} Presets that run on it: "
        f"{', '.join(name for name in presets_for(adapter) if name != preset)}.",
        param="preset",
    )


def generate(
    prompt: Any,
    model: Any = None,
    *,
    tokenizer: Any = None,
    gen_length: int | None = None,
    preset: str | DecoderSpec | None = None,
    chat: bool | None = None,
    partitioner: Any = None,
    selector: Any = None,
    infiller: Any = None,
    reorderer: Any = None,
    reviser: Any = None,
    seeds: Any = None,
    trace: Any = None,
    record: bool = False,
    allow_special: bool = False,
    **params: Any,
) -> Any:
    """Decode ``prompt`` (text or token ids) with ReFusion's plan-and-infill algorithm.

    A list of prompts (texts or token-id lists) is decoded as one batch and
    gives a list of results, in order (``seeds`` gives each its own sampling
    seed). ``preset`` picks part names, parameters and ``gen_length`` (default:
    the checkpoint's own ``refusion.json`` if it has one, else its family's
    preset: ``llada``, ``dream``, ``sdar``, ``llada2``/``llada2.1``,
    ``diffusion-gemma`` or ``paper``, with the checkpoint's generation
    defaults, which the family's preset takes when named too);
    explicit part specs, ``gen_length`` and ``params`` (e.g. ``slot_size=16``,
    ``token_threshold=0.5``, ``temperature=0.7``, ``"selector.k"=2``) override
    it. ``gen_length`` is the most tokens an answer holds (it ends at the
    first EOS, else after ``gen_length`` tokens; a length the partitioner
    cannot split is refused, naming the nearest it accepts); when it is not
    given and the preset's does not fit the model's positions, the longest
    length that fits is used, announced with a
    :class:`~refusion.errors.RefusionWarning`. Returns
    :class:`~refusion.decoding.types.DecodeResult` (s) with ``text`` when a tokenizer is
    known. ``trace`` (a path) also writes the standard JSON Lines trace of the
    decode(s) there (:mod:`refusion.measure.trace`, ``docs/trace.md``);
    ``record=True`` keeps each iteration's record in ``result.iterations``
    (a trace implies it; a plain decode builds none).
    Prompt text naming a special token (``"<|endoftext|>"``) is refused
    unless ``allow_special=True``.
    """
    adapter = load_model(model, tokenizer=tokenizer)
    peer = preset_peer(adapter, preset)
    # a peer function's own length argument is read by its translation (D2F's: whole blocks), exactly
    peer_length = "max_new_tokens" in params and peer is not None and "max_new_tokens" in peer.arguments
    if "max_new_tokens" in params:  # a peer's name for the length (Dream): honoured exactly, like gen_length
        check_integer("max_new_tokens", params["max_new_tokens"], 1, MAX_GEN_LENGTH, "tokens to generate")
        if gen_length is not None and gen_length != params["max_new_tokens"]:
            raise ConfigError(
                f"Give `gen_length` ({gen_length}) or `max_new_tokens` ({params['max_new_tokens']}), not both."
            )
        if not peer_length:
            gen_length = params["max_new_tokens"]
    if peer is not None:  # what the call's arguments set on the model itself (LLaDA 2.x's mask_id, ...)
        adapter = peer.model(params, adapter)
    if gen_length is not None:  # a peer function that reads it (LLaDA 2.x caps its steps by it) sees it too
        params["gen_length"] = gen_length
    decoder, default_length = build_decoder(
        adapter,
        preset=preset,
        partitioner=partitioner,
        selector=selector,
        infiller=infiller,
        reorderer=reorderer,
        reviser=reviser,
        **params,
    )
    batch = is_batch(prompt)
    if not batch and seeds is not None:
        raise ConfigError("`seeds` is for a list of prompts; for one prompt pass `seed=`.", param="seeds")
    ids = [
        encode_prompt(p, adapter.tokenizer, chat, allow_special=allow_special) for p in (prompt if batch else [prompt])
    ]
    if gen_length is None and peer_length:
        gen_length = default_length  # the length the peer's translation read from its `max_new_tokens`
    if gen_length is None:
        gen_length = fit_default_length(decoder, adapter, ids, default_length or DEFAULT_GEN_LENGTH)
    length = gen_length
    record = bool(record) or trace is not None
    results = (
        decoder.decode_batch(adapter, ids, length, seeds=seeds, record=record)
        if batch
        else decoder.decode(adapter, ids[0], length, record=record)
    )
    if trace is not None:
        from refusion.measure.trace import write_trace

        write_trace(results, trace, tokenizer=adapter.tokenizer, decoder=decoder)
    return results


def preset_peer(adapter: ModelAdapter, preset: str | DecoderSpec | None) -> Any:
    """The peer function (:class:`~refusion.peers.base.PeerFunction`) the preset a call names (or the model's own)
    reproduces, or ``None``."""
    if isinstance(preset, DecoderSpec):
        chosen: DecoderSpec | None = preset
    elif preset is not None:
        chosen = get_preset(preset)
    else:
        chosen = getattr(adapter, "preset", None)
    if chosen is None or chosen.peer is None:
        return None
    from refusion.peers import peer_function

    return peer_function(chosen.peer)


def fit_default_length(decoder: Decoder, adapter: ModelAdapter, prompts: list[Any], wanted: int) -> int:
    """``wanted`` (a preset's default length), or the longest length the partitioner accepts that fits the model
    after the longest prompt.

    Used only when the caller did not ask for a length; a fitted length is
    announced with a :class:`~refusion.errors.RefusionWarning` (pointing at the
    caller's line). A prompt that leaves no room is left to the decoder's own
    length check.
    """
    try:
        longest = max(len(p) for p in prompts)
    except TypeError:
        return wanted  # malformed prompts: the decoder's checks name them
    n = fitted_length(decoder, adapter.max_positions, longest, wanted)
    if n is None:
        return wanted
    warn_caller(
        f"`gen_length` not given: the preset's {wanted} tokens plus the {longest}-token prompt exceed the "
        f"model's {adapter.max_positions} positions, so {n} tokens are generated; pass `gen_length` to choose."
    )
    return n


def fitted_length(decoder: Decoder, limit: int | None, prompt_length: int, wanted: int) -> int | None:
    """The longest length ``decoder``'s partitioner accepts that fits ``limit`` positions after a prompt of
    ``prompt_length`` tokens, when a default length ``wanted`` does not fit; ``None`` when ``wanted`` fits, the
    model states no limit, or no length fits (the decoder's own length check then names the problem)."""
    if limit is None or prompt_length + wanted <= limit or prompt_length >= limit:
        return None
    return decoder.nearest_lengths(limit - prompt_length)[0]


def is_batch(prompt: Any) -> bool:
    """True for a list of prompts (texts or token-id sequences), False for one prompt."""
    if isinstance(prompt, (list, tuple)) and prompt:
        return all(isinstance(p, (str, list, tuple)) or (hasattr(p, "dim") and p.dim() == 1) for p in prompt)
    return False
