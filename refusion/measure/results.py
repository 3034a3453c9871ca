"""The one result type of a measured decoder: what ``refusion bench``, ``refusion sweep`` and records report."""

from __future__ import annotations

import attrs


@attrs.frozen
class Result:
    """Totals of one decoding method over a set of examples (batch 1, after a warm-up).

    ``correct`` counts exact matches; ``score`` is a task's own metric where
    it is not ``correct / examples`` (lm-evaluation-harness tasks).
    ``forwards`` are network forwards, ``tokens`` generated tokens (up to and
    including the first EOS, prompts never counted), ``seconds`` wall time
    around decoding only. ``per_task`` holds exact-match accuracy per task,
    ``gpu_seconds`` the cost model's estimate when one was asked for, and
    ``outputs`` each example's generated token ids (what ``refusion
    reproduce`` compares).
    """

    method: str
    examples: int
    correct: int
    forwards: int
    tokens: int
    seconds: float
    score: float | None = None
    per_task: dict[str, float] = attrs.field(factory=dict)
    gpu_seconds: float | None = None
    outputs: tuple[tuple[int, ...], ...] = attrs.field(default=(), repr=False)

    @property
    def accuracy(self) -> float:
        return self.score if self.score is not None else self.correct / max(self.examples, 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / max(self.forwards, 1)

    @property
    def seconds_per_token(self) -> float:
        return self.seconds / max(self.tokens, 1)

    def relative_to(self, baseline: Result) -> dict[str, float]:
        """``speedup`` (the baseline's wall time per token / this one's) and ``forward_ratio`` (its forwards /
        these)."""
        return {
            "speedup": baseline.seconds_per_token / max(self.seconds_per_token, 1e-12),
            "forward_ratio": baseline.forwards / max(self.forwards, 1),
        }
