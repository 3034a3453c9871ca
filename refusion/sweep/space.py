"""A space of decoders: which part names and which parameter values a sweep may try.

A space is a base preset plus *dimensions*. A part dimension lists part
names (``selector=threshold,topk``); a parameter dimension lists values
(``slot_size=4,8``) or a range ``low:high[:step]`` (``slot_threshold=0.5:0.9:0.1``).
A *point* is one choice per dimension, as a dict; a parameter that none of the
point's parts declares (``k`` with ``selector=threshold``) is left out of it.
This module knows nothing about models or evaluation.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from refusion.config import PART_KINDS, SPEC_PARAMS, DecoderSpec
from refusion.config.params import parse_value
from refusion.errors import ConfigError, UnknownNameError
from refusion.limits import MAX_TRIALS
from refusion.validators import is_integer, shown

#: a grid search tries at most this many points (each is a trial of the study)
MAX_GRID = MAX_TRIALS
#: numbers in a space (values and range bounds) lie within +-this
MAX_MAGNITUDE = 2**64
#: the smallest step of a float range (points are compared to 9 decimals)
MIN_FLOAT_STEP = 1e-6


def _number(text: str, field: str) -> float | int:
    value = parse_value(text.strip())
    if not _is_number(value):
        raise ConfigError(f"`{field}`: range bounds must be numbers; got {text.strip()[:80]!r}.", param=field)
    return value


def _is_number(value: Any) -> bool:
    """An int or a float, infinities and NaN included (ranges refuse them with their own message)."""
    return is_integer(value) or isinstance(value, float)


def _value_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a value of a dimension, or ``None`` when it can."""
    if value is None or isinstance(value, (str, bool)):
        return None
    if not _is_number(value):
        return f"values are numbers, text, true/false or none; got {type(value).__name__} {shown(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"values must be finite numbers; got {value}"
    if abs(value) > MAX_MAGNITUDE:
        return f"numbers must lie within +-2**64; got {shown(value)}"
    return None


def _key(value: Any) -> Any:
    return round(value, 9) if isinstance(value, float) else value


def _tuple(values: Any) -> tuple | None:
    if values is None or isinstance(values, tuple):
        return values
    if isinstance(values, list):
        return tuple(values)
    raise ConfigError(f"a dimension's values are a list; got {type(values).__name__} {shown(values)}.", param="space")


@attrs.frozen
class Dimension:
    """One axis of the space: ``values`` (an explicit list) or a range ``low..high`` (inclusive) with an optional
    ``step``.

    Values are numbers, text, true/false or none; numbers are finite and within
    +-2**64, range bounds too; a float range's step is at least
    :data:`MIN_FLOAT_STEP`. Anything else is a :class:`ConfigError` naming the dimension.
    """

    name: str
    values: tuple[Any, ...] | None = attrs.field(default=None, converter=_tuple)
    low: float | None = None
    high: float | None = None
    step: float | None = None

    def __attrs_post_init__(self) -> None:
        name = self.name
        if self.values is not None:
            if not self.values:
                raise ConfigError(f"`{name}`: the list of values is empty; give at least one.", param=name)
            for value in self.values:
                problem = _value_problem(value)
                if problem:
                    raise ConfigError(f"`{name}`: {problem}.", param=name)
            return
        if self.is_part:
            raise ConfigError(
                f"`{name}`: a part dimension lists part names (e.g. {name}=a,b); got a range.", param=name
            )
        if self.low is None or self.high is None:
            raise ConfigError(f"`{name}`: give a list of values or a range low:high[:step].", param=name)
        for bound in ("low", "high", "step"):
            value = getattr(self, bound)
            if value is None:
                continue
            if not _is_number(value) or _value_problem(value):
                raise ConfigError(
                    f"`{name}`: the range's {bound} must be a finite number within +-2**64; got {shown(value)}.",
                    param=name,
                )
        if self.low > self.high:
            raise ConfigError(f"`{name}`: the range {self.low}:{self.high} is empty (low > high).", param=name)
        if self.step is not None:
            if not self.step > 0:
                raise ConfigError(f"`{name}`: the step must be > 0; got {self.step}.", param=name)
            if not self.is_integer and self.step < MIN_FLOAT_STEP:
                raise ConfigError(
                    f"`{name}`: the step of a float range must be >= {MIN_FLOAT_STEP:g} (points are "
                    f"compared to 9 decimals); got {self.step:g}.",
                    param=name,
                )

    @property
    def is_part(self) -> bool:
        return self.name in PART_KINDS

    @property
    def is_integer(self) -> bool:
        return self.values is None and all(isinstance(v, int) for v in (self.low, self.high, self.step or 1))

    def _range(self) -> tuple[Any, Any]:
        """A range's ``(low, high)``: numbers (checked when the dimension was made; ``values`` is then ``None``)."""
        return self.low, self.high

    def _distinct(self) -> tuple[Any, ...]:
        seen: dict[Any, Any] = {}
        for value in self.values or ():
            seen.setdefault(_key(value), value)
        return tuple(seen.values())

    def count(self) -> int | None:
        """How many values a grid search tries on this axis (computed, not listed); ``None`` for a range without a
        step (continuous). Huge ranges count as ``2**62``."""
        if self.values is not None:
            return len(self._distinct())
        if self.step is None:
            return None
        low, high = self._range()
        if self.is_integer:
            return int((high - low) // self.step + 1)
        spans = (high - low) / self.step
        return math.floor(spans + 1e-9) + 1 if spans < 2**62 else 2**62

    def grid(self) -> tuple[Any, ...]:
        """Every value a grid search tries, each once (a range needs a ``step``; at most :data:`MAX_GRID`)."""
        count = self.count()
        if count is None:
            raise ConfigError(
                f"`{self.name}`: a grid search needs a step (low:high:step); "
                f"got {self.low}:{self.high}. Use --mode optuna for a continuous range.",
                param=self.name,
            )
        if count > MAX_GRID:
            raise ConfigError(
                f"`{self.name}`: {self.describe()} has {count} values; a grid search tries at most "
                f"{MAX_GRID} points. Use a larger step or --mode optuna.",
                param=self.name,
            )
        if self.values is not None:
            return self._distinct()
        low, _ = self._range()
        step: Any = self.step
        if self.is_integer:
            return tuple(int(low + i * step) for i in range(count))
        return tuple(round(low + i * step, 10) for i in range(count))

    def suggest(self, trial: Any, grid: bool = False) -> Any:
        """The value optuna's ``trial`` proposes on this axis (among the grid values when ``grid``)."""
        if self.values is not None:
            return trial.suggest_categorical(self.name, list(self._distinct()))
        if grid:
            return trial.suggest_categorical(self.name, list(self.grid()))
        if self.is_integer:
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1)
        low, high = self._range()
        return trial.suggest_float(self.name, float(low), float(high), step=self.step)

    def describe(self) -> str:
        if self.values is not None:
            return f"{self.name}=" + ",".join(str(v) for v in self.values)
        return f"{self.name}={self.low}:{self.high}" + (f":{self.step}" if self.step is not None else "")


def parse_dimension(text: str) -> Dimension:
    """``"selector=threshold,topk"``, ``"slot_size=4,8"`` or ``"slot_threshold=0.5:0.9:0.1"`` -> a
    :class:`Dimension`."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"`--space` entries are NAME=VALUES or NAME=LOW:HIGH[:STEP]; got {text!r}.", param="--space")
    return dimension(name, rest)


def dimension(name: str, spec: Any) -> Dimension:
    """A :class:`Dimension` from text (``"a,b"``, ``"0.5:0.9:0.1"``), a list, or a mapping ``{low, high, step}``."""
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"low", "high", "step", "values"}
        if unknown:
            raise ConfigError(
                f"`{name}`: unknown key(s) {', '.join(sorted(map(str, unknown)))}; use low, high, step or values.",
                param=name,
            )
        if "values" in spec:
            if set(spec) != {"values"}:
                raise ConfigError(
                    f"`{name}`: give either `values` or low, high and step; got {', '.join(sorted(map(str, spec)))}.",
                    param=name,
                )
            if not isinstance(spec["values"], (list, tuple)):
                raise ConfigError(f"`{name}`: `values` must be a list; got {shown(spec['values'])}.", param=name)
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
    values = tuple(
        parse_value(v.strip()) if name not in PART_KINDS else v.strip() for v in spec.split(",") if v.strip()
    )
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
            raise ConfigError(
                "`space` is empty: give at least one dimension, e.g. -s slot_threshold=0.5:0.9:0.1.", param="space"
            )
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(
                f"`space`: {', '.join(twice)} given more than once; give each dimension once.", param="space"
            )
        for dim in self.parts:
            for value in dim.values or ():
                if not isinstance(value, str):
                    raise ConfigError(f"`{dim.name}`: part names are text; got {value!r}.", param=dim.name)
                try:
                    self.registry.entry(dim.name, value)
                except UnknownNameError as exc:
                    raise UnknownNameError(f"`space` field `{dim.name}`: {exc}", param="space") from None
        for dim in self.params:
            self._check_param(dim.name)
        for dim in self.params:
            self._check_values(dim)

    @property
    def parts(self) -> tuple[Dimension, ...]:
        return tuple(d for d in self.dimensions if d.is_part)

    @property
    def params(self) -> tuple[Dimension, ...]:
        return tuple(d for d in self.dimensions if not d.is_part)

    def _check_param(self, name: str) -> None:
        if name.split(".", 1)[0] not in PART_KINDS and "." in name:
            raise ConfigError(
                f"`space` field `{name}`: unknown part {name.split('.')[0]!r}; parts are {', '.join(PART_KINDS)}.",
                param="space",
            )
        for parts in self._part_combinations():
            if self.accepts(parts, name):
                return
        accepted = sorted(
            {
                p
                for parts in self._part_combinations()
                for kind in PART_KINDS
                for p in self.registry.entry(kind, parts[kind]).parameters()
            }
        )
        raise ConfigError(
            f"`space` field `{name}`: no part the space can choose declares it; "
            f"parameters are {', '.join(accepted + list(SPEC_PARAMS))}.",
            param="space",
        )

    def _check_values(self, dim: Dimension) -> None:
        """Refuse a value (a listed one, or a range's bounds) that a part or option declaring ``dim`` refuses:
        such points would all fail, silently dropped from the results."""
        checks = self._checks(dim.name)
        values = dim._distinct() if dim.values is not None else (dim.low, dim.high)
        for value in values:
            for check in checks:
                error = check(value)
                if error is not None:
                    raise ConfigError(
                        f"`space` field `{dim.name}`: the value {shown(value)} cannot be tried: {error}", param=dim.name
                    )

    def _checks(self, name: str) -> list[Callable[[Any], ConfigError | None]]:
        """One check per class that takes parameter ``name`` in some point of the space (its field's validator)."""
        from refusion.config.spec import DECODER_OPTIONS, SAMPLING_PARAMS, sampler_name
        from refusion.decoding.decoder import Decoder
        from refusion.decoding.sampling import SAMPLERS

        if name in DECODER_OPTIONS:
            return [functools.partial(_field_error, Decoder, name)]
        if name == "sampler":
            return [functools.partial(_call_error, sampler_name)]
        if name in SAMPLING_PARAMS:
            names = {self.base.sampler.name}
            names.update(v for d in self.params if d.name == "sampler" for v in d._distinct())
            classes: list[Any] = [SAMPLERS.get("categorical" if n == "greedy" else n) for n in names]
            return [functools.partial(_field_error, cls, name) for cls in classes if cls is not None]
        kind, _, field = name.rpartition(".")
        checks: list[Callable[[Any], ConfigError | None]] = []
        for k in [kind] if kind else PART_KINDS:
            candidates = {self.base_names()[k], *(v for d in self.parts if d.name == k for v in d._distinct())}
            for part in sorted(candidates):
                entry = self.registry.entry(k, part)
                if field in entry.parameters():
                    checks.append(functools.partial(_field_error, entry.cls, field))
        return checks

    def _part_combinations(self) -> Iterator[dict[str, str]]:
        parts = self.parts
        for choice in itertools.product(*(d._distinct() for d in parts)):
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
        """Every distinct point of a grid search, parts first, in a fixed order (at most :data:`MAX_GRID`; the
        size is computed before any point is listed)."""
        size = self.grid_size()
        if size is None:
            for dim in self.dimensions:
                dim.grid()  # the error names the range without a step
            raise ConfigError("`space` has a range without a step; a grid search needs steps.", param="space")
        if size > MAX_GRID:
            raise ConfigError(
                f"`space` has {size} grid points ({' x '.join(str(d.count()) for d in self.dimensions)} "
                f"values); a grid search tries at most {MAX_GRID}. Use larger steps, fewer values, or "
                "--mode optuna with --trials.",
                param="space",
            )
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
        """Number of grid points, computed without listing them, or ``None`` when a range has no step (the space
        is continuous)."""
        if any(d.count() is None for d in self.dimensions):
            return None
        total = 0
        for parts in self._part_combinations():
            size = 1
            for dim in self.params:
                if self.accepts(parts, dim.name):
                    size *= dim.count() or 1  # every count is known here
            total += size
        return total

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
        return attrs.evolve(
            spec,
            description=f"refusion sweep point {describe_point(point)}",
            gen_length=gen_length or self.base.gen_length,
            peer=None,
        )

    def describe(self) -> list[str]:
        return [d.describe() for d in self.dimensions]


def _field_error(cls: type, name: str, value: Any) -> ConfigError | None:
    """The error the validator of ``cls``'s field ``name`` gives ``value``, or ``None`` (also when it cannot tell)."""
    if not attrs.has(cls):
        return None
    field = next((f for f in attrs.fields(cls) if (f.alias or f.name) == name and f.init), None)
    if field is None:
        return None
    try:
        if field.converter is not None:
            value = field.converter(value)
        if field.validator is not None:
            field.validator(None, field, value)
    except ConfigError as exc:
        return exc
    except Exception:  # a validator that needs the other fields: the decoder checks it when built
        return None
    return None


def _call_error(check: Callable[[Any], Any], value: Any) -> ConfigError | None:
    try:
        check(value)
    except ConfigError as exc:
        return exc
    return None


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
