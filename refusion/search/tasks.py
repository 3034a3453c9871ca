"""Task sets a sweep evaluates on: the shipped held-out tasks or a JSON Lines file of prompt/answer pairs.

A task set is a fixed, ordered tuple of :class:`~refusion.training.tasks.Example`
(scored by exact match after stripping whitespace); every decoder and the AR
baseline see the same prompts in the same order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from refusion.errors import ConfigError
from refusion.training.tasks import Example, held_out

HELD_OUT = "held-out"


@attrs.frozen
class TaskSet:
    """``name`` (how it was asked for) and its ``examples``."""

    name: str
    examples: tuple[Example, ...]

    def __attrs_post_init__(self) -> None:
        if not self.examples:
            raise ConfigError(f"`tasks` {self.name!r} holds no examples.", param='tasks')


def load_tasks(spec: Any) -> Any:
    """``"held-out"`` / ``"held-out:N"`` (N held-out examples per shipped task, default 10), a ``.jsonl`` path,
    or ``"lm-eval:TASK[,TASK]"`` (a :class:`~refusion.search.harness.HarnessTasks`); task-set objects pass through."""
    if not isinstance(spec, str):
        return spec
    if spec.startswith("lm-eval:"):
        from refusion.search.harness import parse_harness

        return parse_harness(spec)
    if spec == HELD_OUT or spec.startswith(HELD_OUT + ":"):
        count = spec.partition(":")[2] or "10"
        if not count.isdigit() or int(count) < 1:
            raise ConfigError(f"`tasks` {spec!r}: the count after `held-out:` must be an integer >= 1.", param='tasks')
        return TaskSet(spec, tuple(held_out(int(count))))
    if spec.endswith(".jsonl"):
        return TaskSet(spec, read_jsonl(spec))
    raise ConfigError(f"`tasks` must be held-out, held-out:N, a .jsonl file of prompt/answer pairs or "
                      f"lm-eval:TASK[,TASK]; got {spec!r}.", param='tasks')


def read_jsonl(path: str | Path) -> tuple[Example, ...]:
    """Examples from a JSON Lines file: one object per line with text fields ``prompt`` and ``answer``
    (optional ``task``); blank lines are skipped. A malformed line is an error naming its number."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"`tasks` file {str(path)!r} cannot be read: {exc.strerror}.", param='tasks') from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"`tasks` file {str(path)!r}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON ({exc.msg}).") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{where}: expected an object with `prompt` and `answer`; got {type(record).__name__}.")
        for field in ("prompt", "answer"):
            if not isinstance(record.get(field), str):
                raise ConfigError(f"{where}: field `{field}` must be text; got {record.get(field)!r}.")
        out.append(Example(str(record.get("task", "jsonl")), record["prompt"], record["answer"]))
    return tuple(out)
