"""Where the model shipped inside the package lives."""

from __future__ import annotations

from pathlib import Path

from refusion.errors import ConfigError

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "default_model"


def default_model_path() -> Path:
    """Directory of the shipped default model (config, safetensors weights, tokenizer)."""
    if not (DEFAULT_MODEL_DIR / "config.json").exists():
        raise ConfigError(f"The default model is missing from {DEFAULT_MODEL_DIR}; pass `model=` (a checkpoint path).")
    return DEFAULT_MODEL_DIR
