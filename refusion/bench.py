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


def ar_method(adapter: Any, gen_length: int) -> Callable[[list[int]], list[int]]:
    """Greedy AR with transformers' ``generate`` and its KV cache (mask token suppressed)."""
    eos = sorted(adapter.eos_token_ids)

    def run(prompt: list[int]) -> list[int]:
        ids = torch.tensor([prompt], device=adapter.device)
        out = adapter.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen_length, do_sample=False,
            eos_token_id=eos or None, pad_token_id=adapter.mask_token_id, suppress_tokens=[adapter.mask_token_id],
        )
        return _cut_at_eos(out[0, len(prompt):].tolist(), adapter.eos_token_ids)

    return run


def decoder_method(decoder: Any, adapter: Any, gen_length: int) -> Callable[[list[int]], list[int]]:
    """refusion's decoder with the given parts."""

    def run(prompt: list[int]) -> list[int]:
        return decoder.decode(adapter, prompt, gen_length).tokens.tolist()

    return run


def measure(
    name: str,
    method: Callable[[list[int]], list[int]],
    adapter: Any,
    examples: Sequence[Example],
    *,
    warmup: int = 3,
    progress: bool = False,
) -> Row:
    """Decode every example with ``method``; return accuracy, forwards, tokens and seconds."""
    tokenizer = adapter.tokenizer
    prompts = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    for prompt in prompts[:warmup]:
        method(prompt)
    correct, tokens, seconds = 0, 0, 0.0
    per_task: dict[str, list[int]] = {}
    with ForwardCounter(adapter.model) as counter, torch.no_grad():
        from tqdm.auto import tqdm

        for example, prompt in tqdm(list(zip(examples, prompts)), desc=name[:40], disable=not progress, leave=False):
            start = time.perf_counter()
            out = method(prompt)
            seconds += time.perf_counter() - start
            tokens += len(out)
            ok = is_correct(example, tokenizer.decode(out, skip_special_tokens=True))
            correct += ok
            per_task.setdefault(example.task, []).append(ok)
    return Row(name, len(examples), correct, counter.count, tokens, seconds,
               {task: sum(v) / len(v) for task, v in per_task.items()})


def table(rows: Sequence[Row], baseline: str) -> str:
    """A plain-text table with wall-time and forward ratios to ``baseline``."""
    base = next(r for r in rows if r.method == baseline)
    head = f"{'method':<44} {'acc':>6} {'forwards':>9} {'tok/fwd':>8} {'wall s':>8} {'speed-up':>9} {'fwd ratio':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.method:<44} {r.accuracy:>6.1%} {r.forwards:>9d} {r.tokens_per_forward:>8.2f} {r.seconds:>8.2f} "
            f"{base.seconds / r.seconds:>8.2f}x {base.forwards / r.forwards:>8.2f}x"
        )
    return "\n".join(lines)
