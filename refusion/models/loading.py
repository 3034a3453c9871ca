"""``load_model``: a :class:`~refusion.models.base.ModelAdapter` from a checkpoint path, a network or an adapter.

A checkpoint directory is recognised from its ``config.json``: a registered
:class:`~refusion.models.families.ModelFamily` (LLaDA, Dream, SDAR, ReFusion,
LLaDA 2.x, DiffusionGemma) loads it into a maintained transformers class; a standard transformers
architecture loads as a causal LM (``hf-causal``); anything else needs the
user to say how (``adapter=`` and, for code shipped with the checkpoint,
``trust_remote_code=True``). transformers is always told whether remote code
may run, so it never asks on standard input.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from refusion.errors import ConfigError
from refusion.models.base import ModelAdapter
from refusion.models.checks import (
    check_adapter_options,
    check_config,
    check_device,
    check_model_path,
    check_weights,
    torch_dtype,
)
from refusion.validators import check_boolean

#: keywords :func:`load_model` passes on to transformers' ``from_pretrained``
TRANSFORMERS_OPTIONS = (
    "device_map",
    "attn_implementation",
    "quantization_config",
    "max_memory",
    "offload_folder",
    "tp_plan",
    "revision",
    "cache_dir",
    "local_files_only",
    "token",
    "low_cpu_mem_usage",
    "use_safetensors",
    "subfolder",
)


def load_model(
    model: Any = None,
    *,
    tokenizer: Any = None,
    adapter: str | None = None,
    trust_remote_code: bool = False,
    compile: Any = False,
    **options: Any,
) -> ModelAdapter:
    """A :class:`ModelAdapter` from a checkpoint path, a transformers model or an adapter (returned as is).

    ``None`` means the model shipped with refusion. For a path, the
    checkpoint's family is recognised from ``config.json`` (``refusion
    plugins`` lists the families; ``docs/models.md`` the checkpoints) and
    everything else (mask and EOS ids, logit shift, block length) is read
    from it. ``options``: ``dtype`` (``"auto"``, a dtype or its name),
    ``device``, transformers' loading keywords (``device_map``,
    ``attn_implementation``, ``quantization_config``, ...) and the adapter's
    (``mask_token_id``, ``eos_token_id``, ``block_length`` for block
    diffusion, ``logit_shift`` for ``hf-mdm``). The adapter's ``preset`` is
    the decoder the checkpoint recommends (its ``refusion.json``), else its
    family's own (LLaDA ``llada``, Dream ``dream``, SDAR ``sdar``, ReFusion
    ``paper``, LLaDA 2.x ``llada2``/``llada2.1``, DiffusionGemma
    ``diffusion-gemma``, with the checkpoint's generation defaults: its
    ``preset_params``, which that preset also takes when named), else
    ``None`` (``paper``). ``adapter`` names a registered adapter
    (``hf-causal``, ``hf-mdm``, ``hf-block``) to use instead of the family's,
    for architectures outside the families; the checkpoint's own code runs
    only with ``trust_remote_code=True``.

    ``compile`` runs the network's forward under ``torch.compile``
    (:func:`~refusion.models.compiled.compile_adapter`, ``docs/models.md``):
    ``True`` (inductor, dynamic shapes), a mode (``"reduce-overhead"``: CUDA
    graphs, CUDA only) or a dict of ``compile_adapter`` options (``mode``,
    ``backend``, ``dynamic``, ``buckets``); an invalid value is refused before
    anything is loaded.
    """
    from refusion.plugins.registry import registry

    if compile is not False and compile is not None:
        from refusion.models.compiled import compile_adapter, compile_options

        compiling = compile_options(compile) or {}
        loaded = load_model(model, tokenizer=tokenizer, adapter=adapter, trust_remote_code=trust_remote_code, **options)
        return compile_adapter(loaded, **compiling)

    if isinstance(model, ModelAdapter):
        if tokenizer is not None:
            model.tokenizer = tokenizer
        return model
    check_boolean("trust_remote_code", trust_remote_code)
    if model is None:
        from refusion.models.default import default_model_path

        model = str(default_model_path())
    if isinstance(model, str):
        check_model_path(model)
        if "dtype" in options:
            options["dtype"] = torch_dtype(options["dtype"])
        check_device(options.get("device"))
        check_adapter_options(options)
        config = read_config(model)
        read_generation_config(model, config)  # its EOS ids end answers: refused when damaged, not skipped
        preset = read_model_preset(model, trust_remote_code=trust_remote_code)  # refused before any weight is read
        check_weights(model, config)
        family = None if adapter is not None else find_family(config)
        if family is not None:
            check_options(options, family.adapter_options, f"the {family.name!r} family")
            loaded = _loading(model, family.load, model, config, tokenizer=tokenizer, **options)
        else:
            adapter_cls = registry().get("model_adapter", adapter or "hf-causal")
            if adapter is None and needs_own_code(config) and not trust_remote_code:
                raise unknown_architecture(model, config)
            loaded = _loading(model, adapter_cls.from_pretrained, model, trust_remote_code=trust_remote_code, **options)
            if tokenizer is not None:
                loaded.tokenizer = tokenizer
        own = checkpoint_preset_params(family, model)
        loaded.preset_params = own  # type: ignore[attr-defined]
        loaded.preset = preset or family_preset(family, model, own)  # type: ignore[attr-defined]
        return loaded
    if hasattr(model, "config") and callable(model):
        return registry().get("model_adapter", adapter or "hf-causal")(model, tokenizer, **options)
    raise ConfigError(
        f"`model` must be a ModelAdapter, a transformers model or a path; got {type(model).__name__}.", param="model"
    )


#: the file beside a checkpoint's weights that names the decoder it recommends (a decoder spec)
PRESET_FILE = "refusion.json"


#: how a user lets a checkpoint's ``refusion.json`` name parts by module path
PRESET_OPT_IN = "Only with `trust_remote_code=True` (CLI: --trust-remote-code) does a checkpoint run code of its own."


def read_model_preset(path: str, *, trust_remote_code: bool = False) -> Any:
    """The decoder spec a checkpoint recommends (``refusion.json`` next to its weights), or ``None``.

    A part or engine it names by ``"module:Class"`` path would import and run
    that module (the checkpoint folder's own, from the current directory): it is
    refused, naming the field, unless ``trust_remote_code``. Nothing is imported
    before that decision: the raw file is checked before it is parsed, and the
    parsing runs with imports refused (:func:`~refusion.config.trust.no_imports`).
    """
    from refusion.config import DecoderSpec, load_preset
    from refusion.config.spec import MAX_SPEC_BYTES
    from refusion.config.trust import no_imports, refuse_import_paths
    from refusion.files import read_json, where

    file = Path(path) / PRESET_FILE
    if not file.is_file():
        return None
    if trust_remote_code:
        return load_preset(file)
    data = read_json(file, what="`preset file`", param="preset_file", max_bytes=MAX_SPEC_BYTES)
    untrusted = {"where": where("`model` preset file", file), "opt_in": PRESET_OPT_IN, "param": "model"}
    refuse_import_paths(data, **untrusted)  # the raw file, in every form the reader takes, before it is parsed
    with no_imports(**untrusted):
        spec = DecoderSpec.from_dict(data, where=where("`preset file`", file))
    refuse_import_paths(spec, **untrusted)
    return spec


def family_preset(family: Any, path: str | None = None, own: Mapping[str, Any] | None = None) -> Any:
    """The preset (a :class:`~refusion.config.spec.DecoderSpec`) a model family decodes with, or ``None``; with
    the checkpoint's own defaults (:func:`checkpoint_preset_params`, read from ``path`` unless given as ``own``)
    when ``path`` is given."""
    from refusion.config import preset

    name = family_preset_name(family, path)
    if name is None:
        return None
    if own is None:
        own = checkpoint_preset_params(family, path)
    params = own.get(name)
    return preset(name).with_params(params) if params else preset(name)


def family_preset_name(family: Any, path: str | None = None) -> str | None:
    """The name of the preset a model family decodes the checkpoint at ``path`` with (``None``: none)."""
    name = getattr(family, "default_preset", None)
    if path is not None and hasattr(family, "preset_name"):
        name = family.preset_name(read_config(path))
    return name


def checkpoint_preset_params(family: Any, path: str | None) -> dict[str, dict[str, Any]]:
    """``{preset name: parameters}``: what the checkpoint at ``path`` sets itself for its family's preset
    (:meth:`ModelFamily.preset_params`, e.g. DiffusionGemma's ``generation_config.json``); empty without one.

    Kept on the adapter as ``preset_params``, so the family's preset takes them whether it is the default or
    named (``preset="diffusion-gemma"``): :func:`refusion.api.decoder_spec`.
    """
    name = family_preset_name(family, path)
    if name is None or path is None:
        return {}
    params = family.preset_params(path)
    return {name: dict(params)} if params else {}


def _loading(path: str, load: Any, *args: Any, **kwargs: Any) -> ModelAdapter:
    """``load(*args, **kwargs)``; any failure other than a ConfigError is one naming the checkpoint.

    A damaged checkpoint fails in many libraries' own ways (safetensors'
    ``SafetensorError`` for truncated weights, torch's size mismatches,
    huggingface_hub's config validation, ``OSError`` for missing files): the
    user gets one :class:`ConfigError` with the cause's type and first line
    and what transformers' hidden load report said (kept as a note by
    :func:`~refusion.models.files.quietly`), the cause chained for debugging.
    """
    try:
        return load(*args, **kwargs)
    except ConfigError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        notes = "".join(f"; {note:.500}" for note in getattr(exc, "__notes__", ()))
        raise ConfigError(
            f"`model` {path!r} could not be loaded as a checkpoint ({type(exc).__name__}: {first:.300}{notes})",
            param="model",
        ) from exc


def read_config(path: str) -> dict[str, Any]:
    """The checkpoint's parsed and checked ``config.json`` (a local directory, or a hub id where the hub is reachable).

    Unreadable, non-UTF-8, over-nested or non-object JSON and size fields out of
    range (:func:`~refusion.models.checks.check_config`) are ConfigErrors naming the checkpoint.
    """
    from refusion.files import read_json

    file = checkpoint_file(path, "config.json")
    config = read_json(file, what="`model` config.json", param="model", max_bytes=16 * 2**20)
    if not isinstance(config, dict):
        raise ConfigError(
            f"`model` {path!r}: config.json must hold a JSON object; got {type(config).__name__}.", param="model"
        )
    check_config(config, path)
    return config


def read_generation_config(path: str, config: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """A local checkpoint's parsed and checked ``generation_config.json``, or ``None`` when it has none.

    transformers drops a damaged one without a word (and with it the EOS ids
    some families keep only there, LLaDA 2.x's): non-UTF-8 or invalid JSON,
    anything but an object, and special-token fields that are not token ids
    of the vocabulary (``config``'s) are ConfigErrors naming the file and field.
    """
    from refusion.files import read_json
    from refusion.models.checks import check_token_fields

    file = Path(path).expanduser() / "generation_config.json"
    if not file.is_file():
        return None
    data = read_json(file, what="`model` generation_config.json", param="model", max_bytes=16 * 2**20)
    if not isinstance(data, dict):
        raise ConfigError(
            f"`model` {path!r}: generation_config.json must hold a JSON object; got {type(data).__name__}.",
            param="model",
        )
    config = config or {}
    nested = config.get("text_config")
    text: Mapping[str, Any] = nested if isinstance(nested, Mapping) else {}
    vocab = config.get("vocab_size", text.get("vocab_size"))
    check_token_fields(data, vocab, path, "generation_config.json field `")
    return data


def checkpoint_file(path: str, name: str) -> str:
    """The local path of the checkpoint's file ``name``: in the directory ``path``, in the Hugging Face cache, or
    downloaded from the hub.

    A hub id neither local nor cached is refused at once, naming ``model``,
    when the hub cannot be reached (offline mode, a host name that does not
    resolve, a connection refused): huggingface_hub would retry for about 20
    seconds first.
    """
    from transformers.utils import cached_file

    try:
        return cached_file(path, name, local_files_only=True)
    except OSError as exc:
        if Path(path).expanduser().is_dir():
            raise ConfigError(f"`model` {path!r}: its {name} cannot be read ({exc}).", param="model") from exc
    unreachable = hub_unreachable()
    if unreachable is not None:
        raise ConfigError(
            f"`model` {path!r} is not a local directory, not in the Hugging Face cache, and the hub "
            f"cannot be reached ({unreachable}). Give a checkpoint directory, or download it first "
            "(`hf download ORG/NAME`).",
            param="model",
        )
    try:
        return cached_file(path, name)
    except OSError as exc:
        raise ConfigError(f"`model` {path!r}: its {name} cannot be read ({exc}).", param="model") from exc


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached (``None`` when it can, or when a proxy decides)."""
    import os
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # the proxy connects, not this machine
    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"
    return None


def find_family(config: Mapping[str, Any]) -> Any:
    """The registered :class:`~refusion.models.families.ModelFamily` (an instance) that recognises ``config``, or
    None."""
    from refusion.plugins.registry import registry

    for entry in registry().entries("model_family"):
        family = entry.cls()
        if family.matches(config):
            return family
    return None


def needs_own_code(config: Mapping[str, Any]) -> bool:
    """True when transformers cannot build ``config``'s network by itself (an unknown ``model_type``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return config.get("model_type") not in CONFIG_MAPPING


def unknown_architecture(path: str, config: Mapping[str, Any]) -> ConfigError:
    """The error for a checkpoint no family recognises and transformers cannot build: names both ways out."""
    from refusion.plugins.registry import registry

    families = "; ".join(f"{e.name} ({', '.join(e.cls.checkpoints)})" for e in registry().entries("model_family"))
    what = f"model_type {config.get('model_type')!r}, architectures {config.get('architectures')}"
    error = ConfigError(
        f"`model` {path!r} ({what}) is not a family refusion loads, and transformers has no class for it. "
        f"Supported families: {families}. To run the checkpoint's own code instead, pass `trust_remote_code=True` "
        "(CLI: --trust-remote-code) and the adapter that fits it: `adapter='hf-causal'` (causal), 'hf-mdm' "
        "(bidirectional, with `logit_shift`) or 'hf-block' (block diffusion, with `block_length`).",
        param="model",
    )
    return registry().unavailable(error)  # a family of a plugin that failed to import is named with its error


def check_options(options: Mapping[str, Any], adapter_options: tuple[str, ...], owner: str) -> None:
    """Refuse a loading keyword that neither transformers nor ``owner`` takes."""
    allowed = ("dtype", "device", *TRANSFORMERS_OPTIONS, *adapter_options)
    for key in options:
        if key not in allowed:
            raise ConfigError(f"`{key}` is not an option of {owner}; it takes: {', '.join(allowed)}.", param=key)


#: the options a command line or a record gives to load a model (:func:`load_from_options`)
MODEL_OPTIONS = (
    "model",
    "device",
    "dtype",
    "mask_token_id",
    "eos_token_id",
    "adapter",
    "logit_shift",
    "model_block_length",
    "trust_remote_code",
)


def load_from_options(options: Mapping[str, Any]) -> ModelAdapter:
    """The model :data:`MODEL_OPTIONS` describe (missing ones take their defaults); what ``--model`` and its
    companion flags load, and what ``refusion reproduce`` loads from a record."""
    unknown = sorted(set(options) - set(MODEL_OPTIONS))
    if unknown:
        raise ConfigError(
            f"`{unknown[0]}` is not a model option; they are {', '.join(MODEL_OPTIONS)}.", param=unknown[0]
        )
    get = {"dtype": "auto", "trust_remote_code": False, **{k: v for k, v in options.items() if v is not None}}.get
    kwargs: dict[str, Any] = {"dtype": get("dtype")}
    for option, key in (
        ("device", "device"),
        ("mask_token_id", "mask_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("model_block_length", "block_length"),
    ):
        if get(option) is not None:
            kwargs[key] = get(option)
    adapter = get("adapter")
    if adapter == "hf-mdm":
        kwargs["logit_shift"] = get("logit_shift") or 0
    elif get("logit_shift") is not None:
        raise ConfigError(
            f"`logit_shift` {get('logit_shift')} applies only with adapter 'hf-mdm' (bidirectional "
            f"models); the adapter is {adapter!r}. Drop it or use adapter 'hf-mdm'.",
            param="logit_shift",
        )
    return load_model(get("model"), adapter=adapter, trust_remote_code=bool(get("trust_remote_code")), **kwargs)
