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
    """Argmax token (never ``exclude``) and its softmax probability (the reference's rule at temperature 0)."""
    if exclude is None:
        tokens = logits.argmax(dim=-1)
    else:
        top = logits.topk(2, dim=-1).indices
        tokens = torch.where(top[..., 0] == exclude, top[..., 1], top[..., 0])
    return tokens, token_probability(logits, tokens)


def token_probability(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Softmax probability of ``tokens`` (shape ``(n,)``) under ``logits`` (shape ``(n, vocab)``)."""
    work = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return torch.exp(work.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(work, dim=-1))
