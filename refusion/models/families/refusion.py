"""ReFusion (arXiv 2512.13586): a causal Qwen3 with a mask token, trained for plan-and-infill decoding.

Published as GSAI-ML/ReFusion: a Qwen3 checkpoint (``model_type`` ``qwen3``)
whose config names a ``mask_token_id``; its repository's ``Qwen3ForCausalLM``
(``modeling_qwen3_refusion``) only adds cache methods for its reference
decoder, so the network runs as transformers' own ``Qwen3ForCausalLM``. A
config whose ``auto_map`` names ReFusion's remote class loads the same way.
The model shipped with refusion is of this family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.models.families.base import ModelFamily, plain_fields
from refusion.plugins import hookimpl


class ReFusion(ModelFamily):
    """ReFusion checkpoints (a Qwen3 with a mask token) as transformers' ``Qwen3ForCausalLM``."""

    name = "refusion"
    default_preset = "paper"
    description = "ReFusion (causal Qwen3 with a mask token) as transformers' Qwen3ForCausalLM"
    checkpoints = ("GSAI-ML/ReFusion", "the model shipped with refusion")
    remote_modules = ("modeling_qwen3_refusion",)
    end_of_turn = ("<|im_end|>",)
    tokenizer_class = "Qwen2Tokenizer"

    def matches(self, config: Mapping[str, Any]) -> bool:
        if super().matches(config):  # auto_map names ReFusion's class
            return True
        return config.get("model_type") == "qwen3" and config.get("mask_token_id") is not None

    def stock_config(self, config: Mapping[str, Any]) -> Any:
        from transformers import Qwen3Config

        return Qwen3Config(**plain_fields(config))

    def model_class(self) -> type:
        from transformers import Qwen3ForCausalLM

        return Qwen3ForCausalLM

    def adapter(  # type: ignore[override]  # the keywords are the family's adapter_options
        self,
        model: Any,
        tokenizer: Any,
        config: Mapping[str, Any],
        *,
        mask_token_id: Any = None,
        eos_token_id: Any = None,
    ):
        from refusion.models.hf import HFCausalLM

        return HFCausalLM(
            model, tokenizer, mask_token_id=mask_token_id, eos_token_id=self.eos_ids(model, tokenizer, eos_token_id)
        )


@hookimpl
def register_model_families(register):
    register(ReFusion)
