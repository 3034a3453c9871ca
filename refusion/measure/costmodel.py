"""A roofline estimate of what a decode would cost on a GPU, from the shapes of its forwards.

No GPU is needed: while recording, an engine's
:class:`~refusion.counters.Counters` keep every forward's shape
(:class:`~refusion.counters.ForwardShape`: sequences, tokens fed,
query-key pairs of attention, key/value tokens read) and every LM-head pass
(rows projected). For a named
model size (:data:`MODELS`, e.g. Qwen3-8B) and GPU (:data:`GPUS`), each
forward is charged ``max(FLOPs / (peak FLOP/s x compute efficiency),
bytes / (HBM bandwidth x memory efficiency)) + launch overhead``, where

* FLOPs = 2 x (non-embedding parameters) x tokens + 4 x layers x heads x head_dim x (query-key pairs);
* bytes = non-embedding weights + keys/values read (2 x layers x kv_heads x head_dim x tokens read)
  + keys/values written for the fed tokens, all at the model's ``bytes_per_param``;

and each LM-head pass ``max(2 x hidden x vocab x rows / compute, hidden x vocab x bytes / bandwidth)``.

Limits, stated plainly: it ignores kernel fusion quality, attention kernels'
own efficiency on short or ragged rows, CPU-side Python overhead (assumed
hidden by CUDA graphs or overlap) and tensor parallelism; it assumes dense
attention over each row's visible keys. Use it to compare methods on the
same model and GPU (ratios), not as a promise of absolute throughput.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from refusion.counters import Counters, ForwardShape
from refusion.errors import ConfigError, unknown_name


@attrs.frozen
class ModelSize:
    """The shape of a transformer LM: enough to count FLOPs and bytes."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    bytes_per_param: int = 2

    @property
    def layer_params(self) -> int:
        attention = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        return attention + 3 * self.hidden * self.intermediate

    @property
    def body_params(self) -> int:
        """Parameters a forward multiplies with (the embedding lookup and the LM head excluded)."""
        return self.layers * self.layer_params

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @classmethod
    def from_config(cls, config, name: str = "model", bytes_per_param: int = 2) -> ModelSize:
        heads = config.num_attention_heads
        return cls(
            name,
            config.num_hidden_layers,
            config.hidden_size,
            heads,
            getattr(config, "num_key_value_heads", None) or heads,
            getattr(config, "head_dim", None) or config.hidden_size // heads,
            config.intermediate_size,
            config.vocab_size,
            bytes_per_param,
        )


@attrs.frozen
class GPU:
    """Peak dense bf16 FLOP/s and HBM bandwidth (bytes/s), with the fractions of them a good kernel reaches."""

    name: str
    flops: float
    bandwidth: float
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    launch_overhead: float = 20e-6  # seconds per forward (kernel launches not hidden by CUDA graphs)


#: Published model shapes (config.json of the public checkpoints).
MODELS = {
    "qwen3-8b": ModelSize("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936),
    "qwen3-1.7b": ModelSize("qwen3-1.7b", 28, 2048, 16, 8, 128, 6144, 151936),
    "qwen3-0.6b": ModelSize("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936),
}

#: Vendors' datasheet peaks (dense bf16 tensor-core FLOP/s, HBM bandwidth).
GPUS = {
    "h100": GPU("h100", 989e12, 3.35e12),
    "h200": GPU("h200", 989e12, 4.8e12),
    "a100": GPU("a100", 312e12, 2.039e12),
}


def parse(spec: str) -> tuple[ModelSize, GPU]:
    """``"qwen3-8b@h100"`` -> (model size, GPU)."""
    if not isinstance(spec, str) or spec.count("@") != 1:
        raise ConfigError(
            f"`cost_model` must look like MODEL@GPU, e.g. qwen3-8b@h100; got {spec!r}. "
            f"Models: {', '.join(MODELS)}; GPUs: {', '.join(GPUS)}.",
            param="cost_model",
        )
    model, gpu = spec.lower().split("@")
    if model not in MODELS:
        raise unknown_name("cost-model model", model, MODELS)
    if gpu not in GPUS:
        raise unknown_name("cost-model GPU", gpu, GPUS)
    return MODELS[model], GPUS[gpu]


def forward_seconds(shape: ForwardShape, model: ModelSize, gpu: GPU) -> float:
    """Roofline time of one forward (the LM head excluded; see :func:`head_seconds`)."""
    flops = 2 * model.body_params * shape.tokens + 4 * model.layers * model.heads * model.head_dim * shape.pairs
    moved = model.body_params * model.bytes_per_param + model.kv_bytes_per_token * (shape.keys + shape.tokens)
    compute = flops / (gpu.flops * gpu.compute_efficiency)
    memory = moved / (gpu.bandwidth * gpu.memory_efficiency)
    return max(compute, memory) + gpu.launch_overhead


def head_seconds(rows: int, model: ModelSize, gpu: GPU) -> float:
    """Roofline time of one LM-head pass over ``rows`` rows."""
    flops = 2 * model.hidden * model.vocab * rows
    moved = model.hidden * model.vocab * model.bytes_per_param
    return max(flops / (gpu.flops * gpu.compute_efficiency), moved / (gpu.bandwidth * gpu.memory_efficiency))


def estimate(forwards: Iterable[ForwardShape], head_passes: Iterable[int], model: ModelSize, gpu: GPU) -> float:
    """Seconds for a run of ``forwards`` and LM-head passes (rows per pass) on ``gpu``."""
    return sum(forward_seconds(f, model, gpu) for f in forwards) + sum(head_seconds(r, model, gpu) for r in head_passes)


def autoregressive(prompt_lengths: list[int], new_tokens: int) -> tuple[list[ForwardShape], list[int]]:
    """The forwards and head passes of greedy AR decoding of a batch (prefill, then one token per row per step)."""
    rows = len(prompt_lengths)
    forwards = [ForwardShape(rows, sum(prompt_lengths), sum(p * (p + 1) // 2 for p in prompt_lengths), 0)]
    heads = [rows]
    for step in range(1, new_tokens):
        context = [p + step for p in prompt_lengths]
        forwards.append(ForwardShape(rows, rows, sum(context), sum(c - 1 for c in context)))
        heads.append(rows)
    return forwards, heads


def counted_seconds(counters: Counters, model: ModelSize, gpu: GPU) -> float:
    """:func:`estimate` of the forwards and LM-head passes ``counters`` recorded (see :class:`recording`)."""
    return estimate(counters.shapes or (), counters.head_rows or (), model, gpu)


class recording:
    """``with recording(engine) as counters:`` the engine's counters record every forward's shape and every pass
    of its model's LM head (then :func:`counted_seconds`); they stop recording on exit."""

    def __init__(self, engine) -> None:
        self.engine = engine
        found = getattr(engine.model, "head", None)
        self.head = found[1] if found else None

    def __enter__(self) -> Counters:
        self.engine.counters.record()
        if self.head is not None:
            self.head.counters = self.engine.counters
        return self.engine.counters

    def __exit__(self, *exc) -> None:
        self.engine.counters.record(False)
        if self.head is not None:
            self.head.counters = None
