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

import json
import os
from collections.abc import Mapping
from typing import Any

from refusion.models.base import ModelAdapter
from refusion.models.families.base import ModelFamily, plain_fields
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
        ``sampler_config.entropy_bound`` and ``max_new_tokens`` (as ``gen_length``)."""
        file = os.path.join(path, "generation_config.json")
        if not os.path.isfile(file):
            return {}
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
        params = {ours: data[theirs] for theirs, ours in GENERATION_KEYS.items() if data.get(theirs) is not None}
        bound = (data.get("sampler_config") or {}).get("entropy_bound")
        if bound is not None:
            params["entropy_bound"] = bound
        if data.get("max_new_tokens") is not None:
            params["gen_length"] = data["max_new_tokens"]
        return params


@hookimpl
def register_model_families(register):
    register(DiffusionGemma)
