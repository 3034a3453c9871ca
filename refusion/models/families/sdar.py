"""SDAR (JetAstra, block diffusion): a Qwen3 with block-causal attention, blocks counted from position 0.

Published as ``SDARForCausalLM`` (``model_type`` ``sdar``): JetLM/SDAR-1.7B-Chat,
SDAR-4B-Chat and SDAR-8B-Chat. Its parameters carry Qwen3's names and its
network is Qwen3's; attention is bidirectional inside a block of
``block_length`` tokens and causal across blocks, over the prompt too (SDAR's
``block_diffusion_generate`` counts blocks from absolute position 0). It runs
as transformers' ``Qwen3ForCausalLM`` given the block-causal mask by the
``hf-block`` adapter with ``layout="absolute"``. ``block_length`` is the
config's ``block_size`` when it has one, else 4 (the published SDAR models'
block, as their README and SGLang's loader use it); the mask token is the
tokenizer's ``mask_token`` (``<|MASK|>``) unless the config names one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.models.families.base import ModelFamily, without_sliding_window
from refusion.plugins import hookimpl

#: SDAR's block length when its config does not say (every published SDAR chat model)
DEFAULT_BLOCK_LENGTH = 4

#: SDAR config fields for its training and inference kernels, meaningless to the network's maths
KERNEL_FIELDS = (
    "fuse_cross_entropy",
    "debug",
    "ep_size",
    "micro_forward",
    "skip_checkpoint",
    "use_deepep",
    "attn_implementation",
    "_attn_implementation",
)


class SDAR(ModelFamily):
    """SDAR checkpoints as a block-causal ``Qwen3ForCausalLM`` (blocks from position 0, logit shift 0)."""

    name = "sdar"
    default_preset = "sdar"
    description = "SDAR (block diffusion, Qwen3 with block-causal attention from position 0) as Qwen3ForCausalLM"
    checkpoints = ("JetLM/SDAR-1.7B-Chat", "JetLM/SDAR-4B-Chat", "JetLM/SDAR-8B-Chat")
    model_types = ("sdar",)
    architectures = ("SDARForCausalLM",)
    remote_modules = ("modeling_sdar", "configuration_sdar")
    end_of_turn = ("<|im_end|>",)
    adapter_options = ("mask_token_id", "eos_token_id", "block_length")
    tokenizer_class = "Qwen2Tokenizer"

    def stock_config(self, config: Mapping[str, Any]) -> Any:
        from transformers import Qwen3Config

        return without_sliding_window(Qwen3Config, config, drop=(*KERNEL_FIELDS, "block_size"))

    def model_class(self) -> type:
        from transformers import Qwen3ForCausalLM

        return Qwen3ForCausalLM

    def numerics(self, model: Any, config: Mapping[str, Any]) -> None:
        """Every SDAR norm is flash-attn's ``rms_norm_fn`` (weight multiplied in float32, one rounding)."""
        from refusion.models.families.numerics import round_once_rms_norm

        round_once_rms_norm(model)

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

        length = block_length if block_length is not None else config.get("block_size", DEFAULT_BLOCK_LENGTH)
        return HFBlockDiffusionLM(
            model,
            tokenizer,
            block_length=length,
            layout="absolute",
            mask_token_id=mask_token_id,
            eos_token_id=self.eos_ids(model, tokenizer, eos_token_id),
        )


@hookimpl
def register_model_families(register):
    register(SDAR)
