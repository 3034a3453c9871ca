"""Checks on what a user hands to :func:`refusion.load_model` and :func:`refusion.generate`, before any work.

Each function raises :class:`~refusion.errors.ConfigError` naming the
parameter, the value and the fix; none loads a model or allocates a tensor.
Knows nothing about decoding strategies.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from refusion.errors import ConfigError


def check_model_path(path: str) -> None:
    """Refuse a local checkpoint path that does not exist or holds no ``config.json``.

    A string that names no local file and looks like a hub id (``org/name``, no
    leading ``.``, ``/`` or ``~``) is left to transformers.
    """
    local = Path(path).expanduser()
    looks_local = path.startswith((".", "/", "~")) or path.count("/") > 1 or "\\" in path
    if not local.exists() and not looks_local:
        return  # a hub id such as GSAI-ML/ReFusion
    if not local.exists():
        raise ConfigError(f"`model` {path!r}: no such directory. Pass a checkpoint directory (config.json and "
                          "weights) or a Hugging Face hub id such as GSAI-ML/ReFusion.", param='model')
    if not local.is_dir():
        raise ConfigError(f"`model` {path!r} is a file; pass the checkpoint directory that holds it.", param='model')
    if not (local / "config.json").is_file():
        raise ConfigError(f"`model` {path!r} has no config.json: it is not a transformers checkpoint directory.", param='model')


def torch_dtype(value: Any) -> Any:
    """``"auto"``, a ``torch.dtype`` or the name of one (``"bfloat16"``, ``"torch.float32"``) as a dtype."""
    import torch

    if value is None or value == "auto" or isinstance(value, torch.dtype):
        return "auto" if value is None else value
    if isinstance(value, str):
        found = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(found, torch.dtype) and found.is_floating_point:
            return found
    raise ConfigError(f"`dtype` must be 'auto', a torch.dtype or a floating dtype name such as float32, float16 or "
                      f"bfloat16; got {value!r}.", param='dtype')


def check_device(value: Any) -> None:
    """Refuse a device string torch cannot parse, or a CUDA/MPS device this torch cannot use."""
    import torch

    if value is None:
        return
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConfigError(f"`device` must be a torch device such as cpu, cuda or cuda:1; got {value!r} ({exc}).", param='device') \
            from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"`device` {value!r}: this torch ({torch.__version__}) sees no CUDA device; use "
                              "`device='cpu'` or install a CUDA build of torch.", param='device')
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"`device` {value!r}: only {torch.cuda.device_count()} CUDA device(s) are visible.", param='device')
    if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ConfigError(f"`device` {value!r}: MPS is not available on this machine; use `device='cpu'`.", param='device')


def check_token_ids(name: str, ids: Iterable[int], vocab_size: int) -> None:
    """Refuse token ids outside ``[0, vocab_size)``."""
    bad = sorted(i for i in ids if not 0 <= i < vocab_size)
    if bad:
        raise ConfigError(f"`{name}` must be token ids in [0, {vocab_size}) (the model's vocabulary); got {bad}.", param=name)


def check_chat(tokenizer: Any) -> None:
    """Refuse ``chat=True`` for a tokenizer without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("`chat` is on but the tokenizer has no chat template; drop `--chat` (`chat=True`) to feed "
                          "the prompt as is, or use a checkpoint whose tokenizer defines `chat_template`.", param='chat')


def unknown_token_id(tokenizer: Any) -> int | None:
    """The id a tokenizer gives characters it does not know, or ``None`` if it has no such fallback."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None:
        return int(unk)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    name = getattr(getattr(backend, "model", None), "unk_token", None)
    if name:
        found = tokenizer.convert_tokens_to_ids(name)
        return None if found is None else int(found)
    return None


def check_known_characters(prompt: str, tokenizer: Any) -> None:
    """Refuse text whose characters the tokenizer maps to its unknown token, naming them and the alphabet.

    A tokenizer without an unknown-token fallback (byte-level BPE) accepts any text.
    """
    unk = unknown_token_id(tokenizer)
    if unk is None:
        return
    encoded = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    unk_text = tokenizer.convert_ids_to_tokens(unk)
    bad: list[str] = []
    for token, (start, stop) in zip(encoded["input_ids"], encoded["offset_mapping"]):
        piece = prompt[start:stop]
        if token == unk and piece != unk_text:
            bad.extend(ch for ch in piece if ch not in bad)
    if bad:
        vocab = tokenizer.get_vocab()
        singles = sorted(t for t in vocab if len(t) == 1)
        alphabet = f" The tokenizer's alphabet: {''.join(singles)!r}." if 0 < len(vocab) <= 512 else ""
        raise ConfigError(f"`prompt` {prompt!r} has characters the tokenizer does not know: "
                          f"{', '.join(map(repr, bad))} (they would all become {unk_text!r}).{alphabet}", param='prompt')


def check_output_dir(path: Any, param: str = "out") -> None:
    """Refuse an output directory that is an existing file or cannot be created (checks only, creates nothing)."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"`{param}` must be a directory path; got {path!r}.", param=param)
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"`{param}` {str(path)!r} is an existing file; name a directory (it is created if missing).", param=param)
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(f"`{param}` {str(path)!r} cannot be created: {str(existing)!r} is not a writable directory.", param=param)
