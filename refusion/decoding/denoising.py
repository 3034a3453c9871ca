"""The canvas-denoising loop: one prompt's decode on a model that re-decides whole canvases (DiffusionGemma).

:meth:`DenoisingSession.program` is a generator of model calls, like
:meth:`~refusion.decoding.session.DecodeSession.program`, and runs on the
``denoiser`` engine. Per canvas (the model's ``canvas_length`` positions,
a serial block of the partition):

1. the encoder appends the pending tokens (the prompt, then the previous
   canvas) to the context;
2. the canvas starts as uniformly random tokens (there is no mask token);
3. per step, ``max_denoising_steps`` at most (the options are the decoder's
   ``denoise`` infiller's: :class:`~refusion.strategies.infillers.denoise.Denoise`), with the step counted down
   from ``max_denoising_steps`` to 1: one denoiser pass (with the previous
   step's logits as self-conditioning); the logits divided by the linear
   temperature ``t_min + (t_max - t_min) * step / max_denoising_steps``; a
   draw per position from those; the decoder's **selector** decides which
   positions accept their draw (the plan holds one length-1 slot per
   position and the tempered logits; DiffusionGemma's rule is
   ``entropy-bound``); with ``renoise`` every other position becomes fresh
   noise (else it keeps its token); the canvas stops early once its argmax
   held for ``stability_threshold`` earlier steps and its mean entropy is
   below ``confidence_threshold``;
4. the canvas's argmax tokens of the last step are sealed (they are the
   answer's) and the canvas enters the context.

The draws come from the prompt's own generator in transformers'
``DiffusionGemmaForBlockDiffusion.generate`` order (the starting canvas; per
step the sampled canvas, then the noise), so with the same seed the tokens
are transformers' (``torch.manual_seed(seed)`` before its call). Every
position stays revisable until its canvas stops; sealed tokens are final.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

import torch

from refusion.decoding.checks import checked_selection, checks_answers
from refusion.decoding.protocol import Denoise, Encode, Selection
from refusion.decoding.types import DecodeResult, IterationRecord, KVBytes, Partition, Plan, answer_end
from refusion.models.denoiser import CanvasDenoiserLM
from refusion.strategies.selectors.entropy_bound import token_entropy


def temperature(step: int, t_min: float, t_max: float, steps: int, device: Any = None) -> torch.Tensor:
    """The linear schedule's temperature at ``step`` (counted down from ``steps`` to 1), as a float32 tensor
    computed as transformers' ``LinearTemperatureScheduleLogitsProcessor`` computes it."""
    remaining = torch.tensor(step, dtype=torch.int32, device=device)
    return t_min + ((t_max - t_min) * (remaining / steps))


class StableAndConfident:
    """The adaptive stop of a canvas: its argmax equals that of each of the ``stability`` previous steps (0:
    always stable) and the mean entropy of its tempered logits is below ``confidence``."""

    def __init__(self, stability: int, confidence: float):
        self.stability = stability
        self.confidence = confidence
        self.history: list[torch.Tensor] = []

    def __call__(self, argmax: torch.Tensor, logits: torch.Tensor) -> bool:
        stable = len(self.history) == self.stability and all(torch.equal(h, argmax) for h in self.history)
        if self.stability:
            self.history = [*self.history, argmax][-self.stability :]
        confident = bool(token_entropy(logits).mean(dim=-1) < self.confidence)
        return stable and confident


class DenoisingSession:
    """One prompt's decode on a canvas-denoising model: its engine state, canvases and records.

    The same surface as :class:`~refusion.decoding.session.DecodeSession`
    for runners, generators and streams: ``tokens`` (sealed ones are final),
    ``sealed``, ``committed`` (per denoising step, the slots it sealed: a
    canvas's slots at its last step), ``records`` (with ``record``),
    :meth:`program` and :meth:`run`.
    """

    def __init__(
        self,
        decoder: Any,
        model: CanvasDenoiserLM,
        state: Any,
        partition: Partition,
        seed: int = 0,
        *,
        engine: Any = None,
        record: bool = False,
    ):
        self.decoder = decoder
        self.model = model
        self.state = state
        self.engine = engine
        self.partition = partition
        self.prompt_len = state.prompt_length
        g = partition.gen_length
        self.tokens = torch.full((g,), model.mask_token_id, dtype=torch.long)
        self.commit_step = torch.full((g,), -1, dtype=torch.long)
        self.sealed = torch.zeros(g, dtype=torch.bool)
        self.eos_offset: int | None = None
        self.record = record
        self.committed: list[tuple[tuple[int, int], ...]] = []
        self.records: list[IterationRecord] = []
        self.rng = torch.Generator(device=model.device).manual_seed(seed)
        self.memory: dict = {}
        self._checked = checks_answers(decoder.selector)

    @property
    def cache(self) -> Any:
        """The sequence's encoder cache (a transformers ``Cache``)."""
        return self.state.cache

    @property
    def forwards(self) -> int:
        """Encoder and denoiser forwards that served this sequence so far."""
        return self.state.counters.forwards

    def run(self) -> DecodeResult:
        """Run :meth:`program` to the end on the session's engine."""
        from refusion.decoding.loop import drive

        return drive(self.engine, [self])[0]

    def program(self) -> Generator[Encode | Denoise | Selection, Any, DecodeResult]:
        d = self.decoder
        pending = self.state.prompt
        for block_index, block in enumerate(self.partition.blocks):
            since = (time.perf_counter(), self.forwards, len(self.state.counters.fed_log))  # the encoder's forward
            yield Encode(pending)  # counts in the canvas's first step
            slots = tuple(self.partition.slots[i] for i in block)
            first, stop = slots[0].offset, slots[-1].stop
            argmax = yield from self._denoise(slots, block_index, since)
            self.tokens[first:stop] = argmax[: stop - first]
            self.commit_step[first:stop] = len(self.committed) - 1
            self.sealed[first:stop] = True
            self.committed[-1] = tuple((s.index, 1) for s in slots)
            if self.records:
                self.records[-1] = _evolve(self.records[-1], committed=self.committed[-1])
            pending = argmax
            if self._eos(first, stop) and d.stop_at_eos is not False:
                break
        return self._result()

    def _denoise(
        self, slots: tuple, block_index: int, since: tuple
    ) -> Generator[Denoise | Selection, Any, torch.Tensor]:
        """Denoise one canvas to its stop; returns the argmax canvas of the last step (1-D, on the host).
        ``since``: (clock, forwards, fed entries) where the canvas's first record starts (before its encoding)."""
        d, model, g = self.decoder, self.model, self.rng
        o = d.infiller  # the `denoise` infiller: the loop's options
        length, vocab, device = model.canvas_length, model.vocab_size, model.device
        canvas = torch.randint(0, vocab, (1, length), generator=g, device=device)[0]
        conditioning = None
        stop = StableAndConfident(o.stability_threshold, o.confidence_threshold)
        positions = torch.arange(length) + self.prompt_len + slots[0].offset
        argmax = canvas
        for step in reversed(range(1, o.max_denoising_steps + 1)):
            started, forwards, logged = since
            (logits,) = yield Denoise(canvas, conditioning)
            logits = logits / temperature(step, o.t_min, o.t_max, o.max_denoising_steps, device)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            drawn = torch.multinomial(probs, num_samples=1, generator=g).squeeze(-1)
            argmax = torch.argmax(logits, dim=-1)
            plan = Plan.from_logits(slots, positions, logits, g)
            chosen = yield Selection(d.selector, plan)
            chosen = checked_selection(d.selector, plan, chosen) if self._checked else tuple(sorted(chosen))
            accepted = torch.zeros(length, dtype=torch.bool, device=device)
            accepted[list(chosen)] = True
            canvas = torch.where(accepted, drawn, canvas)
            if o.renoise:
                noise = torch.randint(0, vocab, (1, length), generator=g, device=device)[0]
                canvas = torch.where(accepted, canvas, noise)
            finished = stop(argmax, logits)
            conditioning = logits.to(model.embedding_dtype)
            self.committed.append(())
            if self.record:
                self.records.append(
                    IterationRecord(
                        iteration=len(self.committed) - 1,
                        block=block_index,
                        planned=tuple(s.index for s in slots),
                        selected=tuple(slots[i].index for i in chosen),
                        committed=(),
                        forwards=self.forwards - forwards,
                        drafted=tuple(s.index for s in slots),
                        fed_tokens=tuple(self.state.counters.fed_log[logged:]),
                        seconds=time.perf_counter() - started,
                    )
                )
            if finished:
                break
            since = (time.perf_counter(), self.forwards, len(self.state.counters.fed_log))  # the next step's start
        return argmax.cpu()

    def _eos(self, first: int, stop: int) -> bool:
        """Note the earliest EOS of the sealed canvas ``first:stop``; True when it has one."""
        eos = self.model.eos_token_ids
        if not eos or self.eos_offset is not None:
            return self.eos_offset is not None
        hits = torch.isin(self.tokens[first:stop], torch.tensor(sorted(eos))).nonzero()
        if len(hits):
            self.eos_offset = first + int(hits[0])
        return self.eos_offset is not None

    def _result(self) -> DecodeResult:
        end, stopped = answer_end(self.partition, self.eos_offset)
        counters = self.state.counters
        return DecodeResult(
            tokens=self.tokens[:end].clone(),
            prompt_length=self.prompt_len,
            partition=self.partition,
            commit_step=self.commit_step,
            forwards=self.forwards,
            stopped_at_eos=stopped,
            num_iterations=len(self.committed),
            iterations=tuple(self.records),
            region_tokens=[int(t) if s >= 0 else -1 for t, s in zip(self.tokens.tolist(), self.commit_step.tolist())],
            engine=getattr(self.engine, "name", None),
            fed_tokens=counters.fed_tokens,
            kv_bytes=KVBytes(counters.kv_context_bytes, counters.kv_new_bytes),
        )


def _evolve(record: IterationRecord, **changes: Any) -> IterationRecord:
    import attrs

    return attrs.evolve(record, **changes)
