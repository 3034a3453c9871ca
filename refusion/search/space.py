"""A space of decoders: which part names and which parameter values a sweep may try.

A space is a base preset plus *dimensions*. A part dimension lists part
names (``selector=threshold,topk``); a parameter dimension lists values
(``slot_size=4,8``) or a range ``low:high[:step]`` (``slot_threshold=0.5:0.9:0.1``).
A *point* is one choice per dimension, as a dict; a parameter that none of the
point's parts declares (``k`` with ``selector=threshold``) is left out of it.
This module knows nothing about models or evaluation.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Iterable, Iterator, Mapping

import attrs

from refusion.config import PART_KINDS, SPEC_PARAMS, DecoderSpec
from refusion.config.params import parse_value
from refusion.errors import ConfigError, UnknownNameError


def _number(text: str, field: str) -> float | int:
    value = parse_value(text.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"`{field}`: range bounds must be numbers; got {text!r}.", param=field)
    return value


@attrs.frozen
class Dimension:
    """One axis of the space: ``values`` (an explicit list) or a range ``low..high`` (inclusive) with an optional ``step``."""

    name: str
    values: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.values is not None:
            if not self.values:
                raise ConfigError(f"`{self.name}`: the list of values is empty; give at least one.", param=self.name)
            return
        if self.low is None or self.high is None:
            raise ConfigError(f"`{self.name}`: give a list of values or a range low:high[:step].", param=self.name)
        if self.low > self.high:
            raise ConfigError(f"`{self.name}`: the range {self.low}:{self.high} is empty (low > high).", param=self.name)
        if self.step is not None and not self.step > 0:
            raise ConfigError(f"`{self.name}`: the step must be > 0; got {self.step}.", param=self.name)

    @property
    def is_part(self) -> bool:
        return self.name in PART_KINDS

    @property
    def is_integer(self) -> bool:
        return self.values is None and all(isinstance(v, int) for v in (self.low, self.high, self.step or 1))

    def grid(self) -> tuple[Any, ...]:
        """Every value a grid search tries (a range needs a ``step``)."""
        if self.values is not None:
            return self.values
        if self.step is None:
            raise ConfigError(f"`{self.name}`: a grid search needs a step (low:high:step); "
                              f"got {self.low}:{self.high}. Use --mode optuna for a continuous range.", param=self.name)
        count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        if self.is_integer:
            return tuple(int(self.low + i * self.step) for i in range(count))
        return tuple(round(self.low + i * self.step, 10) for i in range(count))

    def suggest(self, trial: Any, grid: bool = False) -> Any:
        """The value optuna's ``trial`` proposes on this axis (among the grid values when ``grid``)."""
        if self.values is not None or grid:
            return trial.suggest_categorical(self.name, list(self.grid()))
        if self.is_integer:
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1)
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step)

    def describe(self) -> str:
        if self.values is not None:
            return f"{self.name}=" + ",".join(str(v) for v in self.values)
        return f"{self.name}={self.low}:{self.high}" + (f":{self.step}" if self.step is not None else "")


def parse_dimension(text: str) -> Dimension:
    """``"selector=threshold,topk"``, ``"slot_size=4,8"`` or ``"slot_threshold=0.5:0.9:0.1"`` -> a :class:`Dimension`."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"`--space` entries are NAME=VALUES or NAME=LOW:HIGH[:STEP]; got {text!r}.", param='--space')
    return dimension(name, rest)


def dimension(name: str, spec: Any) -> Dimension:
    """A :class:`Dimension` from text (``"a,b"``, ``"0.5:0.9:0.1"``), a list, or a mapping ``{low, high, step}``."""
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"low", "high", "step", "values"}
        if unknown:
            raise ConfigError(f"`{name}`: unknown key(s) {', '.join(sorted(unknown))}; use low, high, step or values.", param=name)
        if "values" in spec:
            return dimension(name, list(spec["values"]))
        return Dimension(name, low=spec.get("low"), high=spec.get("high"), step=spec.get("step"))
    if isinstance(spec, (list, tuple)):
        return Dimension(name, values=tuple(spec))
    if not isinstance(spec, str):
        return Dimension(name, values=(spec,))
    if ":" in spec and name not in PART_KINDS:
        bounds = spec.split(":")
        if len(bounds) not in (2, 3) or not all(b.strip() for b in bounds):
            raise ConfigError(f"`{name}`: a range is LOW:HIGH or LOW:HIGH:STEP; got {spec!r}.", param=name)
        low, high, *step = (_number(b, name) for b in bounds)
        return Dimension(name, low=low, high=high, step=step[0] if step else None)
    values = tuple(parse_value(v.strip()) if name not in PART_KINDS else v.strip() for v in spec.split(",") if v.strip())
    return Dimension(name, values=values)


@attrs.frozen
class Space:
    """A base :class:`~refusion.config.spec.DecoderSpec` and the dimensions a sweep varies over it.

    ``registry`` resolves part names; every part name must be registered and
    every parameter must be declared by some part the space can choose (or be
    a decoder option), else :class:`ConfigError` names the field.
    """

    base: DecoderSpec
    dimensions: tuple[Dimension, ...]
    registry: Any = attrs.field(eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        names = [d.name for d in self.dimensions]
        if not names:
            raise ConfigError("`space` is empty: give at least one dimension, e.g. -s slot_threshold=0.5:0.9:0.1.", param='space')
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"`space`: {', '.join(twice)} given more than once; give each dimension once.", param='space')
        for dim in self.parts:
            for value in dim.values or ():
                if not isinstance(value, str):
                    raise ConfigError(f"`{dim.name}`: part names are text; got {value!r}.", param=dim.name)
                try:
                    self.registry.entry(dim.name, value)
                except UnknownNameError as exc:
                    raise UnknownNameError(f"`space` field `{dim.name}`: {exc}", param='space') from None
        for dim in self.params:
            self._check_param(dim.name)

    @property
    def parts(self) -> tuple[Dimension, ...]:
        return tuple(d for d in self.dimensions if d.is_part)

    @property
    def params(self) -> tuple[Dimension, ...]:
        return tuple(d for d in self.dimensions if not d.is_part)

    def _check_param(self, name: str) -> None:
        if name.split(".", 1)[0] not in PART_KINDS and "." in name:
            raise ConfigError(f"`space` field `{name}`: unknown part {name.split('.')[0]!r}; "
                              f"parts are {', '.join(PART_KINDS)}.", param='space')
        for parts in self._part_combinations():
            if self.accepts(parts, name):
                return
        accepted = sorted({p for parts in self._part_combinations() for kind in PART_KINDS
                           for p in self.registry.entry(kind, parts[kind]).parameters()})
        raise ConfigError(f"`space` field `{name}`: no part the space can choose declares it; "
                          f"parameters are {', '.join(accepted + list(SPEC_PARAMS))}.", param='space')

    def _part_combinations(self) -> Iterator[dict[str, str]]:
        parts = self.parts
        for choice in itertools.product(*(d.values for d in parts)):
            combo = self.base_names()
            combo.update(zip((d.name for d in parts), choice))
            yield combo

    def accepts(self, parts: Mapping[str, str], name: str) -> bool:
        """Whether a decoder with ``parts`` (kind -> name) takes parameter ``name``."""
        if name in SPEC_PARAMS:
            return True
        if "." in name:
            kind, _, field = name.partition(".")
            return field in self.registry.entry(kind, parts[kind]).parameters()
        return any(name in self.registry.entry(kind, parts[kind]).parameters() for kind in PART_KINDS)

    def grid(self) -> list[dict[str, Any]]:
        """Every distinct point of a grid search, parts first, in a fixed order."""
        points, seen = [], set()
        for parts in itertools.product(*(d.grid() for d in self.parts)):
            chosen = dict(zip((d.name for d in self.parts), parts))
            full = {**self.base_names(), **chosen}
            live = [d for d in self.params if self.accepts(full, d.name)]
            for values in itertools.product(*(d.grid() for d in live)):
                point = {**chosen, **dict(zip((d.name for d in live), values))}
                if point_key(point) not in seen:
                    seen.add(point_key(point))
                    points.append(point)
        return points

    def grid_size(self) -> int | None:
        """Number of grid points, or ``None`` when a range has no step (the space is continuous)."""
        if any(d.values is None and d.step is None for d in self.dimensions):
            return None
        return len(self.grid())

    def suggest(self, trial: Any, grid: bool = False) -> dict[str, Any]:
        """The point optuna's ``trial`` proposes: parts first, then the parameters those parts take
        (ranges as their grid values when ``grid``)."""
        point = {d.name: d.suggest(trial, grid) for d in self.parts}
        full = {**self.base_names(), **point}
        point.update({d.name: d.suggest(trial, grid) for d in self.params if self.accepts(full, d.name)})
        return point

    def base_names(self) -> dict[str, str]:
        """The base's part names, by kind."""
        return {kind: spec.name for kind, spec in self.base.parts().items()}

    def preset(self, point: Mapping[str, Any], gen_length: int | None = None) -> DecoderSpec:
        """The full decoder spec of ``point``: the base with the point's parts and parameters merged
        (:meth:`DecoderSpec.merged`: a replaced part loses the base's parameters for it)."""
        parts = {k: v for k, v in point.items() if k in PART_KINDS}
        spec = self.base.merged(parts, {k: v for k, v in point.items() if k not in PART_KINDS})
        return attrs.evolve(spec, description=f"refusion sweep point {describe_point(point)}",
                            gen_length=gen_length or self.base.gen_length, peer=None)

    def describe(self) -> list[str]:
        return [d.describe() for d in self.dimensions]


def point_key(point: Mapping[str, Any]) -> tuple:
    """A hashable identity of a point (floats rounded so 0.7 and 0.7000000001 are the same point)."""
    return tuple(sorted((k, round(v, 9) if isinstance(v, float) else v) for k, v in point.items()))


def describe_point(point: Mapping[str, Any]) -> str:
    """``"selector=topk k=2"``: a short label of a point."""
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in point.items())


def build_space(base: DecoderSpec, specs: Iterable[str | Dimension], registry: Any = None) -> Space:
    """A :class:`Space` over ``base`` from command-line specs or dimensions."""
    from refusion.plugins.registry import registry as default_registry

    dims = tuple(d if isinstance(d, Dimension) else parse_dimension(d) for d in specs)
    return Space(base, dims, registry or default_registry())
