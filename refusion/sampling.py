"""Turning logits into draft tokens and their confidences.

A sampler is a small callable, in the spirit of transformers' LogitsProcessor:
it receives logits of shape ``(n, vocab)`` and the id it must never pick
(``exclude``: the mask token), and returns ``(tokens, confidence)``, both of
shape ``(n,)``, where ``confidence`` is the probability the model gives the
chosen token. It must not modify the logits in place.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Sampler(Protocol):
    def __call__(self, logits: torch.Tensor, exclude: int | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...


def greedy(logits: torch.Tensor, exclude: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax token (never ``exclude``) and its softmax probability (the reference's rule at temperature 0).

    Runs the fused Triton kernel on CUDA tensors, the torch reference elsewhere
    (:func:`refusion_kernels.confidence`).
    """
    from refusion_kernels import confidence

    return confidence(logits, 1.0, exclude)


def token_probability(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Softmax probability of ``tokens`` (shape ``(n,)``) under ``logits`` (shape ``(n, vocab)``).

    Computed in the logits' own dtype, as the reference decoder does, so that
    threshold decisions on bf16 models match it.
    """
    return torch.softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
