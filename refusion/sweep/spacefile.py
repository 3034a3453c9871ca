"""Spaces written in a YAML or TOML file.

The file has a ``space`` table mapping names to values, and optionally the
``preset`` the space varies and the ``gen_length``::

    preset: model                      # or a preset name; default: the model's refusion.json
    gen_length: 32
    space:
      selector: [threshold, topk]
      slot_threshold: "0.5:0.9:0.1"    # or {low: 0.5, high: 0.9, step: 0.1}
      k: [1, 2]

YAML needs PyYAML (``pip install refusion[research]``); TOML uses the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from refusion.errors import ConfigError
from refusion.files import parse_text, read_text, where
from refusion.limits import MAX_GEN_LENGTH
from refusion.sweep.space import Dimension, dimension
from refusion.validators import check_integer, shown

#: space files larger than this are refused before they are parsed
MAX_SPACE_BYTES = 4 * 2**20

KEYS = ("space", "preset", "gen_length")
WHAT = "`space file`"
PARAM = "space_file"


@attrs.frozen
class SpaceFile:
    """What a space file says: its dimensions, the base preset's name (or ``None``), a generation length and the
    file's ``path`` (errors about its dimensions name it)."""

    dimensions: tuple[Dimension, ...]
    preset: str | None = None
    gen_length: int | None = None
    path: str | None = None


def _read(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"{where(WHAT, path)} must end in .yaml, .yml or .toml.", param=PARAM)
    text = read_text(path, what=WHAT, param=PARAM, max_bytes=MAX_SPACE_BYTES)
    place = where(WHAT, path)
    if suffix == ".toml":
        import tomllib

        return parse_text(
            text, tomllib.loads, place=place, param=PARAM, language="TOML", syntax=tomllib.TOMLDecodeError
        )
    try:
        import yaml
    except ImportError:
        raise ConfigError("A YAML space file needs PyYAML: pip install 'refusion[research]'.", param=PARAM) from None

    def describe(exc: Any) -> str:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        return (f"line {line + 1}: " if line is not None else "") + " ".join(str(exc).split())

    return parse_text(
        text, yaml.safe_load, place=place, param=PARAM, language="YAML", syntax=yaml.YAMLError, describe=describe
    )


def load_space_file(path: str | Path) -> SpaceFile:
    """Read a space file; every error names the file and the field (``param``: the dimension's name for a bad
    dimension, else the field, else ``space_file``)."""
    path = Path(path)
    data = _read(path)
    place = where(WHAT, path)
    if not isinstance(data, dict):
        raise ConfigError(f"{place} must hold a table with a `space` field.", param=PARAM)
    unknown = sorted(map(str, set(data) - set(KEYS)))
    if unknown:
        raise ConfigError(
            f"{place}: unknown field(s) {', '.join(unknown)}; fields are {', '.join(KEYS)}.", param=unknown[0]
        )
    space = data.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{place}: field `space` must be a non-empty table of name: values.", param="space")
    dims = []
    for name, spec in space.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{place}: the names in `space` are text; got {shown(name)}.", param="space")
        try:
            dims.append(dimension(name, spec))
        except ConfigError as exc:
            raise ConfigError(f"{place}, field `space.{name}`: {exc}", param=name) from None
    length = data.get("gen_length")
    if length is not None:
        try:
            check_integer("gen_length", length, 1, MAX_GEN_LENGTH, "tokens generated per prompt")
        except ConfigError as exc:
            raise ConfigError(f"{place}: field {exc}", param="gen_length") from None
    preset = data.get("preset")
    if preset is not None and not isinstance(preset, str):
        raise ConfigError(f"{place}: field `preset` must be a preset name; got {shown(preset)}.", param="preset")
    return SpaceFile(tuple(dims), preset, length, str(path))
