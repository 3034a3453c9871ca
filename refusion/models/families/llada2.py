"""LLaDA 2.x (inclusionAI LLaDA2.0-mini/-flash, LLaDA2.1-mini/-flash): an MoE block-diffusion LM, run as
transformers' ``Glm4MoeForCausalLM``.

Published as ``LLaDA2MoeModelLM`` (``model_type`` ``llada2_moe``; its code is on the Hugging Face hub only).
Its network is Glm4Moe's, term for term: group-limited sigmoid routing with a correction bias
(``expert_bias`` -> ``e_score_correction_bias``; group score = the sum of each group's top 2), top-k weights
normalised when more than one expert is chosen and scaled by ``routed_scaling_factor``, shared experts beside
the routed ones, the first ``first_k_dense_replace`` layers dense, per-head RMS q/k norms, rotary on the first
``partial_rotary_factor`` of each head (rotate-half) — with attention over the block-causal mask instead of a
causal one. Two things differ in the files: q, k and v are one fused ``query_key_value`` tensor (split on load by
a weight converter registered for :class:`LLaDA2MoeAsGlm4Moe` only, so Glm4Moe checkpoints load as before), and
the per-expert projections are stacked as transformers' MoE layers keep them. In bfloat16 the authors' loading
rounds the router's weight to bfloat16 while Glm4Moe keeps it in float32: :meth:`LLaDA2.numerics` rounds it
(float32 logits match to 0 and bfloat16 logits bit for bit on the CPU; measured on the fixture checkpoint).
Blocks count from position 0 (``layout="absolute"``), 32 long unless ``block_length`` says otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from refusion.errors import ConfigError
from refusion.models.families.base import ModelFamily, field_error, int_field
from refusion.plugins import hookimpl
from refusion.validators import is_number

#: LLaDA 2.x's block length (``generate(block_length=32)``, SGLang's and dInfer's dLLM mode)
DEFAULT_BLOCK_LENGTH = 32

#: config fields the authors' network never reads (the behaviour some describe is fixed in its code)
UNREAD = (
    "norm_head",
    "embedding_dropout",
    "output_dropout",
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "score_function",
    "moe_router_enable_expert_bias",
    "router_dtype",
    "norm_topk_prob",
    "rotary_dim",
    "moe_shared_expert_intermediate_size",
    "mask_token_id",
    "block_size",
)

#: the checkpoint's parameter names (regex) -> Glm4Moe's
RENAMES = {
    r"model\.word_embeddings\.": "model.embed_tokens.",
    r"attention\.dense\.": "self_attn.o_proj.",
    r"attention\.query_layernorm\.": "self_attn.q_norm.",
    r"attention\.key_layernorm\.": "self_attn.k_norm.",
    r"mlp\.gate\.expert_bias": "mlp.gate.e_score_correction_bias",
}


class LLaDA2(ModelFamily):
    """LLaDA 2.x checkpoints as a block-causal ``Glm4MoeForCausalLM`` (blocks from position 0, logit shift 0)."""

    name = "llada2"
    default_preset = "llada2"
    description = "LLaDA 2.x (MoE block diffusion) as transformers' Glm4MoeForCausalLM with block-causal masks"
    checkpoints = (
        "inclusionAI/LLaDA2.0-mini",
        "inclusionAI/LLaDA2.0-flash",
        "inclusionAI/LLaDA2.1-mini",
        "inclusionAI/LLaDA2.1-flash",
    )
    model_types = ("llada2_moe", "llada21_moe")
    architectures = ("LLaDA2MoeModelLM",)
    remote_modules = (
        "modeling_llada2_moe",
        "configuration_llada2_moe",
        "modeling_llada21_moe",
        "configuration_llada21_moe",
    )
    adapter_options = ("mask_token_id", "eos_token_id", "block_length")

    def preset_name(self, config: Mapping[str, Any]) -> str | None:
        """``llada2.1`` (editing) for a checkpoint whose config says LLaDA 2.1 (``model_type`` ``llada21_moe``),
        else LLaDA 2.0's ``llada2``; either decodes the other's weights when named."""
        return "llada2.1" if config.get("model_type") == "llada21_moe" else "llada2"

    def check(self, path: str, config: Mapping[str, Any]) -> None:
        """The routing and rotary fields Glm4Moe would fail on (a group of experts that does not divide them, more
        chosen groups than groups, more experts per token than experts) or silently misread (too few experts in
        the chosen groups, no rotary dimension), refused naming the field."""
        if config.get("num_experts") is None:
            return  # an all-dense network: refused by stock_config
        experts = int_field(path, config, "num_experts", None, 1, 2**16)
        top_k = int_field(path, config, "num_experts_per_tok", 2, 1, experts)
        groups = int_field(path, config, "n_group", 8, 1, experts)
        if experts % groups or experts // groups < 2:
            raise field_error(
                path,
                "n_group",
                groups,
                f"a divisor of `num_experts` ({experts}) leaving at least 2 experts per group (a group's score "
                "is the sum of its top 2)",
            )
        chosen = int_field(path, config, "topk_group", 4, 1, groups)
        if chosen * (experts // groups) < top_k:
            raise field_error(
                path,
                "topk_group",
                chosen,
                f"large enough that its groups hold `num_experts_per_tok` ({top_k}) experts: at least "
                f"{-(-top_k // (experts // groups))} of {groups} groups of {experts // groups}",
            )
        int_field(path, config, "moe_intermediate_size", None, 1, 2**20)
        int_field(path, config, "num_shared_experts", 0, 0, 2**12)
        int_field(
            path, config, "first_k_dense_replace", 0, 0, int_field(path, config, "num_hidden_layers", 1, 1, 2**12)
        )
        factor = config.get("partial_rotary_factor", 0.5)
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        if not is_number(factor) or not 0 < factor <= 1 or int(head_dim * factor) < 2 or int(head_dim * factor) % 2:
            raise field_error(
                path,
                "partial_rotary_factor",
                factor,
                f"a number in (0, 1] leaving an even number (>= 2) of the head's {head_dim} dimensions to the rotary",
            )
        scaling = config.get("routed_scaling_factor", 2.5)
        if not is_number(scaling) or not scaling > 0:
            raise field_error(path, "routed_scaling_factor", scaling, "a finite number > 0")

    def stock_config(self, config: Mapping[str, Any]) -> Any:
        from transformers import Glm4MoeConfig

        refuse = {
            "use_bias": (config.get("use_bias", True) is not False, "an output-projection bias Glm4Moe has not"),
            "num_experts": (config.get("num_experts") is None, "an all-dense network (no published model is one)"),
            "score_function": (config.get("score_function", "sigmoid") != "sigmoid", "a router other than sigmoid"),
        }
        for field, (bad, why) in refuse.items():
            if bad:
                raise ConfigError(
                    f"This LLaDA 2.x checkpoint sets `{field}` = {config.get(field)!r}: {why}; refusion runs the "
                    "published configurations only. Load it with its own code instead (`trust_remote_code=True`).",
                    param="model",
                )
        heads = config["num_attention_heads"]
        rope = dict(config.get("rope_scaling") or {"rope_type": "default"})
        rope.setdefault("rope_type", rope.pop("type", "default"))
        rope["rope_theta"] = config.get("rope_theta", 10000.0)
        rope["partial_rotary_factor"] = config.get("partial_rotary_factor", 0.5)
        top_k = config.get("num_experts_per_tok", 2)
        return Glm4MoeConfig(
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            hidden_act=config.get("hidden_act", "silu"),
            max_position_embeddings=config.get("max_position_embeddings", 16384),
            initializer_range=config.get("initializer_range", 0.02),
            rms_norm_eps=config.get("rms_norm_eps", 1e-5),
            use_cache=True,
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            rope_parameters=rope,
            attention_bias=config.get("use_qkv_bias", False),
            attention_dropout=0.0,
            moe_intermediate_size=config["moe_intermediate_size"],
            num_experts_per_tok=top_k,
            n_shared_experts=config.get("num_shared_experts") or 0,
            n_routed_experts=config["num_experts"],
            routed_scaling_factor=config.get("routed_scaling_factor", 2.5),
            n_group=config.get("n_group", 8),
            topk_group=config.get("topk_group", 4),
            first_k_dense_replace=config.get("first_k_dense_replace", 0),
            norm_topk_prob=top_k > 1,  # the authors normalise the chosen weights when more than one is chosen
            use_qk_norm=config.get("use_qk_norm", True),
            pad_token_id=config.get("pad_token_id"),
            bos_token_id=config.get("bos_token_id"),
            eos_token_id=config.get("eos_token_id"),
            num_mtp_layers=0,
            is_causal=False,  # attention follows the block-causal mask the adapter passes
        )

    def model_class(self) -> type:
        return llada2_as_glm4moe()

    def numerics(self, model: Any, config: Mapping[str, Any]) -> None:
        """The authors' half-precision load rounds the router's weight (and ``expert_bias``) to the model dtype;
        Glm4Moe keeps them in float32 (it computes routing in float32 either way): round them the same."""
        import torch

        dtype = model.dtype
        if dtype == torch.float32:
            return
        with torch.no_grad():
            for layer in model.model.layers:
                gate = getattr(layer.mlp, "gate", None)
                if gate is None or not hasattr(gate, "e_score_correction_bias"):
                    continue
                gate.weight.copy_(gate.weight.to(dtype).to(gate.weight.dtype))
                bias = gate.e_score_correction_bias
                bias.copy_(bias.to(dtype).to(bias.dtype))

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

        mask = mask_token_id if mask_token_id is not None else config.get("mask_token_id")
        return HFBlockDiffusionLM(
            model,
            tokenizer,
            block_length=block_length if block_length is not None else DEFAULT_BLOCK_LENGTH,
            layout="absolute",
            mask_token_id=mask,
            eos_token_id=self.eos_ids(model, tokenizer, eos_token_id),
        )


@functools.cache
def llada2_as_glm4moe() -> type:
    """``Glm4MoeForCausalLM`` under its own name, with the weight conversion of LLaDA 2.x files registered for
    that name only (transformers looks a class name up before the model type)."""
    from transformers import Glm4MoeForCausalLM
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )
    from transformers.core_model_loading import Split, WeightConverter, WeightRenaming

    class LLaDA2MoeAsGlm4Moe(Glm4MoeForCausalLM):
        """transformers' Glm4Moe network, loaded from LLaDA 2.x files."""

    # transformers decides from the source of a class's module whether its attention and experts implementations
    # may be chosen (grouped_mm, sdpa, ...): this subclass runs Glm4Moe's code, so it may as Glm4Moe may
    LLaDA2MoeAsGlm4Moe._can_set_experts_implementation_cached_value = (
        Glm4MoeForCausalLM._can_set_experts_implementation()
    )
    LLaDA2MoeAsGlm4Moe._can_set_attn_implementation_cached_value = Glm4MoeForCausalLM._can_set_attn_implementation()

    conversions: list[Any] = [WeightRenaming(source, target) for source, target in RENAMES.items()]
    for kind in ("weight", "bias"):
        conversions.append(
            WeightConverter(
                source_patterns=f"attention.query_key_value.{kind}",
                target_patterns=[f"self_attn.{p}_proj.{kind}" for p in ("q", "k", "v")],
                operations=[Split(dim=0)],
            )
        )
    conversions += get_checkpoint_conversion_mapping("qwen2_moe") or []  # per-expert projections, stacked
    register_checkpoint_conversion_mapping(LLaDA2MoeAsGlm4Moe.__name__, conversions, overwrite=True)
    return LLaDA2MoeAsGlm4Moe


@hookimpl
def register_model_families(register):
    register(LLaDA2)
