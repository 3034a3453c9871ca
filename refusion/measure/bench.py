"""Measuring decoders side by side on the synthetic held-out tasks.

Every method decodes the same examples one at a time (batch 1) on the same
model; the clock runs around decoding only (tokenisation and scoring
excluded) after a warm-up. Forwards are counted in one
:class:`~refusion.counters.Counters` per method: the engine's for
refusion's decoders, a hook on the network's backbone for transformers'
``generate`` (both count one per network forward).
Tokens are the generated tokens up to and including the first EOS; prompt
tokens are never counted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from refusion.counters import Counters, observe
from refusion.errors import ConfigError
from refusion.limits import MAX_EXAMPLES, MAX_GEN_LENGTH, check_room
from refusion.measure.results import Result
from refusion.training.tasks import Example, is_correct
from refusion.validators import check_integer


def _cut_at_eos(ids: list[int], eos: frozenset[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


class Method:
    """A way to decode one prompt, callable as ``method(prompt) -> tokens``, and the :class:`Counters` its
    forwards are counted in (an engine's for refusion's decoders, a network hook's for ``generate``)."""

    def __init__(
        self, run: Callable[[list[int]], list[int]], counters: Counters, recording: Callable[[], Any] | None = None
    ):
        self.run = run
        self.counters = counters
        self._recording = recording

    def __call__(self, prompt: list[int]) -> list[int]:
        return self.run(prompt)

    def recording(self) -> Any:
        """A context in which :attr:`counters` record the forwards' shapes for the cost model."""
        return self._recording() if self._recording is not None else _recording(self.counters)


@contextlib.contextmanager
def _recording(counters: Counters) -> Iterator[Counters]:
    counters.record()
    try:
        yield counters
    finally:
        counters.record(False)


def ar_method(adapter: Any, gen_length: int) -> Method:
    """Greedy AR with transformers' ``generate`` and its KV cache (mask token suppressed); forwards counted by a
    hook on the network, shapes (for the cost model) from :func:`~refusion.measure.costmodel.autoregressive`."""
    from refusion.measure.costmodel import autoregressive

    eos = sorted(adapter.eos_token_ids)
    counters = Counters()

    def run(prompt: list[int]) -> list[int]:
        ids = torch.tensor([prompt], device=adapter.device)
        with observe(adapter.model, counters):
            out = adapter.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=gen_length,
                do_sample=False,
                eos_token_id=eos or None,
                pad_token_id=adapter.mask_token_id,
                suppress_tokens=[adapter.mask_token_id],
            )
        tokens = _cut_at_eos(out[0, len(prompt) :].tolist(), adapter.eos_token_ids)
        if counters.shapes is not None:
            forwards, heads = autoregressive([len(prompt)], len(tokens))
            counters.shapes.extend(forwards)
            if counters.head_rows is not None:
                counters.head_rows.extend(heads)
        return tokens

    return Method(run, counters)


def decoder_method(decoder: Any, adapter: Any, gen_length: int) -> Method:
    """refusion's decoder with the given parts, on one engine kept for all prompts (its counters count)."""
    from refusion.engines import open_engine
    from refusion.measure.costmodel import recording

    engine = open_engine(adapter, decoder)

    def run(prompt: list[int]) -> list[int]:
        return decoder.decode(adapter, prompt, gen_length, engine=engine).tokens.tolist()

    return Method(run, engine.counters, lambda: recording(engine))  # the head's passes are recorded too


def measure(
    name: str,
    method: Method,
    adapter: Any,
    examples: Sequence[Example],
    *,
    warmup: int = 3,
    progress: bool = False,
    cost_model: str | None = None,
) -> Result:
    """Decode every example with ``method``; return accuracy, forwards, tokens and seconds.

    ``cost_model`` (e.g. ``"qwen3-8b@h100"``) also estimates the time the same
    forwards would take on that GPU at that model size (:mod:`refusion.measure.costmodel`).
    ``warmup`` (0 to :data:`~refusion.limits.MAX_EXAMPLES`) prompts are decoded first, untimed;
    at most ``MAX_EXAMPLES`` examples.
    """
    check_integer("warmup", warmup, 0, MAX_EXAMPLES, "prompts decoded before timing")
    _check_examples(examples)
    if cost_model is not None:
        from refusion.measure.costmodel import parse

        parse(cost_model)
    tokenizer = adapter.tokenizer
    prompts = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    for prompt in prompts[:warmup]:
        method(prompt)
    correct, tokens, seconds = 0, 0, 0.0
    outputs: list[tuple[int, ...]] = []
    per_task: dict[str, list[int]] = {}
    counters = method.counters
    forwards = counters.forwards
    with method.recording() if cost_model is not None else contextlib.nullcontext(), torch.no_grad():
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
        if cost_model is not None:
            from refusion.measure.costmodel import counted_seconds, parse

            gpu = counted_seconds(counters, *parse(cost_model))
    return Result(
        name,
        len(examples),
        correct,
        counters.forwards - forwards,
        tokens,
        seconds,
        per_task={task: sum(v) / len(v) for task, v in per_task.items()},
        gpu_seconds=gpu,
        outputs=tuple(outputs),
    )


AR_METHOD = "AR: transformers generate"


def _check_examples(examples: Sequence[Example]) -> None:
    if len(examples) > MAX_EXAMPLES:
        raise ConfigError(
            f"`examples`: {len(examples)} examples asked for; the limit is {MAX_EXAMPLES}.", param="examples"
        )


def run_bench(
    adapter: Any,
    examples: Sequence[Example],
    methods: Sequence[tuple[str, Any]],
    gen_length: int,
    *,
    progress: bool = False,
    cost_model: str | None = None,
) -> list[Result]:
    """Measure each ``(name, decoder)`` of ``methods`` on ``examples``, in order; a ``None`` decoder is the AR
    baseline (:func:`ar_method`). Returns one :class:`~refusion.measure.results.Result` per method.

    Checked before anything decodes: ``gen_length`` in [1, 65,536] and, after the longest prompt, within the
    model's positions; at most :data:`~refusion.limits.MAX_EXAMPLES` examples; ``cost_model``."""
    check_integer("gen_length", gen_length, 1, MAX_GEN_LENGTH, "tokens generated per prompt")
    _check_examples(examples)
    if cost_model is not None:
        from refusion.measure.costmodel import parse

        parse(cost_model)
    if adapter.tokenizer is not None and examples:
        lengths = [len(adapter.tokenizer(e.prompt, add_special_tokens=False)["input_ids"]) for e in examples]
        check_room(adapter, lengths, gen_length, where="the examples")
    rows = []
    for name, decoder in methods:
        method = ar_method(adapter, gen_length) if decoder is None else decoder_method(decoder, adapter, gen_length)
        rows.append(measure(name, method, adapter, examples, progress=progress, cost_model=cost_model))
    return rows


def aups(rows: Sequence[Result], baseline: str) -> list[float | None]:
    """Each row's AUP (:mod:`refusion.measure.aup`, d3LLM's accuracy under parallelism), on the curve from the
    ``baseline`` row's point (tokens per forward, accuracy: AR's one token per forward on the same model, the
    least parallel point of every d3LLM curve) to the row's own point; the baseline's own is its single point.
    ``y_max`` is the best accuracy of every row. ``None`` where the row's accuracy is more than 5 points below the
    baseline's: AUP's authors refuse such a curve (and an accuracy of 0 everywhere has no AUP)."""
    from refusion.measure.aup import aup, best_accuracy

    base = next(r for r in rows if r.method == baseline)
    curves = [
        [(base.tokens_per_forward, 100 * base.accuracy)]
        + ([] if r is base else [(r.tokens_per_forward, 100 * r.accuracy)])
        for r in rows
    ]
    y_max = best_accuracy(curves)
    out: list[float | None] = []
    for curve in curves:
        try:
            out.append(aup(curve, y_max, strict=True))
        except ConfigError:
            out.append(None)
    return out


def table(rows: Sequence[Result], baseline: str, cost_model: str | None = None) -> str:
    """A plain-text table with wall-time and forward ratios to ``baseline``, each row's AUP (:func:`aups`) and, with
    ``cost_model``, estimated GPU tokens/s."""
    base = next(r for r in rows if r.method == baseline)
    head = (
        f"{'method':<44} {'acc':>6} {'forwards':>9} {'tok/fwd':>8} {'AUP':>7} {'wall s':>8} {'speed-up':>9} "
        f"{'fwd ratio':>9}"
    )
    if cost_model:
        head += f" {'est. tok/s ' + cost_model:>26} {'est. speed-up':>13}"
    lines = [head, "-" * len(head)]
    for r, score in zip(rows, aups(rows, baseline)):
        shown = "-" if score is None else f"{score:.1f}"
        line = (
            f"{r.method:<44} {r.accuracy:>6.1%} {r.forwards:>9d} {r.tokens_per_forward:>8.2f} {shown:>7} "
            f"{r.seconds:>8.2f} "
            f"{base.seconds / r.seconds:>8.2f}x {base.forwards / r.forwards:>8.2f}x"
        )
        if cost_model and r.gpu_seconds and base.gpu_seconds:
            line += f" {r.tokens / r.gpu_seconds:>26.0f} {base.gpu_seconds / r.gpu_seconds:>12.2f}x"
        lines.append(line)
    return "\n".join(lines)
