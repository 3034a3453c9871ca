"""LLaDA (Nie et al., arXiv 2502.09992): a bidirectional LLaMA whose logits at a mask predict that position.

Published as ``LLaDAModelLM`` (OLMo-style module names, ``model_type`` ``llada``):
GSAI-ML/LLaDA-8B-Base, LLaDA-8B-Instruct and LLaDA-1.5. The network is LLaMA's
(RMSNorm, RoPE, SwiGLU, no biases) with attention over the whole sequence, so
it runs as transformers' ``LlamaForCausalLM`` with ``is_causal=False`` and
its parameters renamed (``transformer.blocks.i.attn_out`` -> ``layers.i.self_attn.o_proj`` ...).
Unlike LLaDA's own class it takes ``position_ids`` and a transformers cache,
so Fast-dLLM's prefix and dual caches keep exact rotary positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.errors import ConfigError
from refusion.models.families.base import MaskedDiffusionFamily, refuse_fields
from refusion.plugins import hookimpl

#: published name (regex on the checkpoint key) -> LlamaForCausalLM name
KEY_MAPPING = {
    r"^model\.transformer\.wte\.": "model.embed_tokens.",
    r"^model\.transformer\.ln_f\.": "model.norm.",
    r"^model\.transformer\.ff_out\.": "lm_head.",
    **{
        rf"^model\.transformer\.blocks\.(\d+)\.{old}\.": rf"model.layers.\1.{new}."
        for old, new in (
            ("attn_norm", "input_layernorm"),
            ("q_proj", "self_attn.q_proj"),
            ("k_proj", "self_attn.k_proj"),
            ("v_proj", "self_attn.v_proj"),
            ("attn_out", "self_attn.o_proj"),
            ("ff_norm", "post_attention_layernorm"),
            ("ff_proj", "mlp.gate_proj"),
            ("up_proj", "mlp.up_proj"),
            ("ff_out", "mlp.down_proj"),
        )
    },
}

#: LLaDA config fields the LLaMA translation reproduces only at these values (those of the published models)
SUPPORTED = {
    "block_type": "llama",
    "activation_type": "silu",
    "layer_norm_type": "rms",
    "rope": True,
    "alibi": False,
    "attention_layer_norm": False,
    "input_emb_norm": False,
    "scale_logits": False,
    "block_group_size": 1,
    "layer_norm_with_affine": True,
    "bias_for_layer_norm": (None, False),
    "include_bias": False,
    "include_qkv_bias": (None, False),
}


class LLaDA(MaskedDiffusionFamily):
    """LLaDA checkpoints as a bidirectional ``LlamaForCausalLM`` (logit shift 0)."""

    name = "llada"
    default_preset = "llada"
    description = "LLaDA (bidirectional LLaMA, logits predict the masked position) as transformers' LlamaForCausalLM"
    checkpoints = ("GSAI-ML/LLaDA-8B-Base", "GSAI-ML/LLaDA-8B-Instruct", "GSAI-ML/LLaDA-1.5")
    model_types = ("llada",)
    architectures = ("LLaDAModelLM",)
    remote_modules = ("modeling_llada", "configuration_llada")
    end_of_turn = ("<|eot_id|>",)

    def matches(self, config: Mapping[str, Any]) -> bool:
        # LLaDA-MoE reuses model_type "llada" with another architecture (LLaDAMoEModelLM)
        archs = config.get("architectures") or ()
        if any("MoE" in a for a in archs):
            return False
        return super().matches(config)

    def stock_config(self, config: Mapping[str, Any]) -> Any:
        from transformers import LlamaConfig

        refuse_fields("LLaDA", config, SUPPORTED)
        try:
            d_model, heads, layers = int(config["d_model"]), int(config["n_heads"]), int(config["n_layers"])
        except KeyError as exc:
            raise ConfigError(
                f"This LLaDA config.json has no `{exc.args[0]}`: it is not a LLaDAModelLM config."
            ) from None
        kv_heads = config.get("n_kv_heads") or (1 if config.get("multi_query_attention") else heads)
        hidden = config.get("mlp_hidden_size") or int(config.get("mlp_ratio", 4)) * d_model
        stock = LlamaConfig(
            vocab_size=int(config.get("embedding_size") or config["vocab_size"]),
            hidden_size=d_model,
            intermediate_size=int(hidden),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(kv_heads),
            head_dim=d_model // heads,
            hidden_act="silu",
            max_position_embeddings=int(config.get("max_sequence_length", 4096)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            tie_word_embeddings=bool(config.get("weight_tying", False)),
            attention_bias=False,
            mlp_bias=False,
            pad_token_id=config.get("pad_token_id"),
            eos_token_id=config.get("eos_token_id"),
            bos_token_id=config.get("bos_token_id"),
        )
        stock.is_causal = False
        if config.get("mask_token_id") is not None:
            stock.mask_token_id = int(config["mask_token_id"])
        dtype = config.get("torch_dtype") or config.get("dtype")
        if dtype is not None:
            stock.dtype = dtype
        return stock

    def model_class(self) -> type:
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM

    def numerics(self, model: Any, config: Mapping[str, Any]) -> None:
        """LLaDA applies rotary embeddings in float32 when its config says ``rope_full_precision`` (its default,
        and every published config): so does the loaded network."""
        from refusion.models.families.numerics import float32_rotary

        if config.get("rope_full_precision", True):
            float32_rotary(model)

    def key_mapping(self, config: Mapping[str, Any]) -> dict[str, str]:
        return dict(KEY_MAPPING)


@hookimpl
def register_model_families(register):
    register(LLaDA)
