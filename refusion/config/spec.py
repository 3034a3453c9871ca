"""``DecoderSpec``: the one value that describes a decoder.

A spec names the four parts with their parameters (:class:`PartSpec`), the
sampler with its parameters (:class:`SamplerSpec`) and the decoder's options
(``engine``, ``seed``, ``stop_at_eos``, ``cfg_scale``, ``calls_per_token``,
``batch_invariant``),
plus what a preset adds: a default ``gen_length``, a ``description`` and the
``peer`` function it reproduces. Presets are specs; so are a checkpoint's
``refusion.json``, ``--preset-file``, a sweep's ``preset.json`` and the
decoder of a record or trace header, all in one JSON format
(:meth:`DecoderSpec.to_dict`). One rule merges overrides
(:meth:`DecoderSpec.merged`): part names replace the spec's (a replaced part
loses its parameters), then parameters go where they belong (a decoder
option, the sampler, or every part that declares them; ``"selector.k"``
names one part). :meth:`Decoder.from_spec <refusion.decoding.decoder.Decoder.from_spec>`
is the one way from a spec to a decoder; :meth:`DecoderSpec.of` goes back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import attrs

from refusion.config.build import PART_KINDS, build_part, class_path, part_parameters
from refusion.config.options import BY_NAME, DECODER_OPTIONS, spec_option
from refusion.errors import ConfigError, UnknownNameError
from refusion.limits import MAX_GEN_LENGTH
from refusion.validators import is_number, shown

#: the sampler's parameters a flat parameter may set (on whichever sampler the spec has)
SAMPLING_PARAMS = ("temperature", "top_k", "top_p")
#: how drafts' probabilities are computed (:class:`~refusion.decoding.sampling.Greedy`): the sampler's when it
#: takes them, and every part's that declares them (selectors that compute their own scores)
DRAFT_PARAMS = ("precision", "argmax", "confidence_top_k", "confidence_top_p")
#: every flat parameter a spec takes whatever its parts: its options, the sampler's name and parameters
SPEC_PARAMS = (*DECODER_OPTIONS, "sampler", *SAMPLING_PARAMS, *DRAFT_PARAMS)
#: the generation length of a spec that names none
DEFAULT_GEN_LENGTH = 128
#: the JSON format's name and version
FORMAT = "refusion.decoder/1"
#: spec files larger than this are refused before they are parsed
MAX_SPEC_BYTES = 16 * 2**20
#: fields of the JSON format besides the parts
SPEC_FIELDS = ("format", "description", "gen_length", "peer", "sampler", *DECODER_OPTIONS)
#: part parameters that mean one thing to every part declaring them (the model's block, Fast-dLLM v2's sub-block,
#: d3LLM's block), so a flat one goes to each;
#: any other flat parameter declared by parts of two kinds must be named with its part (``"selector.x"``)
SHARED_PART_PARAMS = ("block_length", "small_block_size", "block_size")
#: fields the format had before the canvas-denoising options moved to the ``denoise`` infiller, with their defaults
#: (read back from earlier files: onto that infiller, or dropped where they hold the defaults)
MOVED_TO_DENOISE = {
    "max_denoising_steps": 48,
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
    "renoise": True,
}


def _frozen(params: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in dict(params or {}).items()}


def jsonable(value: Any, where: str) -> Any:
    """``value`` as JSON (tuples become lists), or a :class:`ConfigError` naming ``where``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v, where) for v in value]
    raise ConfigError(
        f"`{where}` = {value!r:.80} cannot be written to a decoder spec: it holds only JSON values "
        "(numbers, strings, booleans, None, lists).",
        param=where,
    )


@attrs.frozen
class PartSpec:
    """One part: its registered ``name`` (or a ``"module:Class"`` path) and its parameters.

    A part handed in as a class keeps it in ``cls`` (so a class defined in a
    function builds too); one handed in as an object keeps it in
    ``instance`` and builds as that very object until a parameter changes.
    A part whose parameters cannot be read back (not an attrs class) builds
    but cannot be written to JSON.
    """

    name: str
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    cls: Any = attrs.field(default=None, eq=False, repr=False)
    instance: Any = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def of(cls, kind: str, part: Any) -> PartSpec:
        """A spec for ``part``: a name or ``"module:Class"`` string, a class, or an instance."""
        from refusion.plugins.registry import part_interface

        if isinstance(part, PartSpec):
            return part
        if isinstance(part, str):
            return cls(part)
        interface = part_interface(kind)
        if isinstance(part, type) and issubclass(part, interface):
            return cls(_name_of(kind, part), cls=part)
        if isinstance(part, type) or not isinstance(part, interface):  # 42, a function, a class of another kind
            raise ConfigError(
                f"`{kind}` must be a registered name, a `module:Class` path, "
                f"{'an' if interface.__name__[0] in 'AEIOU' else 'a'} {interface.__name__} subclass or an instance "
                f"of one; got {shown(part)}.",
                param=kind,
            )
        part_type: Any = type(part)
        params = (
            {(f.alias or f.name): getattr(part, f.name) for f in attrs.fields(part_type) if f.init}
            if attrs.has(part_type)
            else {}
        )
        return cls(_name_of(kind, part_type), params, cls=part_type, instance=part)

    @property
    def readable(self) -> bool:
        """Whether the parameters describe the part fully (it can be written to JSON and rebuilt)."""
        return self.instance is None or attrs.has(type(self.instance))


def _name_of(kind: str, cls: type) -> str:
    """The registered name of ``cls`` for ``kind``, else its ``module:Class`` path."""
    from refusion.plugins.registry import registry

    name = cls.__dict__.get("name")
    reg = registry()
    if isinstance(name, str) and name in reg.names(kind) and reg.get(kind, name) is cls:
        return name
    return class_path(cls)


@attrs.frozen
class SamplerSpec:
    """The sampler: ``"greedy"`` or a name of :data:`refusion.decoding.sampling.SAMPLERS`, with its parameters."""

    name: str = "greedy"
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    instance: Any = attrs.field(default=None, eq=False, repr=False)

    def accepts(self) -> tuple[str, ...]:
        """The parameters this sampler takes."""
        from refusion.decoding.sampling import SAMPLERS, Greedy

        return tuple(attrs.fields_dict(Greedy if self.name == "greedy" else SAMPLERS[self.name]))

    def build(self) -> Any:
        from refusion.decoding.sampling import SAMPLERS, Greedy, greedy

        if self.instance is not None:
            return self.instance
        try:
            if self.name == "greedy":
                built = Greedy(**self.params)
                return greedy if built.fused else built
            return SAMPLERS[self.name](**self.params)
        except TypeError as exc:
            raise ConfigError(
                f"sampler {self.name!r} takes {', '.join(self.accepts())}; {exc}.", param="sampler"
            ) from None

    @classmethod
    def of(cls, sample: Any) -> SamplerSpec:
        from refusion.decoding.sampling import SAMPLERS, Greedy, greedy

        if sample is greedy:
            return cls()
        if type(sample) is Greedy:
            return cls() if sample.fused else cls("greedy", attrs.asdict(sample))
        for name, kind in SAMPLERS.items():
            if type(sample) is kind:
                return cls(name, attrs.asdict(cast(Any, sample)))
        return cls(class_path(type(sample)), instance=sample)


def sampler_name(value: Any) -> str:
    """``value`` if it names a sampler (``greedy`` or one of :data:`refusion.decoding.sampling.SAMPLERS`), else a
    :class:`ConfigError` listing them."""
    from refusion.decoding.sampling import SAMPLERS

    if value != "greedy" and value not in SAMPLERS:
        raise ConfigError(f"`sampler` must be one of greedy, {', '.join(SAMPLERS)}; got {value!r}.", param="sampler")
    return value


def _engine(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    from refusion.engines.factory import engine_class

    engine_class(value)  # a class or a live engine: refused here if it is not one
    return value


@attrs.frozen
class DecoderSpec:
    """A decoder, described: parts, sampler, options, and a preset's length, description and peer.

    Build it with :meth:`Decoder.from_spec <refusion.decoding.decoder.Decoder.from_spec>`;
    change it with :meth:`merged` (or :meth:`with_parts` / :meth:`with_params`);
    write and read it with :meth:`to_dict` / :meth:`from_dict` (:meth:`save` /
    :meth:`load` for files). Part parameters and options are checked when the
    decoder is built, with errors naming the parameter.
    """

    partitioner: PartSpec = attrs.field(factory=lambda: PartSpec("fixed"))
    selector: PartSpec = attrs.field(factory=lambda: PartSpec("threshold"))
    infiller: PartSpec = attrs.field(factory=lambda: PartSpec("parallel-ar"))
    reorderer: PartSpec = attrs.field(factory=lambda: PartSpec("commit-order"))
    reviser: PartSpec = attrs.field(factory=lambda: PartSpec("none"))
    sampler: SamplerSpec = attrs.field(factory=SamplerSpec)
    engine: Any = spec_option("engine", converter=_engine)
    seed: int = spec_option("seed")
    stop_at_eos: bool | str = spec_option("stop_at_eos")
    cfg_scale: float = spec_option("cfg_scale")
    calls_per_token: int = spec_option("calls_per_token")
    batch_invariant: bool = spec_option("batch_invariant")
    gen_length: int | None = None
    description: str = ""
    peer: str | None = None

    # -- construction ----------------------------------------------------------
    @classmethod
    def of_parts(
        cls,
        partitioner: Any = "fixed",
        selector: Any = "threshold",
        infiller: Any = "parallel-ar",
        reorderer: Any = "commit-order",
        reviser: Any = "none",
        **fields: Any,
    ) -> DecoderSpec:
        """A spec from part names, classes or instances (parameters then go through :meth:`with_params`)."""
        parts = dict(
            partitioner=partitioner, selector=selector, infiller=infiller, reorderer=reorderer, reviser=reviser
        )
        specs: dict[str, Any] = {kind: PartSpec.of(kind, part) for kind, part in parts.items()}
        return cls(**specs, **fields)

    @classmethod
    def of(cls, decoder: Any) -> DecoderSpec:
        """The spec of a live :class:`~refusion.decoding.decoder.Decoder` (its parts' fields are their parameters)."""
        parts: dict[str, Any] = {kind: PartSpec.of(kind, getattr(decoder, kind)) for kind in PART_KINDS}
        options = {name: getattr(decoder, name) for name in DECODER_OPTIONS}
        return cls(**parts, sampler=SamplerSpec.of(decoder.sample), **options)

    def parts(self) -> dict[str, PartSpec]:
        return {kind: getattr(self, kind) for kind in PART_KINDS}

    # -- the one merge rule -------------------------------------------------------
    def with_parts(self, **names: Any) -> DecoderSpec:
        """Replace parts (names, classes or instances; ``None`` keeps the spec's). A part whose name changes loses
        its parameters; the sampler and the decoder options stay."""
        changed: dict[str, Any] = {}
        for kind, part in names.items():
            if kind not in PART_KINDS:
                raise ConfigError(f"`{kind}` is not a part; parts are {', '.join(PART_KINDS)}.", param=kind)
            if part is None:
                continue
            new = PartSpec.of(kind, part)
            if new.name != getattr(self, kind).name or new.params or new.instance is not None:
                changed[kind] = new
        return attrs.evolve(self, **changed)

    def with_params(self, params: Mapping[str, Any]) -> DecoderSpec:
        """Set parameters: decoder options (``seed``, ``engine``, ...), ``gen_length``, the sampler (``sampler``,
        ``temperature``, ``top_k``, ``top_p``; a temperature on a greedy spec samples categorically), or part
        parameters: ``"kind.key"`` for one part, a bare ``key`` for every part that declares it. An unknown key
        is an error listing what the spec takes."""
        params = dict(params)
        fields: dict[str, Any] = {}
        sampler = self.sampler
        if "sampler" in params:
            name = sampler_name(params.pop("sampler"))
            if name != sampler.name:
                keep = SamplerSpec(name).accepts()
                sampler = SamplerSpec(name, {k: v for k, v in sampler.params.items() if k in keep})
        parts = {kind: dict(spec.params) for kind, spec in self.parts().items()}
        declared = {kind: part_parameters(kind, spec.name, spec.cls) for kind, spec in self.parts().items()}
        for key, value in params.items():
            if key in DECODER_OPTIONS or key in ("gen_length", "description", "peer"):
                fields[key] = value
            elif key in DRAFT_PARAMS:  # the sampler's if it takes it, and every part's that declares it
                owners = [kind for kind in PART_KINDS if key in declared[kind]]
                if key not in sampler.accepts() and not owners:
                    raise ConfigError(
                        f"`{key}` is taken by no part and not by sampler {sampler.name!r} (it takes "
                        f"{', '.join(sampler.accepts()) or 'nothing'}).",
                        param=key,
                    )
                if key in sampler.accepts():
                    sampler = attrs.evolve(sampler, params={**sampler.params, key: value})
                for kind in owners:
                    parts[kind][key] = value
            elif key in SAMPLING_PARAMS:
                if sampler.name == "greedy" and key == "temperature" and is_number(value) and 0 <= value < 1e-4:
                    continue  # temperature 0 is greedy: the spec's greedy sampler (and its arithmetic) stays
                if sampler.name == "greedy":
                    kept = {k: v for k, v in sampler.params.items() if k in SamplerSpec("categorical").accepts()}
                    sampler = SamplerSpec("categorical", kept)
                if key not in sampler.accepts():
                    raise ConfigError(
                        f"sampler {sampler.name!r} takes {', '.join(sampler.accepts())}; not `{key}`.", param=key
                    )
                sampler = attrs.evolve(sampler, params={**sampler.params, key: value})
            elif "." in key:
                kind, _, field = key.partition(".")
                if kind not in PART_KINDS:
                    raise ConfigError(f"`{key}`: unknown part {kind!r}; parts are {', '.join(PART_KINDS)}.", param=key)
                if field not in declared[kind]:
                    raise ConfigError(
                        f"`{key}`: {kind} {getattr(self, kind).name!r} has no parameter {field!r}; it "
                        f"accepts: {', '.join(sorted(declared[kind])) or 'none'}.",
                        param=key,
                    )
                parts[kind][field] = value
            else:
                owners = [kind for kind in PART_KINDS if key in declared[kind]]
                if len(owners) > 1 and key not in SHARED_PART_PARAMS:
                    named = " and ".join(f"{kind} {getattr(self, kind).name!r}" for kind in owners)
                    raise ConfigError(
                        f"`{key}` is a parameter of {named}, which read it differently: name the part it is for "
                        f"({' or '.join(f'`{kind}.{key}`' for kind in owners)}).",
                        param=key,
                    )
                if not owners:
                    listing = "; ".join(
                        f"{kind} {getattr(self, kind).name!r}: {', '.join(sorted(declared[kind])) or 'none'}"
                        for kind in PART_KINDS
                    )
                    raise ConfigError(
                        f"Unknown parameter `{key}`. Parameters by part: {listing}; and whatever the "
                        f"parts: {', '.join(SPEC_PARAMS)}.",
                        param=key,
                    )
                for kind in owners:  # a parameter several parts declare (e.g. `block_length`) means the same to each
                    parts[kind][key] = value
        for kind in PART_KINDS:
            spec = getattr(self, kind)
            if parts[kind] != dict(spec.params):
                if not spec.readable:
                    raise ConfigError(
                        f"`{kind}` was given as a ready-made object whose parameters cannot be read "
                        f"back; {sorted(set(parts[kind]) - set(spec.params))} cannot be set on it.",
                        param=kind,
                    )
                fields[kind] = attrs.evolve(spec, params=parts[kind], instance=None)
        return attrs.evolve(self, sampler=sampler, **fields)

    def merged(
        self, parts: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None, *, model: Any = None
    ) -> DecoderSpec:
        """The spec with ``parts`` replaced, then ``params`` set (see :meth:`with_parts`, :meth:`with_params`).

        When the spec reproduces a peer function (``peer``), the arguments of
        that function among ``params`` are translated first
        (:mod:`refusion.peers`; ``model`` is the model they are checked against).
        """
        params = dict(params or {})
        spec = self
        if self.peer is not None:
            from refusion.peers import peer_function

            function = peer_function(self.peer)
            call = function.translate({k: params.pop(k) for k in list(params) if k in function.arguments}, model)
            spec = spec.with_parts(**call.parts).with_params(call.params)
            if call.gen_length is not None:
                spec = attrs.evolve(spec, gen_length=call.gen_length)
        return spec.with_parts(**dict(parts or {})).with_params(params)

    # -- building ---------------------------------------------------------------
    def part_objects(self) -> dict[str, Any]:
        """The four parts, built (errors name the part and the parameter); what a decoder is made of."""
        return {
            kind: build_part(kind, spec.name, spec.params, spec.cls, spec.instance)
            for kind, spec in self.parts().items()
        }

    def options(self) -> dict[str, Any]:
        """The decoder options and the built sampler, as :class:`~refusion.decoding.decoder.Decoder` takes them."""
        return {"sample": self.sampler.build(), **{name: getattr(self, name) for name in DECODER_OPTIONS}}

    # -- JSON -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: ``{"format", "description", "gen_length", "peer", "partitioner": {"name", "params"}, ...,
        "sampler": {"name", "params"}, "engine", "seed", "stop_at_eos", "cfg_scale", "calls_per_token",
        "batch_invariant"}``."""
        out: dict[str, Any] = {
            "format": FORMAT,
            "description": self.description,
            "gen_length": self.gen_length,
            "peer": self.peer,
        }
        for kind, spec in self.parts().items():
            if not spec.readable:
                raise ConfigError(
                    f"`{kind}` {spec.instance!r:.80} cannot be written to a decoder spec: its "
                    "parameters cannot be read back (make it an attrs class).",
                    param=kind,
                )
            out[kind] = {"name": spec.name, "params": {k: jsonable(v, f"{kind}.{k}") for k, v in spec.params.items()}}
        if self.sampler.instance is not None:
            raise ConfigError(
                f"`sampler` {self.sampler.instance!r:.80} cannot be written to a decoder spec: only "
                "greedy and the registered samplers can.",
                param="sampler",
            )
        out["sampler"] = {
            "name": self.sampler.name,
            "params": {k: jsonable(v, f"sampler.{k}") for k, v in self.sampler.params.items()},
        }
        engine = self.engine
        if engine is not None and not isinstance(engine, str):
            engine = getattr(engine, "name", None) or class_path(engine)
        out.update(engine=engine, **{name: getattr(self, name) for name in DECODER_OPTIONS if name != "engine"})
        return out

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "decoder spec") -> DecoderSpec:
        """The spec :meth:`to_dict` wrote (errors name ``where`` and the field).

        Also reads the earlier formats: a preset file (``gen_length``,
        ``description``, flat ``params``, part names) and a record's decoder
        (parts as ``{"name", "class", "params"}``, ``sample``).
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a JSON object; got {type(data).__name__}.", param=where)
        data = dict(data)
        if "format" not in data and (
            "sample" in data
            or "params" in data
            or not any(isinstance(data.get(kind), Mapping) for kind in (*PART_KINDS, "sampler"))
        ):
            return cls._from_earlier(data, where)
        data.setdefault("format", FORMAT)  # a spec written by hand may leave it out
        moved = {name: data.pop(name) for name in MOVED_TO_DENOISE if name in data}
        if data["format"] != FORMAT:
            raise ConfigError(f"{where}: field `format` must be {FORMAT!r}; got {data['format']!r}.", param="format")
        unknown = sorted(set(data) - set(SPEC_FIELDS) - set(PART_KINDS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown field(s) {', '.join(unknown)}; fields are {', '.join((*SPEC_FIELDS, *PART_KINDS))}.",
                param=unknown[0],
            )
        fields: dict[str, Any] = {}
        for kind in (*PART_KINDS, "sampler"):
            if kind not in data:
                continue
            part = data[kind]
            if (
                not isinstance(part, Mapping)
                or not isinstance(part.get("name"), str)
                or not isinstance(part.get("params", {}), Mapping)
                or set(part) - {"name", "params"}
            ):
                raise ConfigError(
                    f"{where}: field `{kind}` must be an object with a `name` (string) and `params` "
                    f"(an object); got {part!r:.80}.",
                    param=kind,
                )
            fields[kind] = (SamplerSpec if kind == "sampler" else PartSpec)(part["name"], part.get("params", {}))
        if "sampler" in fields:
            sampler_name(fields["sampler"].name)
            _check_sampler_params(fields["sampler"], where)
        for kind in PART_KINDS:
            if kind in fields:
                _check_part_params(kind, fields[kind], where)
        for name in ("description", "gen_length", "peer", *DECODER_OPTIONS):
            if name in data:
                fields[name] = data[name]
        return _checked_fields(_moved_to_denoise(cls(**fields), moved, where), where)

    @classmethod
    def _from_earlier(cls, data: dict[str, Any], where: str) -> DecoderSpec:
        if "sample" in data:  # a record's decoder, before the one format
            sample = data.pop("sample")
            parts: dict[str, Any] = {}
            for kind in PART_KINDS:
                part = data.pop(kind, None)
                if not isinstance(part, Mapping) or not isinstance(part.get("name"), str):
                    raise ConfigError(
                        f"{where}: field `{kind}` must be an object with a `name`; got {part!r:.80}.", param=kind
                    )
                params = part.get("params", {})
                if not isinstance(params, Mapping):
                    raise ConfigError(
                        f"{where}: field `{kind}.params` must be an object; got {params!r:.80}.", param=f"{kind}.params"
                    )
                parts[kind] = _check_part_params(
                    kind,
                    PartSpec(
                        part["name"]
                        if _registered(kind, part["name"], part.get("class"))
                        else part.get("class", part["name"]),
                        params,
                    ),
                    where,
                )
            if sample == "greedy":
                sampler = SamplerSpec()
            elif isinstance(sample, Mapping):
                sample = dict(sample)
                sampler = SamplerSpec(sampler_name(sample.pop("sampler", "categorical")), sample)
            else:
                raise ConfigError(
                    f"{where}: field `sample` must be 'greedy' or an object; got {sample!r:.80}.", param="sample"
                )
            _check_sampler_params(sampler, where)
            moved = {name: data.pop(name) for name in MOVED_TO_DENOISE if name in data}
            known = set(DECODER_OPTIONS)
            unknown = sorted(set(data) - known)
            if unknown:
                raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}.", param=unknown[0])
            return _checked_fields(_moved_to_denoise(cls(**parts, sampler=sampler, **data), moved, where), where)
        allowed = {"description", "gen_length", "params", "peer", *PART_KINDS}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ConfigError(
                f"{where}: unknown field(s) {', '.join(unknown)}; fields are {', '.join(sorted(allowed))}.",
                param=unknown[0],
            )
        for kind in PART_KINDS:
            if kind in data and not isinstance(data[kind], str):
                raise ConfigError(f"{where}: field `{kind}` must be a part name; got {data[kind]!r:.80}.", param=kind)
        if "gen_length" not in data:
            raise ConfigError(
                f"{where}: field `gen_length` is missing (the preset's generation length).", param="gen_length"
            )
        params = data.get("params", {})
        if not isinstance(params, Mapping):
            raise ConfigError(
                f"{where}: field `params` must be an object of name: value; got {params!r:.80}.", param="params"
            )
        spec = cls.of_parts(**{k: data[k] for k in PART_KINDS if k in data})
        spec = attrs.evolve(
            spec, description=data.get("description", ""), gen_length=data.get("gen_length"), peer=data.get("peer")
        )
        return _checked_fields(spec.with_params(params), where)

    def save(self, path: Any) -> None:
        """Write :meth:`to_dict` to ``path`` as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Any) -> DecoderSpec:
        """Read a spec file (``refusion.json``, ``--preset-file``, a sweep's ``preset.json``); errors name the file."""
        from refusion.files import read_json
        from refusion.files import where as named

        data = read_json(path, what="`preset file`", param="preset_file", max_bytes=MAX_SPEC_BYTES)
        return cls.from_dict(data, where=named("`preset file`", path))


def _check_part_params(kind: str, part: PartSpec, where: str) -> PartSpec:
    """Refuse a registered part's name that is unknown, or parameters it does not declare, naming the field
    (``selector.params.slot_treshold``) and listing what it takes. ``"module:Class"`` paths are not imported here:
    their parameters are checked when the decoder is built."""
    import inspect

    from refusion.plugins.registry import registry

    if ":" in part.name:
        return part
    reg = registry()
    if part.name not in reg.names(kind):
        raise UnknownNameError(
            f"{where}: field `{kind}.name`: unknown {kind} {part.name!r}; known {kind}s: "
            f"{', '.join(sorted(reg.names(kind)))}.",
            param=kind,
        )
    cls = reg.get(kind, part.name)
    if not attrs.has(cls):
        try:
            if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls).parameters.values()):
                return part  # takes any keyword
        except (TypeError, ValueError):
            return part
    accepted = part_parameters(kind, part.name, cls)
    unknown = sorted(set(part.params) - set(accepted))
    if unknown:
        field = f"{kind}.params.{unknown[0]}"
        raise ConfigError(
            f"{where}: field `{field}`: {kind} {part.name!r} has no parameter {unknown[0]!r}; it "
            f"accepts: {', '.join(sorted(accepted)) or 'none'}.",
            param=field,
        )
    return part


def _moved_to_denoise(spec: DecoderSpec, moved: Mapping[str, Any], where: str) -> DecoderSpec:
    """A spec written before the canvas-denoising options moved from the decoder to the ``denoise`` infiller: the
    values go onto that infiller (an earlier ``draft`` infiller with any of them changed from its default was the
    diffusion-gemma preset's, so it becomes ``denoise``); left at their defaults they changed nothing elsewhere
    and are dropped; changed on a spec with another infiller they are refused, naming the field."""
    if not moved:
        return spec
    if spec.infiller.name == "denoise":
        return attrs.evolve(spec, infiller=PartSpec("denoise", {**moved, **spec.infiller.params}))
    changed = [name for name, value in moved.items() if value != MOVED_TO_DENOISE[name]]
    if not changed:
        return spec
    if spec.infiller.name == "draft" and not spec.infiller.params:
        return attrs.evolve(spec, infiller=PartSpec("denoise", moved))
    raise ConfigError(
        f"{where}: field `{changed[0]}` is no longer a decoder field: it is a parameter of the `denoise` infiller "
        f"(canvas-denoising models; see docs/migration.md), and this spec's infiller is {spec.infiller.name!r}.",
        param=changed[0],
    )


def _check_sampler_params(sampler: SamplerSpec, where: str) -> None:
    unknown = sorted(set(sampler.params) - set(sampler.accepts()))
    if unknown:
        field = f"sampler.params.{unknown[0]}"
        raise ConfigError(
            f"{where}: field `{field}`: sampler {sampler.name!r} takes "
            f"{', '.join(sampler.accepts()) or 'no parameters'}; it has no parameter {unknown[0]!r}.",
            param=field,
        )


def _registered(kind: str, name: str, path: Any) -> bool:
    """True when ``name`` is registered for ``kind`` (and, if ``path`` is given, as that class)."""
    from refusion.plugins.registry import registry

    reg = registry()
    if name not in reg.names(kind):
        return False
    return path is None or class_path(reg.get(kind, name)) == path


def _checked_fields(spec: DecoderSpec, where: str) -> DecoderSpec:
    """Refuse field values of the wrong type (the decoder checks ranges when it is built)."""
    checks: tuple[tuple[str, type | tuple[type, ...]], ...] = (
        ("gen_length", (int, type(None))),
        ("description", str),
        ("peer", (str, type(None))),
        *((o.name, o.types) for o in BY_NAME.values()),
    )
    for name, kinds in checks:
        value = getattr(spec, name)
        allowed = kinds if isinstance(kinds, tuple) else (kinds,)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ConfigError(f"{where}: field `{name}` has the wrong type: {value!r:.80}.", param=name)
    if spec.gen_length is not None and not 1 <= spec.gen_length <= MAX_GEN_LENGTH:
        raise ConfigError(
            f"{where}: field `gen_length` must be an integer in [1, {MAX_GEN_LENGTH}]; got {shown(spec.gen_length)}.",
            param="gen_length",
        )
    return spec
