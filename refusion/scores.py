"""The model's output at some fed positions, projected to the vocabulary only when and where asked.

A :class:`Scores` holds either the hidden states before the LM head (plus the
head) or, for models without a separate head, the logits themselves. Parts
read what they need:

* ``scores.logits`` - full ``(n, vocab)`` logits (materialised on first use);
* ``scores.greedy(exclude=...)`` - argmax token and its softmax probability
  per row, fused (no ``(n, vocab)`` tensor);
* ``scores.probability(tokens)`` - softmax probability of given tokens;
* ``scores[rows]`` - the same for a subset of rows, computing nothing.

Probabilities are computed in float32 at least (float64 for a float64
model), whatever the model's dtype.
"""

from __future__ import annotations

from typing import Any

import torch


def _reduce_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class Scores:
    """Outputs at ``n`` rows (leading shape ``shape``); see the module docstring.

    Build with ``Scores(hidden=h, head=head)`` (``h`` of shape ``(..., d)``) or
    ``Scores(logits=x)`` (``x`` of shape ``(..., vocab)``).
    """

    __slots__ = ("hidden", "head", "_logits")

    def __init__(self, hidden: torch.Tensor | None = None, head: Any = None, logits: torch.Tensor | None = None):
        if logits is None and (hidden is None or head is None):
            raise ValueError("Scores need `logits` or both `hidden` and `head`")
        self.hidden = hidden
        self.head = head
        self._logits = logits

    @staticmethod
    def of(value: "Scores | torch.Tensor") -> "Scores":
        """``value`` as Scores (a logits tensor is wrapped)."""
        return value if isinstance(value, Scores) else Scores(logits=value)

    @property
    def shape(self) -> tuple[int, ...]:
        source = self.hidden if self.hidden is not None else self._logits
        return tuple(source.shape[:-1])

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def materialised(self) -> bool:
        return self._logits is not None

    @property
    def logits(self) -> torch.Tensor:
        """Full logits, shape ``(*shape, vocab)``, in the model's dtype."""
        if self._logits is None:
            self._logits = self.head.logits(self.hidden)
        return self._logits

    def __getitem__(self, index: Any) -> "Scores":
        if self._logits is not None:
            return Scores(self.hidden[index] if self.hidden is not None else None, self.head, self._logits[index])
        return Scores(self.hidden[index], self.head)

    def stats(self, exclude: int | None = None, temperature: float = 1.0):
        """``(tokens, best, lse)`` of 1-D rows: argmax id (never ``exclude``), its tempered logit, log-sum-exp."""
        if self._logits is None:
            return self.head.stats(self.hidden, exclude, temperature)
        x = self._logits.to(_reduce_dtype(self._logits.dtype))
        if temperature != 1.0:
            x = x / temperature
        lse = torch.logsumexp(x, dim=-1)
        ranked = x if exclude is None else x.index_fill(-1, torch.tensor([exclude], device=x.device), float("-inf"))
        best, tokens = ranked.max(dim=-1)
        return tokens, best, lse

    def greedy(self, exclude: int | None = None, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Argmax token (never ``exclude``) and its probability under ``softmax(logits / temperature)``."""
        tokens, best, lse = self.stats(exclude, temperature)
        probs = torch.where(torch.isfinite(lse) & torch.isfinite(best), torch.exp(best - lse), torch.zeros_like(lse))
        return tokens, probs

    def probability(self, tokens: torch.Tensor) -> torch.Tensor:
        """Softmax probability of ``tokens[i]`` at row ``i`` (shape ``(n,)``)."""
        if self._logits is None:
            _, _, lse = self.head.stats(self.hidden)
            picked = self.head.token_logits(self.hidden, tokens).to(lse.dtype)
            return torch.exp(picked - lse)
        x = self._logits.to(_reduce_dtype(self._logits.dtype))
        return torch.softmax(x, dim=-1).gather(-1, tokens.to(x.device).unsqueeze(-1)).squeeze(-1)
