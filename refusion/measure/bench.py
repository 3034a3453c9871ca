"""Measuring decoders side by side on the synthetic held-out tasks.

Every method decodes the same examples one at a time (batch 1) on the same
model; the clock runs around decoding only (tokenisation and scoring
excluded) after a warm-up. Forwards are counted by a hook on the network, so
transformers' ``generate`` and refusion's decoder are counted the same way.
Tokens are the generated tokens up to and including the first EOS; prompt
tokens are never counted.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import attrs
import torch

from refusion.training.tasks import Example, is_correct


@attrs.frozen
class Row:
    """One method's totals over the examples."""

    method: str
    examples: int
    correct: int
    forwards: int
    tokens: int
    seconds: float
    per_task: dict[str, float] = attrs.field(factory=dict)
    #: estimated seconds on a GPU (``--cost-model``), when asked for
    gpu_seconds: float | None = None
    #: each example's generated token ids, in example order (what ``refusion reproduce`` compares)
    outputs: tuple[tuple[int, ...], ...] = attrs.field(default=(), repr=False)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.examples, 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / max(self.forwards, 1)


class ForwardCounter:
    """Counts calls of a network's forward (use as a context manager).

    The hook sits on the backbone (``base_model``) when there is one, which
    every forward goes through, whether the caller runs the whole model
    (``generate``) or the backbone and its LM head apart (refusion's engines).
    """

    def __init__(self, module: torch.nn.Module):
        module = getattr(module, "base_model", module)
        self.module, self.count, self._handle = module, 0, None

    def __enter__(self) -> "ForwardCounter":
        self._handle = self.module.register_forward_pre_hook(self._hook)
        return self

    def _hook(self, module, args):
        self.count += 1

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def _cut_at_eos(ids: list[int], eos: frozenset[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


class Method:
    """A way to decode one prompt, callable as ``method(prompt) -> tokens``; ``shapes`` logs its forwards
    for the GPU cost model when ``recording`` is on."""

    def __init__(self, run: Callable[[list[int]], list[int]]):
        self.run = run
        self.recording = False
        self.shapes: Any = None

    def __call__(self, prompt: list[int]) -> list[int]:
        return self.run(prompt)


def ar_method(adapter: Any, gen_length: int) -> Method:
    """Greedy AR with transformers' ``generate`` and its KV cache (mask token suppressed)."""
    from refusion.measure.costmodel import ShapeLog, autoregressive

    eos = sorted(adapter.eos_token_ids)

    def run(prompt: list[int]) -> list[int]:
        ids = torch.tensor([prompt], device=adapter.device)
        out = adapter.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen_length, do_sample=False,
            eos_token_id=eos or None, pad_token_id=adapter.mask_token_id, suppress_tokens=[adapter.mask_token_id],
        )
        tokens = _cut_at_eos(out[0, len(prompt):].tolist(), adapter.eos_token_ids)
        if method.recording:
            forwards, heads = autoregressive([len(prompt)], len(tokens))
            method.shapes.forwards += forwards
            method.shapes.head_passes += heads
        return tokens

    method = Method(run)
    method.shapes = ShapeLog()
    return method


def decoder_method(decoder: Any, adapter: Any, gen_length: int) -> Method:
    """refusion's decoder with the given parts, on one engine kept for all prompts."""
    from refusion.measure.costmodel import recording
    from refusion.engines import open_engine

    engine = open_engine(adapter, decoder)

    def run(prompt: list[int]) -> list[int]:
        if method.recording:
            with recording(engine) as log:
                tokens = decoder.decode(adapter, prompt, gen_length, engine=engine).tokens.tolist()
            method.shapes.forwards += log.forwards
            method.shapes.head_passes += log.head_passes
            return tokens
        return decoder.decode(adapter, prompt, gen_length, engine=engine).tokens.tolist()

    method = Method(run)
    from refusion.measure.costmodel import ShapeLog

    method.shapes = ShapeLog()
    return method


def measure(
    name: str,
    method: Callable[[list[int]], list[int]],
    adapter: Any,
    examples: Sequence[Example],
    *,
    warmup: int = 3,
    progress: bool = False,
    cost_model: str | None = None,
) -> Row:
    """Decode every example with ``method``; return accuracy, forwards, tokens and seconds.

    ``cost_model`` (e.g. ``"qwen3-8b@h100"``) also estimates the time the same
    forwards would take on that GPU at that model size (:mod:`refusion.measure.costmodel`).
    """
    tokenizer = adapter.tokenizer
    prompts = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    for prompt in prompts[:warmup]:
        method(prompt)
    correct, tokens, seconds = 0, 0, 0.0
    outputs: list[tuple[int, ...]] = []
    per_task: dict[str, list[int]] = {}
    if cost_model is not None and isinstance(method, Method):
        method.recording = True
    with ForwardCounter(adapter.model) as counter, torch.no_grad():
        from tqdm.auto import tqdm

        for example, prompt in tqdm(list(zip(examples, prompts)), desc=name[:40], disable=not progress, leave=False):
            start = time.perf_counter()
            out = method(prompt)
            seconds += time.perf_counter() - start
            tokens += len(out)
            outputs.append(tuple(int(t) for t in out))
            ok = is_correct(example, tokenizer.decode(out, skip_special_tokens=True))
            correct += ok
            per_task.setdefault(example.task, []).append(ok)
    gpu = None
    if cost_model is not None and isinstance(method, Method):
        from refusion.measure.costmodel import parse

        method.recording = False
        gpu = method.shapes.seconds(*parse(cost_model))
    return Row(name, len(examples), correct, counter.count, tokens, seconds,
               {task: sum(v) / len(v) for task, v in per_task.items()}, gpu, tuple(outputs))


AR_METHOD = "AR: transformers generate"


def run_bench(adapter: Any, examples: Sequence[Example], methods: Sequence[tuple[str, Any]], gen_length: int, *,
              progress: bool = False, cost_model: str | None = None) -> list[Row]:
    """Measure each ``(name, decoder)`` of ``methods`` on ``examples``, in order; a ``None`` decoder is the AR
    baseline (:func:`ar_method`). Returns one :class:`Row` per method."""
    rows = []
    for name, decoder in methods:
        method = ar_method(adapter, gen_length) if decoder is None else decoder_method(decoder, adapter, gen_length)
        rows.append(measure(name, method, adapter, examples, progress=progress, cost_model=cost_model))
    return rows


def table(rows: Sequence[Row], baseline: str, cost_model: str | None = None) -> str:
    """A plain-text table with wall-time and forward ratios to ``baseline`` (and estimated GPU tokens/s)."""
    base = next(r for r in rows if r.method == baseline)
    head = f"{'method':<44} {'acc':>6} {'forwards':>9} {'tok/fwd':>8} {'wall s':>8} {'speed-up':>9} {'fwd ratio':>9}"
    if cost_model:
        head += f" {'est. tok/s ' + cost_model:>26} {'est. speed-up':>13}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r.method:<44} {r.accuracy:>6.1%} {r.forwards:>9d} {r.tokens_per_forward:>8.2f} {r.seconds:>8.2f} "
                f"{base.seconds / r.seconds:>8.2f}x {base.forwards / r.forwards:>8.2f}x")
        if cost_model and r.gpu_seconds:
            line += f" {r.tokens / r.gpu_seconds:>26.0f} {base.gpu_seconds / r.gpu_seconds:>12.2f}x"
        lines.append(line)
    return "\n".join(lines)
