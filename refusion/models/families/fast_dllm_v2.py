"""Fast-dLLM v2 (NVlabs, block diffusion adapted from Qwen2.5): a Qwen2 with block-causal attention and a token shift.

Published as ``Fast_dLLM_QwenForCausalLM`` (``model_type`` ``Fast_dLLM_Qwen``, remote code ``modeling.py``):
Efficient-Large-Model/Fast_dLLM_v2_7B (and the 1.5B). Its parameters carry Qwen2's names and, at inference, its
network is Qwen2's: attention is bidirectional inside a block of ``bd_size`` tokens (32) and causal across blocks,
blocks counted from position 0 (its ``eval_block_diff_mask``), and the logits at position ``i`` predict position
``i + 1`` (the "token shift": the first position of a block is predicted from the last position of the block before,
which is how the authors' ``generate`` picks it, by argmax, once that block is finished). It runs as transformers'
``Qwen2ForCausalLM`` given the block-causal mask by the ``hf-block`` adapter with ``layout="absolute"`` and
``logit_shift=1``. The mask token is ``|<MASK>|`` (an additional special token of its tokenizer, id 151665 in the
published vocabulary) unless the caller names one; its answers end at ``<|im_end|>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.models.families.base import ModelFamily, without_sliding_window
from refusion.plugins import hookimpl

#: Fast-dLLM v2's block when its config does not say (``bd_size`` of every published checkpoint)
DEFAULT_BLOCK_LENGTH = 32
#: the mask token of the published tokenizer (an additional special token: the tokenizer's ``mask_token`` is unset)
MASK_TOKEN = "|<MASK>|"
#: config fields for the authors' training only (``conplemenrary_mask`` is spelled so in the published config)
TRAINING_FIELDS = ("bd_size", "conplemenrary_mask", "complementary_mask")


class FastDLLMv2(ModelFamily):
    """Fast-dLLM v2 checkpoints as a block-causal ``Qwen2ForCausalLM`` (blocks from position 0, logit shift 1)."""

    name = "fast-dllm-v2"
    default_preset = "fast-dllm-v2"
    description = (
        "Fast-dLLM v2 (block diffusion, Qwen2.5 with block-causal attention and token shift) as Qwen2ForCausalLM"
    )
    checkpoints = ("Efficient-Large-Model/Fast_dLLM_v2_7B", "Efficient-Large-Model/Fast_dLLM_v2_1.5B")
    model_types = ("Fast_dLLM_Qwen",)
    architectures = ("Fast_dLLM_QwenForCausalLM", "Fast_dLLM_QwenModel")
    end_of_turn = ("<|im_end|>",)
    adapter_options = ("mask_token_id", "eos_token_id", "block_length")
    tokenizer_class = "Qwen2Tokenizer"

    def stock_config(self, config: Mapping[str, Any]) -> Any:
        from transformers import Qwen2Config

        # the authors' inference attention never uses a sliding window (it passes an explicit block mask to sdpa)
        return without_sliding_window(Qwen2Config, config, drop=TRAINING_FIELDS)

    def model_class(self) -> type:
        from transformers import Qwen2ForCausalLM

        return Qwen2ForCausalLM

    def adapter(  # type: ignore[override]  # the keywords are the family's adapter_options
        self,
        model: Any,
        tokenizer: Any,
        config: Mapping[str, Any],
        *,
        mask_token_id: Any = None,
        eos_token_id: Any = None,
        block_length: Any = None,
    ):
        from refusion.models.block import HFBlockDiffusionLM

        length = block_length if block_length is not None else config.get("bd_size") or DEFAULT_BLOCK_LENGTH
        if mask_token_id is None and tokenizer is not None and hasattr(tokenizer, "get_vocab"):
            mask_token_id = tokenizer.get_vocab().get(MASK_TOKEN)
        return HFBlockDiffusionLM(
            model,
            tokenizer,
            block_length=length,
            layout="absolute",
            logit_shift=1,
            mask_token_id=mask_token_id,
            eos_token_id=self.eos_ids(model, tokenizer, eos_token_id),
        )


@hookimpl
def register_model_families(register):
    register(FastDLLMv2)
