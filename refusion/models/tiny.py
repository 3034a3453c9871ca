"""Tiny random Qwen3 models built in code, for tests and examples (nothing is downloaded)."""

from __future__ import annotations

import torch


def tiny_qwen3(
    *,
    vocab_size: int = 48,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_positions: int = 256,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    logit_scale: float = 1.0,
    mask_token_id: int | None = None,
    eos_token_id: int | None = None,
    attn_implementation: str = "sdpa",
    intermediate_size: int | None = None,
):
    """A randomly initialised ``Qwen3ForCausalLM`` whose config names a mask (and EOS) token.

    ``logit_scale`` multiplies the LM head so that distributions are peaked
    enough for thresholds to matter. The mask token defaults to the last id;
    ``intermediate_size`` (the MLP width) defaults to twice ``hidden_size``.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size if intermediate_size is None else intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
        pad_token_id=None,
        bos_token_id=None,
    )
    config.mask_token_id = vocab_size - 1 if mask_token_id is None else mask_token_id
    config._attn_implementation = attn_implementation
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Qwen3ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.to(dtype).eval()
