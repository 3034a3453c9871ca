"""Reading a checkpoint's files without running its code: the tokenizer, and transformers' loaders kept quiet."""

from __future__ import annotations

from typing import Any

from refusion.errors import ConfigError


def quietly(load: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a transformers loading function without its progress bars and load reports."""
    from transformers.utils import logging as hf_logging

    import warnings

    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():  # transformers' notes on transformers-4 config fields are not the user's concern
            warnings.simplefilter("ignore", FutureWarning)
            return load(*args, **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


#: files one of which a checkpoint with a tokenizer has
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def load_tokenizer(path: str, trust_remote_code: bool = False, fallback: str | None = None) -> Any:
    """The checkpoint's tokenizer, or ``None`` if it has none; its code runs only with ``trust_remote_code``.

    Without it the tokenizer class named in ``tokenizer_config.json`` is
    built directly when transformers has it (so the checkpoint's
    ``config.json`` and its ``auto_map`` are not consulted); a custom
    tokenizer class (``auto_map``) is read from ``tokenizer.json`` with the
    generic fast tokenizer, else with the transformers class named
    ``fallback``.
    """
    import json
    from pathlib import Path

    import transformers

    local = Path(path)
    if not local.is_dir():  # a hub id
        return quietly(transformers.AutoTokenizer.from_pretrained, path, trust_remote_code=trust_remote_code)
    if not any((local / name).is_file() for name in TOKENIZER_FILES):
        return None
    if trust_remote_code:
        return quietly(transformers.AutoTokenizer.from_pretrained, path, trust_remote_code=True)
    settings_file = local / "tokenizer_config.json"
    try:
        settings = json.loads(settings_file.read_text(encoding="utf-8")) if settings_file.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"`model` {path!r}: tokenizer_config.json is not valid JSON ({exc}).", param='model') from exc
    custom = "AutoTokenizer" in (settings.get("auto_map") or {})
    named = getattr(transformers, str(settings.get("tokenizer_class")), None) if not custom else None
    if isinstance(named, type) and hasattr(named, "from_pretrained"):
        tokenizer = quietly(named.from_pretrained, path)
    elif (local / "tokenizer.json").is_file():
        tokenizer = quietly(transformers.PreTrainedTokenizerFast.from_pretrained, path)
    elif custom and fallback is not None and (local / "vocab.json").is_file():
        tokenizer = quietly(getattr(transformers, fallback).from_pretrained, path)
    elif custom:
        raise ValueError("its tokenizer class is custom code (`auto_map` in tokenizer_config.json) and there is no "
                         "tokenizer.json (or vocab.json) to read the vocabulary from instead")
    else:
        tokenizer = quietly(transformers.AutoTokenizer.from_pretrained, path, trust_remote_code=False)
    return tokenizer if len(tokenizer) > 1 else None  # transformers 5 gives an empty tokenizer for no files
