"""Model families: published diffusion-LM checkpoints run by transformers' maintained classes.

A :class:`ModelFamily` recognises a checkpoint from its ``config.json``
(``model_type``, ``architectures`` or the module names in ``auto_map``),
translates that config into the configuration of a maintained transformers
class (LLaMA, Qwen2, Qwen3, ...), says how the published parameter names map
onto that class's, and wraps the loaded network in the
:class:`~refusion.models.base.ModelAdapter` the family needs (mask and EOS
ids, logit shift, block length). Weights are read from the checkpoint's
safetensors (one file or a sharded index) by transformers'
``from_pretrained``, so ``dtype``, ``device_map``, attention implementations
and quantization work as for any transformers model. No code from the
checkpoint folder is ever imported.

Families register through the ``register_model_families`` hook; a plugin adds
one by subclassing :class:`ModelFamily` (see ``docs/models.md``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from refusion.errors import ConfigError
from refusion.models.base import ModelAdapter
from refusion.models.files import load_tokenizer, quietly

#: config.json keys that describe the file, not the network
META_KEYS = ("architectures", "auto_map", "model_type", "transformers_version", "_name_or_path")


class ModelFamily(ABC):
    """How to load one family of published checkpoints without their remote code.

    Subclasses set the class attributes that recognise the family and
    implement :meth:`stock_config`, :meth:`model_class` and :meth:`adapter`;
    :meth:`load` does the rest. A family must not import or execute anything
    from the checkpoint folder, and must refuse (with :class:`ConfigError`
    naming the config field) a config whose architecture the maintained class
    cannot reproduce exactly.
    """

    #: registry name, e.g. ``"llada"``
    name: ClassVar[str]
    #: one line for ``refusion plugins`` and error messages
    description: ClassVar[str] = ""
    #: published checkpoints this family loads (documentation)
    checkpoints: ClassVar[tuple[str, ...]] = ()
    #: ``config.json`` ``model_type`` values of the family
    model_types: ClassVar[tuple[str, ...]] = ()
    #: ``config.json`` ``architectures`` entries of the family
    architectures: ClassVar[tuple[str, ...]] = ()
    #: module names of the family's published remote code, as ``auto_map`` names them (``"modeling_llada"``)
    remote_modules: ClassVar[tuple[str, ...]] = ()
    #: chat end-of-turn tokens that also end an answer when the tokenizer has them
    end_of_turn: ClassVar[tuple[str, ...]] = ()
    #: keyword options of :meth:`adapter` besides the model and tokenizer (e.g. ``block_length``)
    adapter_options: ClassVar[tuple[str, ...]] = ("mask_token_id", "eos_token_id")
    #: the preset that decodes as the family's authors do (:data:`refusion.config.PRESETS`), used when a caller
    #: names none and the checkpoint has no ``refusion.json``
    default_preset: ClassVar[str | None] = None
    #: transformers tokenizer class to read the vocabulary files with when the published tokenizer class is
    #: custom code and there is no ``tokenizer.json`` (Dream's ``DreamTokenizer`` is a ``Qwen2Tokenizer``)
    tokenizer_class: ClassVar[str | None] = None

    def matches(self, config: Mapping[str, Any]) -> bool:
        """True when ``config`` (the parsed ``config.json``) is a checkpoint of this family."""
        if config.get("model_type") in self.model_types:
            return True
        if any(arch in self.architectures for arch in config.get("architectures") or ()):
            return True
        return any(target.split(".")[0] in self.remote_modules for target in auto_map_targets(config))

    @abstractmethod
    def stock_config(self, config: Mapping[str, Any]) -> Any:
        """The maintained class's ``PretrainedConfig`` for ``config``; refuse fields it cannot reproduce."""

    @abstractmethod
    def model_class(self) -> type:
        """The maintained transformers class (e.g. ``LlamaForCausalLM``) the weights are loaded into."""

    def numerics(self, model: Any, config: Mapping[str, Any]) -> None:
        """Install on the built ``model`` what the family's own code computes differently from the stock class
        in half precision (:mod:`refusion.models.families.numerics`); the default changes nothing.

        Must leave float32 results as they are (up to the last bit) and
        change the network's modules only, never its class.
        """
        return None

    def key_mapping(self, config: Mapping[str, Any]) -> dict[str, str] | None:
        """Published parameter-name patterns -> the maintained class's names (``None``: names already match)."""
        return None

    @abstractmethod
    def adapter(self, model: Any, tokenizer: Any, config: Mapping[str, Any], **options: Any) -> ModelAdapter:
        """Wrap the loaded network; ``options`` are the caller's :attr:`adapter_options`."""

    def check(self, path: str, config: Mapping[str, Any]) -> None:
        """Refuse, before any weight is read, a ``config`` whose fields the maintained class would fail on deep
        inside or build into nonsense (a :class:`ConfigError` naming the file and the field:
        :func:`field_error`); the default checks nothing beyond :func:`~refusion.models.checks.check_config`."""
        return None

    def preset_name(self, config: Mapping[str, Any]) -> str | None:
        """The preset a checkpoint with ``config`` decodes with when none is named: :attr:`default_preset`,
        unless the family tells its versions apart."""
        return self.default_preset

    def preset_params(self, path: str) -> dict[str, Any]:
        """Parameters of :attr:`default_preset` that the checkpoint at ``path`` sets itself (e.g. its
        ``generation_config.json``), applied when a caller names no preset; the default: none."""
        return {}

    # -- loading -----------------------------------------------------------------
    def load(
        self,
        path: str,
        config: Mapping[str, Any],
        *,
        tokenizer: Any = None,
        dtype: Any = "auto",
        device: str | None = None,
        attn_implementation: str = "sdpa",
        **kwargs: Any,
    ) -> ModelAdapter:
        """Load the checkpoint at ``path`` (whose parsed ``config.json`` is ``config``).

        ``kwargs`` may hold :attr:`adapter_options` and keywords of
        transformers' ``from_pretrained`` (``device_map``, ``quantization_config``, ...).
        """
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in self.adapter_options}
        if "trust_remote_code" in kwargs:
            raise ConfigError(
                "`trust_remote_code` is not used for a supported model family: refusion runs its "
                f"{self.name!r} checkpoints with transformers' own classes, never the checkpoint's code.",
                param="trust_remote_code",
            )
        self.check(path, config)
        stock = self.stock_config(config)
        model = from_pretrained(
            self.model_class(),
            path,
            stock,
            self.key_mapping(config),
            dtype=dtype,
            attn_implementation=attn_implementation,
            **kwargs,
        )
        self.numerics(model, config)
        if device is not None:
            model = model.to(device)
        if tokenizer is None:
            tokenizer = self.tokenizer(path)
        adapter = self.adapter(model, tokenizer, config, **options)
        adapter.family = self.name
        return adapter

    def tokenizer(self, path: str) -> Any:
        """The checkpoint's tokenizer without its code; ``None`` (with a warning) when it cannot be read so."""
        from refusion.errors import warn_caller

        try:
            return load_tokenizer(path, fallback=self.tokenizer_class)
        except (OSError, ValueError) as exc:
            warn_caller(
                f"`model` {path!r}: its tokenizer could not be loaded without running its code ({exc}); "
                "prompts must be token ids, or pass `tokenizer=`."
            )
            return None

    def eos_ids(self, model: Any, tokenizer: Any, given: Any = None) -> Any:
        """EOS ids: ``given`` if set, else the checkpoint's (generation config, config, tokenizer) plus
        :attr:`end_of_turn`."""
        from refusion.models.hf import find_eos_token_ids

        if given is not None:
            return given
        ids = set(find_eos_token_ids(model, tokenizer))
        vocab = tokenizer.get_vocab() if tokenizer is not None and hasattr(tokenizer, "get_vocab") else {}
        ids.update(vocab[t] for t in self.end_of_turn if t in vocab)
        return sorted(ids) or None


class MaskedDiffusionFamily(ModelFamily):
    """A family of bidirectional masked diffusion LMs, run by the ``hf-mdm`` adapter with the family's
    ``logit_shift``."""

    #: 0 when the logits at a mask predict that position (LLaDA), 1 when they predict the next one (Dream)
    logit_shift: ClassVar[int] = 0

    def adapter(  # type: ignore[override]  # the keywords are the family's adapter_options
        self,
        model: Any,
        tokenizer: Any,
        config: Mapping[str, Any],
        *,
        mask_token_id: Any = None,
        eos_token_id: Any = None,
    ) -> ModelAdapter:
        from refusion.models.mdm import HFMaskedDiffusionLM

        return HFMaskedDiffusionLM(
            model,
            tokenizer,
            logit_shift=self.logit_shift,
            mask_token_id=mask_token_id,
            eos_token_id=self.eos_ids(model, tokenizer, eos_token_id),
        )


def auto_map_targets(config: Mapping[str, Any]) -> list[str]:
    """The ``module.Class`` strings of a config's ``auto_map`` (values may be strings or lists)."""
    targets: list[str] = []
    for value in (config.get("auto_map") or {}).values():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str):
                targets.append(item.split("--")[-1])  # "org/repo--module.Class" names code in another repo
    return targets


def plain_fields(config: Mapping[str, Any], drop: Iterable[str] = ()) -> dict[str, Any]:
    """``config`` without the file-description keys (and ``drop``), to build a maintained class's config from.

    A transformers-4 ``rope_theta``/``rope_scaling`` pair becomes transformers 5's ``rope_parameters``.
    """
    skip = set(META_KEYS) | set(drop)
    fields = {k: v for k, v in config.items() if k not in skip}
    if "rope_scaling" in fields:
        scaling = dict(fields.pop("rope_scaling") or {})
        kind = scaling.pop("rope_type", scaling.pop("type", "default"))
        fields.setdefault(
            "rope_parameters", {"rope_type": kind, **scaling, "rope_theta": fields.pop("rope_theta", 10000.0)}
        )
    return fields


#: a Qwen config's sliding-window fields: families whose authors' attention never slides (it spans a canvas or takes an
#: explicit block mask) drop them
SLIDING_WINDOW_FIELDS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")


def without_sliding_window(config_class: Any, config: Mapping[str, Any], drop: Iterable[str] = ()) -> Any:
    """``config_class`` (a transformers Qwen config) built from ``config`` without ``drop`` and with no sliding
    window, whatever ``config`` says (Dream, SDAR, Fast-dLLM v2: their attention never slides)."""
    fields = plain_fields(config, drop=(*drop, *SLIDING_WINDOW_FIELDS))
    return config_class(**fields, use_sliding_window=False)


def field_error(path: str, field: str, value: Any, allowed: str, file: str = "config.json") -> ConfigError:
    r"""The error for a checkpoint file's field: ``\`model\` 'path': config.json field \`n_group\` must be ...;
    got ...`` (``param`` is ``model``)."""
    from refusion.validators import shown

    return ConfigError(
        f"`model` {path!r}: {file} field `{field}` must be {allowed}; got {shown(value, 60)}.", param="model"
    )


def int_field(
    path: str, section: Mapping[str, Any], field: str, default: Any, low: int, high: int, prefix: str = ""
) -> int:
    """``section[field]`` (``default`` when absent or null), refused with :func:`field_error` unless an integer in
    ``[low, high]``; ``prefix`` names the section (``"text_config."``)."""
    from refusion.validators import is_integer

    value = section.get(field)
    value = default if value is None else value
    if not is_integer(value) or not low <= value <= high:
        raise field_error(path, f"{prefix}{field}", value, f"an integer in [{low}, {high}]")
    return value


def refuse_fields(family: str, config: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first field of ``config`` whose value is not the one ``expected`` allows.

    ``expected`` maps a field to the allowed value, or to a tuple of allowed values.
    """
    for field, allowed in expected.items():
        if field not in config:
            continue
        choices = allowed if isinstance(allowed, tuple) else (allowed,)
        if config[field] not in choices:
            raise ConfigError(
                f"This {family} checkpoint sets `{field}` = {config[field]!r}; refusion runs {family} checkpoints with "
                f"{', '.join(map(repr, choices))} only (the published models). Load it with its own code instead: "
                f"`adapter=...` and `trust_remote_code=True`."
            )


def from_pretrained(cls: Any, path: str, config: Any, key_mapping: dict[str, str] | None, **kwargs: Any) -> Any:
    """``cls.from_pretrained`` with ``config`` given (so no remote code is looked at), quietly, checking the weights.

    Every parameter of the network must come from the checkpoint and every
    tensor of the checkpoint must be used; otherwise the error names them.
    """
    model, info = quietly(
        cls.from_pretrained,
        path,
        config=config,
        key_mapping=key_mapping,
        trust_remote_code=False,
        use_kernels=False,  # transformers would fetch and run hub kernels (kernels-community/*) on a GPU
        output_loading_info=True,
        **kwargs,
    )
    problems = {k: sorted(info.get(k) or ()) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        listing = "; ".join(
            f"{k.replace('_', ' ')}: {', '.join(map(str, v[:6]))}{' ...' if len(v) > 6 else ''}"
            for k, v in problems.items()
        )
        raise ConfigError(
            f"`model` {path!r}: the weights do not fit a {cls.__name__} built from its config.json "
            f"({listing}). Is the checkpoint complete and of the family its config names?",
            param="model",
        )
    return model.eval()
