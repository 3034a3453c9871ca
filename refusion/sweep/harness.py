"""lm-evaluation-harness tasks as a sweep's task set, through the ``refusion`` model type
(:mod:`refusion.measure.lmeval`).

The tasks are loaded once; each point runs them with its decoder in place of
the model type's own (batch 1), and the AR baseline with transformers
``generate`` on the same requests. The score is the task's metric (``metric``,
default its first), averaged over the tasks; forwards are counted on the
network, tokens and seconds around generation. Needs ``refusion[eval]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import attrs

from refusion.errors import ConfigError
from refusion.limits import MAX_EXAMPLES
from refusion.measure.results import Result
from refusion.validators import check_integer, shown

PREFIX = "lm-eval:"


@attrs.frozen
class HarnessTasks:
    """``tasks`` (harness task names), ``limit`` examples per task, an ``include_path`` of task YAMLs, the
    ``metric``."""

    tasks: tuple[str, ...]
    limit: int | None = None
    include_path: str | None = None
    metric: str | None = None

    def __attrs_post_init__(self) -> None:
        if not self.tasks or not all(self.tasks):
            raise ConfigError(f"`tasks`: name at least one lm-evaluation-harness task after `{PREFIX}`.", param="tasks")
        if self.limit is not None:
            check_integer("limit", self.limit, 1, MAX_EXAMPLES, "examples per task")
        for name in ("include_path", "metric"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"`{name}` must be non-empty text; got {shown(value)}.", param=name)

    @property
    def name(self) -> str:
        return PREFIX + ",".join(self.tasks) + (f" (limit {self.limit})" if self.limit else "")

    @property
    def examples(self) -> tuple:
        return ()

    def task_dict(self) -> Any:
        """The harness's task objects (loaded once per sweep)."""
        try:
            from lm_eval.tasks import TaskManager
        except ImportError:
            raise ConfigError("lm-evaluation-harness tasks need `pip install 'refusion[eval]'`.") from None
        try:  # a local task needs no index of the harness's thousands of built-in tasks (slow to build)
            if self.include_path:
                try:
                    return _load(TaskManager(include_path=self.include_path, include_defaults=False), self.tasks)
                except Exception:
                    pass
            return _load(TaskManager(include_path=self.include_path), self.tasks)
        except Exception as exc:  # the harness raises KeyError/ValueError/... for unknown or broken tasks
            raise ConfigError(
                f"`tasks` {self.name!r}: lm-evaluation-harness could not load them: {exc}", param="tasks"
            ) from None


def _load(manager: Any, tasks: tuple[str, ...]) -> Any:
    import warnings

    from lm_eval.tasks import get_task_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return get_task_dict(list(tasks), manager)


def parse_harness(spec: str, **options: Any) -> HarnessTasks:
    """``"lm-eval:gsm8k,arc_easy"`` -> :class:`HarnessTasks` (``limit``, ``include_path``, ``metric`` as keywords)."""
    return HarnessTasks(tuple(t.strip() for t in spec[len(PREFIX) :].split(",")), **options)


class _CountingDecoder:
    """Stands in for the model type's decoder: decodes through ``run`` and adds up tokens and seconds."""

    def __init__(self, fit: Callable[[int], int], run: Callable[[Any, list, int], list]):
        self.fit_length, self.run, self.tokens, self.seconds = fit, run, 0, 0.0

    def decode_batch(self, model: Any, ids: list, length: int) -> list:
        start = time.perf_counter()
        results = self.run(model, ids, length)
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(r.tokens) for r in results)
        return results


def _score(results: dict, metric: str | None) -> tuple[float, int]:
    scores, count = [], 0
    for task, values in results["results"].items():
        keys = [k for k, v in values.items() if isinstance(v, (int, float)) and "," in k and "stderr" not in k]
        if metric is not None:
            keys = [k for k in keys if k.split(",")[0] == metric]
        if not keys:
            raise ConfigError(
                f"`metric` {metric!r} is not reported by task {task!r}; it reports "
                f"{', '.join(k for k in values if ',' in k and 'stderr' not in k)}.",
                param="metric",
            )
        scores.append(float(values[keys[0]]))
        count += int(results.get("n-samples", {}).get(task, {}).get("effective", 0))
    return sum(scores) / len(scores), count


def evaluate_harness(
    adapter: Any, harness: HarnessTasks, task_dict: Any, decoder: Any = None, gen_length: int = 32
) -> Result:
    """Run the tasks with ``decoder`` (or, with ``None``, AR through transformers ``generate``)."""
    import lm_eval.evaluator

    from refusion.counters import Counters, observe
    from refusion.measure.bench import ar_method
    from refusion.measure.lmeval import RefusionLM

    lm = RefusionLM(pretrained=adapter)
    lm.preset_length = gen_length
    if decoder is not None:
        counting = _CountingDecoder(decoder.fit_length, decoder.decode_batch)
    else:
        tok = adapter.tokenizer

        def ar(model: Any, ids: list, length: int) -> list:
            outs = [ar_method(adapter, length)(list(p)) for p in ids]
            return [SimpleNamespace(tokens=o, text=tok.decode(o, skip_special_tokens=True)) for o in outs]

        counting = _CountingDecoder(lambda n: n, ar)
    lm.decoder = counting  # type: ignore[assignment]  # stands in for the decoder: the same two methods
    with observe(adapter.model, Counters()) as counters:  # every forward, refusion's or generate's
        results = lm_eval.evaluator.evaluate(
            lm, task_dict, limit=harness.limit, bootstrap_iters=0, log_samples=False, verbosity="ERROR"
        )
    score, count = _score(results, harness.metric)
    return Result(
        "lm-eval",
        examples=count,
        correct=round(score * count),
        forwards=counters.forwards,
        tokens=counting.tokens,
        seconds=counting.seconds,
        score=score,
    )
