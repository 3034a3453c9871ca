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
from refusion.search.space import Dimension, dimension

KEYS = ("space", "preset", "gen_length")


@attrs.frozen
class SpaceFile:
    """What a space file says: its dimensions, the base preset's name (or ``None``) and a generation length."""

    dimensions: tuple[Dimension, ...]
    preset: str | None = None
    gen_length: int | None = None


def _read(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"`space file` {str(path)!r} cannot be read: {exc.strerror}.", param='space file') from None
    suffix = path.suffix.lower()
    if suffix == ".toml":
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"`space file` {str(path)!r} is not valid TOML: {exc}.", param='space file') from None
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError("A YAML space file needs PyYAML: pip install 'refusion[research]'.") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            line = getattr(getattr(exc, "problem_mark", None), "line", None)
            where = f" at line {line + 1}" if line is not None else ""
            raise ConfigError(f"`space file` {str(path)!r} is not valid YAML{where}: {exc}.", param='space file') from None
    raise ConfigError(f"`space file` {str(path)!r} must end in .yaml, .yml or .toml.", param='space file')


def load_space_file(path: str | Path) -> SpaceFile:
    """Read a space file; every error names the file and the field."""
    path = Path(path)
    data = _read(path)
    if not isinstance(data, dict):
        raise ConfigError(f"`space file` {str(path)!r} must hold a table with a `space` field.", param='space file')
    unknown = set(data) - set(KEYS)
    if unknown:
        raise ConfigError(f"`space file` {str(path)!r}: unknown field(s) {', '.join(sorted(unknown))}; "
                          f"fields are {', '.join(KEYS)}.", param='space file')
    space = data.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"`space file` {str(path)!r}: field `space` must be a non-empty table of name: values.", param='space file')
    dims = []
    for name, spec in space.items():
        try:
            dims.append(dimension(str(name), spec))
        except ConfigError as exc:
            raise ConfigError(f"`space file` {str(path)!r}, field `space.{name}`: {exc}", param='space file') from None
    length = data.get("gen_length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        raise ConfigError(f"`space file` {str(path)!r}: field `gen_length` must be an integer >= 1; got {length!r}.", param='space file')
    preset = data.get("preset")
    if preset is not None and not isinstance(preset, str):
        raise ConfigError(f"`space file` {str(path)!r}: field `preset` must be a preset name; got {preset!r}.", param='space file')
    return SpaceFile(tuple(dims), preset, length)
