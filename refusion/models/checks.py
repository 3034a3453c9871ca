"""Checks on how a user asks for a model (path, dtype, device, token ids), before anything is loaded.

Each function raises :class:`~refusion.errors.ConfigError` naming the
parameter, the value and the fix; none loads a model or allocates a tensor.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from refusion.errors import ConfigError
from refusion.limits import MAX_BLOCK_LENGTH
from refusion.validators import is_integer


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
        raise ConfigError(
            f"`model` {path!r}: no such directory. Pass a checkpoint directory (config.json and "
            "weights) or a Hugging Face hub id such as GSAI-ML/ReFusion.",
            param="model",
        )
    if not local.is_dir():
        raise ConfigError(f"`model` {path!r} is a file; pass the checkpoint directory that holds it.", param="model")
    if not (local / "config.json").is_file():
        raise ConfigError(
            f"`model` {path!r} has no config.json: it is not a transformers checkpoint directory.", param="model"
        )


def torch_dtype(value: Any) -> Any:
    """``"auto"``, a ``torch.dtype`` or the name of one (``"bfloat16"``, ``"torch.float32"``) as a dtype."""
    import torch

    if value is None or value == "auto" or isinstance(value, torch.dtype):
        return "auto" if value is None else value
    if isinstance(value, str):
        found = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(found, torch.dtype) and found.is_floating_point:
            return found
    raise ConfigError(
        f"`dtype` must be 'auto', a torch.dtype or a floating dtype name such as float32, float16 or "
        f"bfloat16; got {value!r}.",
        param="dtype",
    )


def check_device(value: Any) -> None:
    """Refuse a device string torch cannot parse, or a CUDA/MPS device this torch cannot use."""
    import torch

    if value is None:
        return
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"`device` must be a torch device such as cpu, cuda or cuda:1; got {value!r} ({exc}).", param="device"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"`device` {value!r}: this torch ({torch.__version__}) sees no CUDA device; use "
                "`device='cpu'` or install a CUDA build of torch.",
                param="device",
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"`device` {value!r}: only {torch.cuda.device_count()} CUDA device(s) are visible.", param="device"
            )
    if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ConfigError(
            f"`device` {value!r}: MPS is not available on this machine; use `device='cpu'`.", param="device"
        )


def check_token_ids(name: str, ids: Iterable[int], vocab_size: int) -> None:
    """Refuse token ids outside ``[0, vocab_size)``."""
    bad = sorted(i for i in ids if not 0 <= i < vocab_size)
    if bad:
        raise ConfigError(
            f"`{name}` must be token ids in [0, {vocab_size}) (the model's vocabulary); got {bad}.", param=name
        )


def token_id(value: Any) -> int | None:
    """``value`` as a token id if it is an integer (a Python, NumPy or 0-d torch integer; never a bool, a float
    or text), else ``None``."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_adapter_options(options: Mapping[str, Any]) -> None:
    """Refuse, before anything is loaded, an adapter option of the wrong type: ``mask_token_id`` (a token id),
    ``eos_token_id`` (a token id or a list of them; an empty list: the model has none), ``block_length`` (an
    integer >= 1). Their range against the model (its vocabulary) is checked when the adapter is built."""
    from refusion.validators import check_integer, shown

    mask = options.get("mask_token_id")
    mask_id = None if mask is None else token_id(mask)
    if mask is not None and (mask_id is None or mask_id < 0):
        raise ConfigError(
            f"`mask_token_id` must be a token id (an integer >= 0); got {shown(mask)}.", param="mask_token_id"
        )
    eos = options.get("eos_token_id")
    if eos is not None:
        listed = list(eos) if isinstance(eos, (list, tuple, set, frozenset)) else [eos]
        ids = [token_id(t) for t in listed]
        if any(t is None or t < 0 for t in ids):
            raise ConfigError(
                f"`eos_token_id` must be a token id (an integer >= 0) or a list of them (empty: none); got "
                f"{shown(eos)}.",
                param="eos_token_id",
            )
    if options.get("block_length") is not None:
        check_integer("block_length", options["block_length"], 1, MAX_BLOCK_LENGTH, "refusion.limits.MAX_BLOCK_LENGTH")


#: a checkpoint's size fields and the largest value each may hold (far beyond any published model)
CONFIG_SIZES = {
    "vocab_size": 2**24,
    "hidden_size": 2**17,
    "intermediate_size": 2**20,
    "num_hidden_layers": 2**12,
    "num_attention_heads": 2**12,
    "num_key_value_heads": 2**12,
    "head_dim": 2**12,
    "max_position_embeddings": 2**26,
}


#: a checkpoint's special-token fields, each a token id or a list of them (or null)
TOKEN_FIELDS = ("eos_token_id", "bos_token_id", "pad_token_id", "mask_token_id")


def check_token_fields(section: dict, vocab_size: Any, path: str, where: str) -> None:
    """Refuse a special-token field of ``section`` (:data:`TOKEN_FIELDS`) that is not a token id (or a list of
    them) below ``vocab_size``; ``where`` starts the field's name in the message (``"config.json field `"``)."""
    high = vocab_size if is_integer(vocab_size) and vocab_size > 0 else None
    for field in TOKEN_FIELDS:
        value = section.get(field)
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(is_integer(t) and t >= 0 and (high is None or t < high) for t in ids):
            allowed = f"a token id in [0, {high})" if high is not None else "a token id (an integer >= 0)"
            raise ConfigError(
                f"`model` {path!r}: {where}{field}` must be {allowed} or a list of them; got {value!r:.60}.",
                param="model",
            )


def check_config(config: dict, path: str) -> None:
    """Refuse a ``config.json`` whose size fields are not positive integers within :data:`CONFIG_SIZES`.

    Also checks ``model_type`` (text), ``architectures`` (a list of text)
    and the special-token ids (:func:`check_token_fields`: within the
    vocabulary); the same fields nested under ``text_config`` are checked too. A
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
            if not is_integer(value) or not 1 <= value <= high:
                raise ConfigError(
                    f"`model` {path!r}: config.json field `{place}{field}` must be an integer in "
                    f"[1, {high}]; got {value!r:.60}.",
                    param="model",
                )
        check_token_fields(
            section, section.get("vocab_size", config.get("vocab_size")), path, f"config.json field `{place}"
        )
    if "model_type" in config and not isinstance(config["model_type"], str):
        raise ConfigError(
            f"`model` {path!r}: config.json field `model_type` must be text; got {config['model_type']!r:.60}.",
            param="model",
        )
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ConfigError(
            f"`model` {path!r}: config.json field `architectures` must be a list of class names; got {archs!r:.60}.",
            param="model",
        )


#: safetensors dtypes that hold no real numbers: a weight stored so is refused (transformers would cast it in silence)
INTEGER_DTYPES = ("BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64")
#: a safetensors header larger than this is left for the loader to report
MAX_HEADER_BYTES = 100 * 2**20


def safetensors_dtypes(file: Path) -> dict[str, str]:
    """``{tensor name: dtype}`` from a safetensors file's header (``{}`` when the header cannot be read)."""
    import json

    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= MAX_HEADER_BYTES:
                return {}
            header = json.loads(f.read(size))
    except (OSError, ValueError):
        return {}
    if not isinstance(header, dict):
        return {}
    return {
        name: str(info.get("dtype"))
        for name, info in header.items()
        if name != "__metadata__" and isinstance(info, dict)
    }


def check_weights(path: str, config: dict) -> None:
    """Refuse a local checkpoint whose weights (``*.weight`` tensors) are stored as integers or booleans, naming the
    file, the tensor and its dtype, before anything is loaded: transformers would cast them to the model's float
    dtype without a word. A checkpoint with a ``quantization_config`` passes (its packed weights are integers);
    a damaged file is left for the loader to report."""
    local = Path(path).expanduser()
    if not local.is_dir() or config.get("quantization_config") is not None:
        return
    for file in sorted(local.glob("*.safetensors")):
        for name, dtype in safetensors_dtypes(file).items():
            if name.endswith(".weight") and dtype in INTEGER_DTYPES:
                raise ConfigError(
                    f"`model` {path!r}: {file.name} stores the weight `{name}` as {dtype}; weights are "
                    "floating point (F16, BF16, F32, F64), or quantized with a `quantization_config` in "
                    "config.json. Is the file damaged or converted wrongly?",
                    param="model",
                )
