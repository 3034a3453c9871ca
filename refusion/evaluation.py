"""An lm-evaluation-harness model type that generates with any refusion strategy.

Importing this module registers the model type ``refusion`` with
EleutherAI's lm-evaluation-harness (``pip install refusion[eval]``)::

    import refusion.evaluation
    refusion.evaluation.evaluate(["gsm8k"], model_args="pretrained=PATH,preset=gsm8k")

or ``refusion eval --tasks gsm8k --model-args pretrained=PATH,preset=gsm8k``.
``model_args`` take ``pretrained`` (a checkpoint directory; default: the
shipped model), ``preset``, ``gen_length``, ``batch_size``, ``device``,
``dtype``, part names (``selector=topk``) and any part or decoder parameter
(``k=2``, ``temperature=0.7``). Generation tasks decode with the chosen
strategy; log-likelihood tasks use the model as a causal LM (causal models only).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from refusion.api import build_decoder, encode_prompt, load_model
from refusion.errors import ConfigError
from refusion.inputs import torch_dtype
from refusion.params import parse_value


def _parse(value: Any) -> Any:
    return parse_value(value) if isinstance(value, str) else value


@register_model("refusion")
class RefusionLM(LM):
    """lm-eval ``LM`` backed by refusion's decoder."""

    def __init__(
        self,
        pretrained: str | None = None,
        preset: str | None = None,
        gen_length: int | None = None,
        batch_size: int | str = 1,
        device: str | None = None,
        dtype: str = "auto",
        chat: bool | None = None,
        **options: Any,
    ):
        super().__init__()
        kwargs: dict[str, Any] = {"dtype": torch_dtype(dtype)}
        if device:
            kwargs["device"] = device
        self.model = load_model(pretrained, **kwargs)
        self.decoder, self.preset_length = build_decoder(
            self.model, preset=preset, **{k: _parse(v) for k, v in options.items()}
        )
        self.gen_length = None if gen_length is None else int(gen_length)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 1
        self.chat = chat

    def generate_until(self, requests) -> list[str]:
        """Decode the requests in batches; cut each text at the first of its ``until`` strings.

        The length is ``gen_length`` if given, else the task's ``max_gen_toks``
        (else the preset's), moved up to the nearest length the partitioner accepts.
        """
        jobs = []
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            wanted = self.gen_length or gen_kwargs.get("max_gen_toks") or self.preset_length
            jobs.append((self.decoder.fit_length(int(wanted)), index, context, gen_kwargs, until))
        out: list[str] = [""] * len(jobs)
        jobs.sort(key=lambda job: job[0])
        for start in range(0, len(jobs), self.batch_size):
            chunk = jobs[start : start + self.batch_size]
            for length in sorted({job[0] for job in chunk}):
                same = [job for job in chunk if job[0] == length]
                ids = [encode_prompt(job[2], self.model.tokenizer, self.chat) for job in same]
                for job, result in zip(same, self.decoder.decode_batch(self.model, ids, length)):
                    text = result.text
                    for stop in job[4]:
                        if stop and stop in text:
                            text = text[: text.index(stop)]
                    out[job[1]] = text
                    self.cache_hook.add_partial("generate_until", (job[2], job[3]), text)
        return out

    def _require_causal(self) -> None:
        if not self.model.capabilities.causal:
            raise ConfigError("log-likelihood requests need a causal model; this one is bidirectional.")

    @torch.no_grad()
    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """Sum of log p(continuation | context) and whether the continuation is the greedy one."""
        self._require_causal()
        out = []
        for request in requests:
            context, continuation = request.args
            tok = self.model.tokenizer
            ctx = encode_prompt(context, tok, False)
            cont = encode_prompt(continuation, tok, False)
            if not ctx or not cont:
                raise ConfigError("loglikelihood needs a non-empty context and continuation.")
            ids = torch.tensor([ctx + cont], device=self.model.device)
            logits = self.model.model(input_ids=ids).logits[0, len(ctx) - 1 : -1].float()
            target = torch.tensor(cont, device=logits.device)
            logp = torch.log_softmax(logits, -1).gather(-1, target[:, None]).squeeze(-1)
            out.append((float(logp.sum()), bool((logits.argmax(-1) == target).all())))
        return out

    def loglikelihood_rolling(self, requests) -> list[float]:
        self._require_causal()
        from types import SimpleNamespace

        tok = self.model.tokenizer
        results = []
        for request in requests:
            (text,) = request.args
            ids = encode_prompt(text, tok, False)
            first = tok.decode(ids[:1])
            rest = tok.decode(ids[1:])
            if not ids[1:]:
                raise ConfigError("loglikelihood_rolling needs a text of at least two tokens.")
            ((ll, _),) = self.loglikelihood([SimpleNamespace(args=(first, rest))])
            results.append(ll)
        return results


def evaluate(tasks: Sequence[str], *, model_args: str = "", include_path: str | None = None, limit: int | None = None,
             **kwargs: Any) -> dict:
    """Run lm-evaluation-harness ``tasks`` with the ``refusion`` model type; return its results dict."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path) if include_path else None
    return lm_eval.simple_evaluate(model="refusion", model_args=model_args, tasks=list(tasks), limit=limit,
                                   task_manager=manager, **kwargs)
