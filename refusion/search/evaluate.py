"""Measuring one point of a space (and the AR baseline) on a task set.

Both go through :func:`refusion.measure.bench.measure`: batch 1, a warm-up, forwards
counted by a hook on the network, wall time around decoding only.
"""

from __future__ import annotations

from typing import Any

import attrs

from refusion.config import DecoderSpec
from refusion.search.tasks import TaskSet


@attrs.frozen
class Metrics:
    """Totals of one decoder over a task set: exact matches, forwards, generated tokens, wall seconds."""

    examples: int
    correct: int
    forwards: int
    tokens: int
    seconds: float
    #: the task's own score (lm-evaluation-harness metrics), when it is not exact matches / examples
    score: float | None = None

    @property
    def accuracy(self) -> float:
        return self.score if self.score is not None else self.correct / max(self.examples, 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / max(self.forwards, 1)

    @property
    def seconds_per_token(self) -> float:
        return self.seconds / max(self.tokens, 1)

    def relative_to(self, ar: "Metrics") -> dict[str, float]:
        """``speedup`` (AR wall time per token / this one's) and ``forward_ratio`` (AR forwards / this one's)."""
        return {"speedup": ar.seconds_per_token / max(self.seconds_per_token, 1e-12),
                "forward_ratio": ar.forwards / max(self.forwards, 1)}


def _metrics(row: Any) -> Metrics:
    return Metrics(row.examples, row.correct, row.forwards, row.tokens, row.seconds)


def evaluate_preset(adapter: Any, preset: DecoderSpec, tasks: TaskSet, *, warmup: int = 1) -> Metrics:
    """Decode every example of ``tasks`` with the decoder ``preset`` describes (its ``gen_length``, fitted to whole slots)."""
    from refusion.measure.bench import decoder_method, measure

    decoder = preset.build()
    method = decoder_method(decoder, adapter, decoder.fit_length(preset.gen_length))
    return _metrics(measure("point", method, adapter, tasks.examples, warmup=warmup))


def evaluate_ar(adapter: Any, tasks: TaskSet, gen_length: int, *, warmup: int = 1) -> Metrics:
    """The AR baseline (transformers ``generate``, greedy, KV cache) on the same examples."""
    from refusion.measure.bench import ar_method, measure

    return _metrics(measure("AR", ar_method(adapter, gen_length), adapter, tasks.examples, warmup=warmup))
