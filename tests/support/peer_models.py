"""Tiny random bidirectional networks for the peer tests (fp64), with a mask token that is never drafted."""

from __future__ import annotations

import torch

from refusion.models.mdm import HFMaskedDiffusionLM
from refusion.models.tiny import tiny_qwen3

VOCAB, EOS = 16, 2
MASK = VOCAB - 1


def peer_network(seed: int, scale: float = 4.0, eos_bias: float = 0.0):
    """A bidirectional Qwen3 whose LM head has a bias: -30 on the mask token, ``eos_bias`` on EOS."""
    net = tiny_qwen3(vocab_size=VOCAB, seed=seed, logit_scale=scale, eos_token_id=EOS)
    net.config.is_causal = False
    old = net.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True, dtype=old.weight.dtype)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[MASK] = -30.0
        head.bias[EOS] = eos_bias
    net.lm_head = head
    return net.eval()


def peer_model(seed: int, shift: int = 0, **kwargs) -> HFMaskedDiffusionLM:
    return HFMaskedDiffusionLM(peer_network(seed, **kwargs), logit_shift=shift)
