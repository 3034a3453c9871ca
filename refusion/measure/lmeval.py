"""An lm-evaluation-harness model type that generates with any refusion strategy.

Importing this module registers the model type ``refusion`` with
EleutherAI's lm-evaluation-harness (``pip install refusion[eval]``)::

    import refusion.measure.lmeval
    refusion.measure.lmeval.evaluate(["gsm8k"], model_args="pretrained=PATH,preset=gsm8k")

or ``refusion eval --tasks gsm8k --model-args pretrained=PATH,preset=gsm8k``.
``model_args`` take ``pretrained`` (a checkpoint directory; default: the
shipped model), ``preset``, ``gen_length``, ``batch_size`` (a positive
integer), ``device``, ``dtype``, part names (``selector=topk``) and any part
or decoder parameter (``k=2``, ``temperature=0.7``). Generation tasks decode
with the chosen strategy; log-likelihood tasks use the model as a causal LM
(causal models only). With lm-eval's ``apply_chat_template`` the prompts go
through the tokenizer's chat template.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval fills its registry lazily only while it is empty: fill it first)
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from refusion.api import build_decoder, load_model
from refusion.config.params import parse_value
from refusion.config.spec import DEFAULT_GEN_LENGTH
from refusion.errors import ConfigError
from refusion.models.checks import torch_dtype
from refusion.prompts import encode_prompt


def _parse(value: Any) -> Any:
    return parse_value(value) if isinstance(value, str) else value


@register_model("refusion")
class RefusionLM(LM):
    """lm-eval ``LM`` backed by refusion's decoder.

    Task texts are encoded with ``allow_special=True``: they come from the
    harness's task definitions (not from an untrusted user), and lm-eval's own
    Hugging Face model reads special-token text in them as special ids, so
    scores stay comparable.
    """

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
        self.model: Any = load_model(pretrained, **kwargs)  # an adapter of a transformers network (`.model`)
        self.decoder, self.preset_length = build_decoder(
            self.model, preset=preset, **{k: _parse(v) for k, v in options.items()}
        )
        self.gen_length = None if gen_length is None else int(gen_length)
        self.batch_size = batch_size_of(batch_size)
        self.chat = chat
        self.source = pretrained
        #: every generated text, in request order (a record hashes them)
        self.outputs: list[str] = []

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
            jobs.append((self.decoder.fit_length(int(wanted or DEFAULT_GEN_LENGTH)), index, context, gen_kwargs, until))
        out: list[str] = [""] * len(jobs)
        jobs.sort(key=lambda job: job[0])
        for start in range(0, len(jobs), self.batch_size):
            chunk = jobs[start : start + self.batch_size]
            for length in sorted({job[0] for job in chunk}):
                same = [job for job in chunk if job[0] == length]
                ids = [encode_prompt(job[2], self.model.tokenizer, self.chat, allow_special=True) for job in same]
                for job, result in zip(same, self.decoder.decode_batch(self.model, ids, length)):
                    text = result.text or ""
                    for stop in job[4]:
                        if stop and stop in text:
                            text = text[: text.index(stop)]
                    out[job[1]] = text
                    self.cache_hook.add_partial("generate_until", (job[2], job[3]), text)
        self.outputs.extend(out)
        return out

    @property
    def tokenizer_name(self) -> str:
        """The tokenizer's name (lm-eval keys its request cache on it when prompts go through the chat template)."""
        return str(getattr(self.model.tokenizer, "name_or_path", None) or self.source or "refusion-default")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The tokenizer's chat template (lm-eval records it with the results)."""
        return getattr(self.model.tokenizer, "chat_template", None) if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """``chat_history`` as one prompt text through the tokenizer's chat template (lm-eval's
        ``apply_chat_template``); a tokenizer without a template is a :class:`ConfigError`."""
        from refusion.prompts import check_chat

        check_chat(self.model.tokenizer)
        return self.model.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

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
            ctx = encode_prompt(context, tok, False, allow_special=True)
            cont = encode_prompt(continuation, tok, False, allow_special=True)
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
            ids = encode_prompt(text, tok, False, allow_special=True)
            first = tok.decode(ids[:1])
            rest = tok.decode(ids[1:])
            if not ids[1:]:
                raise ConfigError("loglikelihood_rolling needs a text of at least two tokens.")
            ((ll, _),) = self.loglikelihood([SimpleNamespace(args=(first, rest))])
            results.append(ll)
        return results


def batch_size_of(value: Any) -> int:
    """``batch_size`` of ``model_args`` as a positive integer; lm-eval's ``auto`` (find the largest batch that fits
    the device) is refused rather than silently read as 1."""
    text = str(value).strip()
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise ConfigError(
            f"`batch_size` must be a positive integer (prompts decoded together); got {value!r}. "
            "refusion has no automatic batch size: give a number such as 8.",
            param="batch_size",
        )
    return int(text)


def evaluate(
    tasks: Sequence[str],
    *,
    model_args: str = "",
    include_path: str | None = None,
    limit: int | None = None,
    output_path: str | None = None,
    **kwargs: Any,
) -> dict:
    """Run lm-evaluation-harness ``tasks`` with the ``refusion`` model type; return its results dict.

    ``kwargs`` are ``lm_eval.simple_evaluate``'s (``num_fewshot``,
    ``apply_chat_template``, ``log_samples``, seeds, ...). With
    ``output_path`` lm-eval's own tracker writes the results JSON there (and
    each task's samples with ``log_samples``), as ``lm_eval --output_path``
    does. The dict also holds ``"refusion_record"``: the reproducible record of
    the run (:func:`evaluate_with_record`).
    """
    tracker = None
    if output_path is not None:
        from lm_eval.loggers import EvaluationTracker

        tracker = EvaluationTracker(output_path=output_path)
    results, record = evaluate_with_record(
        tasks, model_args=model_args, include_path=include_path, limit=limit, evaluation_tracker=tracker, **kwargs
    )
    samples = results.pop("samples", None)
    if tracker is not None:
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in results.get("configs", {}) if samples else ():
            tracker.save_results_samples(task_name=task, samples=samples[task])
    results["refusion_record"] = record
    return results


def make_tables(results: dict) -> str:
    """lm-eval's results table (and its groups table, when the tasks form groups), as ``lm_eval`` prints them."""
    from lm_eval.utils import make_table

    tables = [make_table(results)]
    if results.get("groups"):
        tables.append(make_table(results, "groups"))
    return "\n".join(tables)


@contextlib.contextmanager
def quiet_git() -> Iterator[None]:
    """While lm-eval runs, its ``git describe`` (the commit of the current directory, for its results) writes
    nothing to stderr: outside a git checkout git's "fatal: not a git repository" is noise, not an error."""
    import lm_eval.evaluator as evaluator

    def commit() -> str | None:
        try:
            found = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return found.stdout.strip() or None if found.returncode == 0 else None

    original = evaluator.get_git_commit_hash
    evaluator.get_git_commit_hash = commit
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


#: lm-eval's seeds, recorded with every eval run (its own defaults unless given)
EVAL_SEEDS = {"random_seed": 0, "numpy_random_seed": 1234, "torch_random_seed": 1234, "fewshot_random_seed": 1234}


def evaluate_with_record(
    tasks: Sequence[str],
    *,
    model_args: str = "",
    include_path: str | None = None,
    limit: int | None = None,
    **kwargs: Any,
) -> tuple[dict, dict]:
    """:func:`evaluate`'s lm-eval results and the run's record (:func:`refusion.measure.records.eval_record`):
    environment, decoder spec, settings and a sha256 of every generated text, for ``refusion reproduce``."""
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    from refusion.engines import choose_engine
    from refusion.measure.records import environment, eval_record

    seeds = {**EVAL_SEEDS, **{k: kwargs.pop(k) for k in EVAL_SEEDS if k in kwargs}}
    manager = TaskManager(include_path=include_path) if include_path else None
    lm = get_model("refusion").create_from_arg_string(model_args, {})
    with quiet_git():
        results = lm_eval.simple_evaluate(
            model=lm, tasks=list(tasks), limit=limit, task_manager=manager, **seeds, **kwargs
        )
    settings = {
        "tasks": list(tasks),
        "model_args": model_args,
        "include_path": include_path,
        "limit": limit,
        "num_fewshot": kwargs.get("num_fewshot"),
        "apply_chat_template": bool(kwargs.get("apply_chat_template")),
        **seeds,
    }
    env = environment(lm.model, engine=choose_engine(lm.model, lm.decoder).name, seeds=[lm.decoder.seed])
    record = eval_record(results["results"], lm.decoder, settings, env, lm.outputs)
    return results, record
