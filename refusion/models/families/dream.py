"""Dream (Ye et al., arXiv 2508.15487): a bidirectional Qwen2 whose logits at position ``p - 1`` predict ``p``.

Published as ``DreamModel`` (``model_type`` ``Dream``, ``auto_map`` for
``AutoModel`` only): Dream-org/Dream-v0-Base-7B and Dream-v0-Instruct-7B.
Its parameters carry Qwen2's names and its network is Qwen2's with attention
over the whole sequence, so it runs as transformers' ``Qwen2ForCausalLM``
with ``is_causal=False``. That class computes its rotary table at
construction, where transformers 5 leaves the remote class's buffer
uninitialised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.models.families.base import MaskedDiffusionFamily, without_sliding_window
from refusion.plugins import hookimpl


class Dream(MaskedDiffusionFamily):
    """Dream checkpoints as a bidirectional ``Qwen2ForCausalLM`` (logit shift 1)."""

    name = "dream"
    default_preset = "dream"
    description = "Dream (bidirectional Qwen2, logits shifted by one) as transformers' Qwen2ForCausalLM"
    checkpoints = ("Dream-org/Dream-v0-Base-7B", "Dream-org/Dream-v0-Instruct-7B")
    model_types = ("Dream",)
    architectures = ("DreamModel",)
    remote_modules = ("modeling_dream", "configuration_dream")
    end_of_turn = ("<|im_end|>",)
    tokenizer_class = "Qwen2Tokenizer"
    logit_shift = 1

    def stock_config(self, config: Mapping[str, Any]) -> Any:
        from transformers import Qwen2Config

        # Dream's attention always spans the whole canvas: no sliding window, whatever the config says
        stock = without_sliding_window(Qwen2Config, config)
        stock.is_causal = False
        return stock

    def model_class(self) -> type:
        from transformers import Qwen2ForCausalLM

        return Qwen2ForCausalLM


@hookimpl
def register_model_families(register):
    register(Dream)
