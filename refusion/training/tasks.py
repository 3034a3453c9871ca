"""Synthetic instruction tasks with answers computed by code, so every answer can be checked.

The mix is chosen so that some answers decode well in parallel (``copy``,
``repeat``, ``reverse``: each output character depends on the prompt only) and
some do not (``add``: each digit depends on the carry from the digit before
it; ``sort`` and ``count`` need the whole input). Prompts look like ``"rev abc="``; answers are plain
character strings.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Iterator

import attrs

from refusion.errors import ConfigError
from refusion.limits import MAX_PER_TASK
from refusion.validators import is_integer

LETTERS = string.ascii_lowercase


@attrs.frozen
class Example:
    """One task instance: ``prompt`` (ends with ``=``) and the exact expected ``answer``."""

    task: str
    prompt: str
    answer: str


def _word(rng: random.Random, low: int, high: int, alphabet: str = LETTERS) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def add(rng: random.Random) -> Example:
    """Sum of two numbers below 1000, written least-significant digit first (carries flow in decoding order)."""
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    return Example("add", f"add {a}+{b}=", str(a + b)[::-1])


def sort(rng: random.Random) -> Example:
    w = _word(rng, 3, 10)
    return Example("sort", f"sort {w}=", "".join(sorted(w)))


def reverse(rng: random.Random) -> Example:
    w = _word(rng, 3, 16)
    return Example("reverse", f"rev {w}=", w[::-1])


def copy(rng: random.Random) -> Example:
    w = _word(rng, 3, 20)
    return Example("copy", f"copy {w}=", w)


def count(rng: random.Random) -> Example:
    w = _word(rng, 3, 8, "abcd")
    c = rng.choice("abcd")
    return Example("count", f"count {c}:{w}=", str(w.count(c)))


def repeat(rng: random.Random) -> Example:
    w = _word(rng, 2, 5)
    k = rng.randint(2, 4)
    return Example("repeat", f"rep {k} {w}=", w * k)


TASKS: dict[str, Callable[[random.Random], Example]] = {
    "add": add,
    "sort": sort,
    "reverse": reverse,
    "copy": copy,
    "count": count,
    "repeat": repeat,
}

#: Longest answer any task produces (copy of 20 letters; repeat 4 x 5).
MAX_ANSWER = 20


def examples(seed: int, tasks: tuple[str, ...] = tuple(TASKS)) -> Iterator[Example]:
    """An endless, reproducible stream of examples, tasks drawn uniformly."""
    rng = random.Random(seed)
    while True:
        yield TASKS[rng.choice(tasks)](rng)


def held_out(n: int, seed: int = 10_000, tasks: tuple[str, ...] = tuple(TASKS)) -> list[Example]:
    """``n`` examples per task (1 to :data:`MAX_PER_TASK`) from a seed the trainer never uses (training seeds are
    < 10_000); another ``n`` is a :class:`~refusion.errors.ConfigError` naming ``per_task``."""
    if not is_integer(n) or not 1 <= n <= MAX_PER_TASK:
        raise ConfigError(
            f"`per_task` (held-out examples per task) must be an integer in [1, {MAX_PER_TASK}]; got {n!r:.80}.",
            param="per_task",
        )
    unknown = [t for t in tasks if not isinstance(t, str) or t not in TASKS]
    if unknown or not tasks:
        raise ConfigError(
            f"`tasks` must name shipped tasks ({', '.join(TASKS)}); got {list(tasks)!r:.80}.", param="tasks"
        )
    rng = random.Random(seed)
    return [TASKS[t](rng) for t in tasks for _ in range(n)]


def is_correct(example: Example, output: str) -> bool:
    """Exact match of the decoded answer (surrounding whitespace ignored)."""
    return output.strip() == example.answer
