"""Checks on how a user asks for a model (path, dtype, device, token ids), before anything is loaded.

Each function raises :class:`~refusion.errors.ConfigError` naming the
parameter, the value and the fix; none loads a model or allocates a tensor.
"""

from __future__ import annotations

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


#: a checkpoint's size fields and the largest value each may hold (far beyond any published model)
CONFIG_SIZES = {"vocab_size": 2**24, "hidden_size": 2**17, "intermediate_size": 2**20, "num_hidden_layers": 2**12,
                "num_attention_heads": 2**12, "num_key_value_heads": 2**12, "head_dim": 2**12,
                "max_position_embeddings": 2**26}


def check_config(config: dict, path: str) -> None:
    """Refuse a ``config.json`` whose size fields are not positive integers within :data:`CONFIG_SIZES`.

    Also checks ``model_type`` (text) and ``architectures`` (a list of
    text); the same fields nested under ``text_config`` are checked too. A
    damaged or hostile config is refused here, before transformers builds
    a network from it (a negative or astronomical size would fail deep inside
    ``torch`` or allocate for ever).
    """
    for place, section in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(section, dict):
            continue
        for field, high in CONFIG_SIZES.items():
            value = section.get(field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ConfigError(f"`model` {path!r}: config.json field `{place}{field}` must be an integer in "
                                  f"[1, {high}]; got {value!r:.60}.", param="model")
    if "model_type" in config and not isinstance(config["model_type"], str):
        raise ConfigError(f"`model` {path!r}: config.json field `model_type` must be text; got "
                          f"{config['model_type']!r:.60}.", param="model")
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ConfigError(f"`model` {path!r}: config.json field `architectures` must be a list of class names; got "
                          f"{archs!r:.60}.", param="model")
