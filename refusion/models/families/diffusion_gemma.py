"""DiffusionGemma (google/diffusiongemma-26B-A4B): transformers' own ``DiffusionGemmaForBlockDiffusion``.

The one diffusion LM with a maintained transformers class: a causal Gemma 4
encoder writes the context, a denoiser sharing its weights re-decides a
canvas of ``canvas_length`` tokens per pass from uniform noise
(:mod:`refusion.models.denoiser`). The checkpoint's parameter names are the
class's, so nothing is renamed; text-only use never runs the vision tower.
Decoded by the ``diffusion-gemma`` preset, whose defaults are the
checkpoint's ``generation_config.json`` where it sets them (as transformers'
``generate`` reads them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.limits import MAX_GEN_LENGTH
from refusion.models.base import ModelAdapter
from refusion.models.families.base import ModelFamily, field_error, int_field, plain_fields
from refusion.plugins import hookimpl

#: generation_config.json keys -> the diffusion-gemma preset's parameters
GENERATION_KEYS = {
    "max_denoising_steps": "max_denoising_steps",
    "t_min": "t_min",
    "t_max": "t_max",
    "stability_threshold": "stability_threshold",
    "confidence_threshold": "confidence_threshold",
}


class DiffusionGemma(ModelFamily):
    """DiffusionGemma checkpoints on transformers' ``DiffusionGemmaForBlockDiffusion``."""

    name = "diffusion-gemma"
    default_preset = "diffusion-gemma"
    description = "DiffusionGemma (encoder + canvas denoiser, uniform-noise canvases) on transformers' own class"
    checkpoints = ("google/diffusiongemma-26B-A4B", "google/diffusiongemma-26B-A4B-it")
    model_types = ("diffusion_gemma",)
    architectures = ("DiffusionGemmaForBlockDiffusion",)
    #: none added: the answer ends at the EOS ids of the checkpoint's generation config, as transformers' generate
    end_of_turn = ()
    adapter_options = ("eos_token_id",)

    def check(self, path: str, config: Mapping[str, Any]) -> None:
        """``canvas_length`` (the positions decoded per pass, from the model's: within them and within
        :data:`~refusion.limits.MAX_GEN_LENGTH`), the experts of the MoE block (``top_k_experts`` of
        ``num_experts``) and a ``sliding_window`` of at least one position, refused naming the field."""
        text = config.get("text_config")
        if text is None:
            text = {}
        if not isinstance(text, Mapping):
            raise field_error(path, "text_config", text, "an object (the text model's configuration)")
        positions = int_field(path, text, "max_position_embeddings", MAX_GEN_LENGTH, 1, 2**26, "text_config.")
        int_field(path, config, "canvas_length", 256, 1, min(positions, MAX_GEN_LENGTH))
        int_field(path, text, "sliding_window", 512, 1, 2**26, "text_config.")
        if text.get("enable_moe_block"):
            experts = int_field(path, text, "num_experts", None, 1, 2**16, "text_config.")
            int_field(path, text, "top_k_experts", None, 1, experts, "text_config.")
            int_field(path, text, "moe_intermediate_size", None, 1, 2**20, "text_config.")
        self.preset_params(path)  # the generation defaults it decodes with, before any weight is read

    def stock_config(self, config: Mapping[str, Any]) -> Any:
        from transformers import DiffusionGemmaConfig

        return DiffusionGemmaConfig(**plain_fields(config))

    def model_class(self) -> type:
        from transformers import DiffusionGemmaForBlockDiffusion

        return DiffusionGemmaForBlockDiffusion

    def adapter(  # type: ignore[override]  # the keywords are the family's adapter_options
        self, model: Any, tokenizer: Any, config: Mapping[str, Any], *, eos_token_id: Any = None
    ) -> ModelAdapter:
        from refusion.models.denoiser import CanvasDenoiserLM

        return CanvasDenoiserLM(model, tokenizer, eos_token_id=self.eos_ids(model, tokenizer, eos_token_id))

    def preset_params(self, path: str) -> dict[str, Any]:
        """The checkpoint's own defaults for the preset: ``generation_config.json``'s denoising settings,
        ``sampler_config.entropy_bound`` and ``max_new_tokens`` (as ``gen_length``), each checked as the
        decoder checks it (a ConfigError naming the file and the field: a checkpoint may not set a loop count
        past :mod:`refusion.limits` either)."""
        import attrs

        from refusion.errors import ConfigError
        from refusion.models.loading import read_generation_config
        from refusion.strategies.infillers.denoise import Denoise
        from refusion.validators import check_integer, check_number

        data = read_generation_config(path) or {}

        def checked(value: Any, check: Any) -> Any:
            try:
                check(value)
            except ConfigError as exc:  # its message names the field
                raise ConfigError(f"`model` {path!r}: generation_config.json field {exc}", param="model") from None
            return value

        fields = attrs.fields_dict(Denoise)  # the options' owner checks them

        def option(name: str) -> Any:
            check: Any = fields[name].validator
            return lambda value: check(None, fields[name], value)

        params = {
            ours: checked(data[theirs], option(ours))
            for theirs, ours in GENERATION_KEYS.items()
            if data.get(theirs) is not None
        }
        sampler = data.get("sampler_config")
        if sampler is not None and not isinstance(sampler, Mapping):
            raise field_error(path, "sampler_config", sampler, "an object", "generation_config.json")
        bound = (sampler or {}).get("entropy_bound")
        if bound is not None:
            field = "sampler_config.entropy_bound"
            params["entropy_bound"] = checked(bound, lambda v: check_number(field, v, 0, low_open=True))
        if data.get("max_new_tokens") is not None:
            length = data["max_new_tokens"]
            params["gen_length"] = checked(length, lambda v: check_integer("max_new_tokens", v, 1, MAX_GEN_LENGTH))
        return params


@hookimpl
def register_model_families(register):
    register(DiffusionGemma)
