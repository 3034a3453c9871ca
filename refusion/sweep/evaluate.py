"""Measuring one point of a space (and the AR baseline) on a task set.

Both go through :func:`refusion.measure.bench.measure`: batch 1, a warm-up, forwards
counted by a hook on the network, wall time around decoding only.
"""

from __future__ import annotations

from typing import Any

from refusion.config import DecoderSpec
from refusion.config.spec import DEFAULT_GEN_LENGTH
from refusion.decoding.decoder import Decoder
from refusion.measure.results import Result
from refusion.sweep.tasks import TaskSet


def evaluate_preset(adapter: Any, preset: DecoderSpec, tasks: TaskSet, *, warmup: int = 1) -> Result:
    """Decode every example of ``tasks`` with the decoder ``preset`` describes (its ``gen_length``, fitted to whole
    slots)."""
    from refusion.measure.bench import decoder_method, measure

    decoder = Decoder.from_spec(preset)
    method = decoder_method(decoder, adapter, decoder.fit_length(preset.gen_length or DEFAULT_GEN_LENGTH))
    return measure("point", method, adapter, tasks.examples, warmup=warmup)


def evaluate_ar(adapter: Any, tasks: TaskSet, gen_length: int, *, warmup: int = 1) -> Result:
    """The AR baseline (transformers ``generate``, greedy, KV cache) on the same examples."""
    from refusion.measure.bench import ar_method, measure

    return measure("AR", ar_method(adapter, gen_length), adapter, tasks.examples, warmup=warmup)
