"""Task sets a sweep evaluates on: the shipped held-out tasks or a JSON Lines file of prompt/answer pairs.

A task set is a fixed, ordered tuple of :class:`~refusion.training.tasks.Example`
(scored by exact match after stripping whitespace); every decoder and the AR
baseline see the same prompts in the same order. :func:`check_examples` checks
a task set against the model before any trial: every character known to the
tokenizer and every prompt with room for the generation, else a
:class:`ConfigError` naming the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from refusion.errors import ConfigError
from refusion.files import read_json_lines, where
from refusion.limits import MAX_EXAMPLES, MAX_PER_TASK, check_room
from refusion.training.tasks import Example, held_out

HELD_OUT = "held-out"
#: the fields of a task file's line
FIELDS = ("prompt", "answer", "task")


@attrs.frozen
class TaskSet:
    """``name`` (how it was asked for), its ``examples`` and, for a file, each example's ``lines`` number."""

    name: str
    examples: tuple[Example, ...]
    lines: tuple[int, ...] = ()

    def __attrs_post_init__(self) -> None:
        if not self.examples:
            raise ConfigError(f"`tasks` {self.name!r} holds no examples.", param="tasks")

    def place(self, index: int) -> str:
        """How an error names example ``index``: its file and line, or its place in the held-out set."""
        if self.lines:
            return where("`tasks` file", self.name, self.lines[index])
        return f"`tasks` {self.name!r}, example {index}"


def load_tasks(spec: Any) -> Any:
    """``"held-out"`` / ``"held-out:N"`` (N held-out examples per shipped task, 1 to 1000, default 10), a ``.jsonl``
    path, or ``"lm-eval:TASK[,TASK]"`` (a :class:`~refusion.sweep.harness.HarnessTasks`); task-set objects pass
    through."""
    if not isinstance(spec, str):
        if not hasattr(spec, "examples") or not hasattr(spec, "name"):
            raise ConfigError(
                f"`tasks` must be a task-set name or a TaskSet; got {type(spec).__name__}.", param="tasks"
            )
        return spec
    if spec.startswith("lm-eval:"):
        from refusion.sweep.harness import parse_harness

        return parse_harness(spec)
    if spec == HELD_OUT or spec.startswith(HELD_OUT + ":"):
        count = spec.partition(":")[2] or "10"
        if (
            not count.isascii()
            or not count.isdigit()
            or len(count) > len(str(MAX_PER_TASK))
            or not 1 <= int(count) <= MAX_PER_TASK
        ):
            raise ConfigError(
                f"`tasks` {spec[:80]!r}: the count after `held-out:` must be an integer in "
                f"[1, {MAX_PER_TASK}] (examples per task).",
                param="tasks",
            )
        return TaskSet(spec, tuple(held_out(int(count))))
    if spec.endswith(".jsonl"):
        lines, examples = read_jsonl_lines(spec)
        return TaskSet(spec, examples, lines)
    raise ConfigError(
        f"`tasks` must be held-out, held-out:N, a .jsonl file of prompt/answer pairs or "
        f"lm-eval:TASK[,TASK]; got {spec!r:.200}.",
        param="tasks",
    )


def read_jsonl_lines(path: str | Path) -> tuple[tuple[int, ...], tuple[Example, ...]]:
    """The line numbers and examples of a JSON Lines file: one object per line with text fields ``prompt``
    (not empty) and ``answer`` and an optional ``task``; blank lines are skipped; at most
    :data:`~refusion.limits.MAX_EXAMPLES` lines. A malformed line is an error naming its number."""
    rows = read_json_lines(path, what="`tasks` file", param="tasks")
    if len(rows) > MAX_EXAMPLES:
        raise ConfigError(
            f"{where('`tasks` file', path)} holds {len(rows)} examples; the limit is {MAX_EXAMPLES}.", param="tasks"
        )
    lines, out = [], []
    for number, record in rows:
        place = where("`tasks` file", path, number)
        if not isinstance(record, dict):
            raise ConfigError(
                f"{place}: expected an object with `prompt` and `answer`; got {type(record).__name__}.", param="tasks"
            )
        unknown = sorted(set(record) - set(FIELDS))
        if unknown:
            raise ConfigError(
                f"{place}: unknown field(s) {', '.join(map(repr, unknown))}; fields are {', '.join(FIELDS)}.",
                param="tasks",
            )
        for field in FIELDS:
            value = record.get(field, "jsonl" if field == "task" else None)
            if not isinstance(value, str) or (field != "answer" and not value):
                raise ConfigError(
                    f"{place}: field `{field}` must be {'text' if field == 'answer' else 'non-empty text'}"
                    f"; got {value!r:.80}.",
                    param="tasks",
                )
        lines.append(number)
        out.append(Example(record.get("task", "jsonl"), record["prompt"], record["answer"]))
    return tuple(lines), tuple(out)


def check_examples(tasks: Any, adapter: Any, gen_length: int) -> None:
    """Refuse a task set the model cannot score: text it cannot encode or a prompt with no room for ``gen_length``.

    Every character of every prompt and answer must be one the tokenizer
    knows (an unknown one would be read as its unknown token, and the answer
    could never match: a silent 0%); answers must not hold a special token's
    text (decoding drops those). Task sets without examples (lm-eval) pass.
    """
    from refusion.prompts import check_encodable, special_texts, unknown_token_id

    examples = getattr(tasks, "examples", ())
    if not examples:
        return
    tokenizer = adapter.tokenizer
    place = getattr(tasks, "place", None) or (lambda index: f"`tasks` {str(tasks.name)!r}, example {index}")
    unk, specials = unknown_token_id(tokenizer), special_texts(tokenizer)
    known: dict[str, bool] = {}
    lengths = []
    for index, example in enumerate(examples):
        for field in ("prompt", "answer"):
            text = getattr(example, field)
            try:
                check_encodable(text, field)
            except ConfigError as exc:
                raise ConfigError(f"{place(index)}: {exc}", param="tasks") from None
            bad = [ch for ch in dict.fromkeys(text) if not _known(ch, tokenizer, unk, known)]
            if bad:
                raise ConfigError(
                    f"{place(index)}: field `{field}` has characters the model's tokenizer does "
                    f"not know: {', '.join(map(repr, bad[:10]))} (they would be read as its unknown "
                    "token, so no decoder could score them).",
                    param="tasks",
                )
            if field == "answer" and any(s in text for s in specials):
                raise ConfigError(
                    f"{place(index)}: field `answer` holds a special token's text, which decoded "
                    "answers never contain.",
                    param="tasks",
                )
        lengths.append(len(tokenizer(example.prompt, add_special_tokens=False)["input_ids"]))
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    check_room(adapter, lengths, gen_length, where=place(longest))


def _known(ch: str, tokenizer: Any, unk: int | None, cache: dict[str, bool]) -> bool:
    """Whether ``tokenizer`` encodes ``ch`` without its unknown token."""
    if ch not in cache:
        ids = tokenizer(ch, add_special_tokens=False)["input_ids"] if unk is not None else ()
        cache[ch] = unk not in ids
    return cache[ch]
