"""Reading a checkpoint's files without running its code: the tokenizer, and transformers' loaders kept quiet.

No path here ever imports a module from a checkpoint folder or asks on
standard input whether it may (transformers' "Do you wish to run the custom
code? [y/N]"): every transformers loader is told ``trust_remote_code``
explicitly, the prompt is switched off while it runs, and a tokenizer class
named in ``tokenizer_config.json`` is used only if it is one of transformers'
own tokenizer classes.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from refusion.errors import ConfigError

#: ANSI colour codes in transformers' load report
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class _Report(logging.Handler):
    """Keeps the warnings a transformers loader logs (its load report) instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.extend(_ANSI.sub("", record.getMessage()).splitlines())

    def summary(self) -> str:
        """The report's table rows (``key | STATUS | details``) as ``key: STATUS (details)``, joined by ``; ``."""
        rows = []
        for line in self.lines:
            cells = [c.strip() for c in line.split("|")]
            if len(cells) >= 2 and cells[1].isupper() and cells[0] and cells[0] != "Key":
                rows.append(f"{cells[0]}: {cells[1]}" + (f" ({cells[2]})" if len(cells) > 2 and cells[2] else ""))
        return "; ".join(rows[:6]) + (" ..." if len(rows) > 6 else "")


def quietly(load: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a transformers loading function without its progress bars, its load report on stderr and its question
    on standard input.

    The report transformers logs (mismatched or missing weights) is kept: when
    the load fails, its rows are added to the exception's notes, so the error
    says what "the above report" would have said.
    """
    import warnings

    import transformers.dynamic_module_utils as remote_code
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    library = hf_logging.get_logger("transformers")
    propagate = library.propagate
    handlers = list(library.handlers)
    timeout = remote_code.TIME_OUT_REMOTE_CODE
    report = _Report()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_warning()
    for handler in handlers:
        library.removeHandler(handler)
    library.addHandler(report)
    library.propagate = False
    remote_code.TIME_OUT_REMOTE_CODE = 0  # never ask "Do you wish to run the custom code? [y/N]"
    try:
        with (
            warnings.catch_warnings()
        ):  # transformers' notes on transformers-4 config fields are not the user's concern
            warnings.simplefilter("ignore", FutureWarning)
            return load(*args, **kwargs)
    except Exception as exc:
        found = report.summary()
        if found:
            exc.__notes__ = [*getattr(exc, "__notes__", []), f"load report: {found}"]  # type: ignore[attr-defined]
        raise
    finally:
        remote_code.TIME_OUT_REMOTE_CODE = timeout
        library.removeHandler(report)
        for handler in handlers:
            library.addHandler(handler)
        library.propagate = propagate
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


#: files one of which a checkpoint with a tokenizer has
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def tokenizer_class(name: Any) -> Any:
    """transformers' tokenizer class called ``name`` (``"Qwen2Tokenizer"``, ``"TokenizersBackend"``), or ``None``
    when ``name`` is not one: the auto classes (``AutoTokenizer``), model classes and anything else are refused,
    since building them from a checkpoint may import the checkpoint's code."""
    import transformers

    if not isinstance(name, str) or not name.isidentifier() or name.startswith("Auto"):
        return None
    found = getattr(transformers, name, None)
    if isinstance(found, type) and issubclass(found, transformers.PreTrainedTokenizerBase):
        return found
    return None


def load_tokenizer(path: str, trust_remote_code: bool = False, fallback: str | None = None) -> Any:
    """The checkpoint's tokenizer, or ``None`` if it has none; its code runs only with ``trust_remote_code``.

    Without it the tokenizer class named in ``tokenizer_config.json`` is
    built directly when it is one of transformers' tokenizer classes
    (:func:`tokenizer_class`; so the checkpoint's ``config.json`` and its
    ``auto_map`` are not consulted); any other name, or a custom tokenizer
    class (``auto_map``), is read from ``tokenizer.json`` with the generic
    fast tokenizer, else with the transformers class named ``fallback``.
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
        raise ConfigError(f"`model` {path!r}: tokenizer_config.json is not valid JSON ({exc}).", param="model") from exc
    if not isinstance(settings, dict):
        raise ConfigError(f"`model` {path!r}: tokenizer_config.json must hold a JSON object.", param="model")
    auto_map = settings.get("auto_map")
    custom = isinstance(auto_map, (dict, list)) and bool(auto_map)
    named = tokenizer_class(settings.get("tokenizer_class")) if not custom else None
    if named is not None:
        tokenizer = quietly(named.from_pretrained, path, trust_remote_code=False)
    elif (local / "tokenizer.json").is_file():
        tokenizer = quietly(transformers.PreTrainedTokenizerFast.from_pretrained, path, trust_remote_code=False)
    elif custom and fallback is not None and (local / "vocab.json").is_file():
        tokenizer = quietly(getattr(transformers, fallback).from_pretrained, path, trust_remote_code=False)
    elif custom or settings.get("tokenizer_class") is not None:
        raise ValueError(
            f"its tokenizer class {settings.get('tokenizer_class')!r} is not one of transformers' "
            "tokenizer classes (or is custom code, `auto_map` in tokenizer_config.json), and there is no "
            "tokenizer.json (or vocab.json) to read the vocabulary from instead"
        )
    else:
        tokenizer = quietly(transformers.AutoTokenizer.from_pretrained, path, trust_remote_code=False)
    return tokenizer if len(tokenizer) > 1 else None  # transformers 5 gives an empty tokenizer for no files
