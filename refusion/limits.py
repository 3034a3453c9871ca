"""Range checks and limits for the numeric options of measurement runs (bench, sweep, reproduce, eval, train).

Each check returns the value or raises :class:`~refusion.errors.ConfigError`
naming the parameter, the value and the allowed range, so that a command
refuses bad input before it loads a model or creates a study. The limits are
stated here once; a run larger than them is refused, never started.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from refusion.errors import ConfigError

#: tokens generated per prompt, whatever the model's positions (those are checked too, once it is loaded)
MAX_GEN_LENGTH = 65_536
#: examples of a task set (a JSON Lines file, lm-evaluation-harness ``limit``, a bench record's task set)
MAX_EXAMPLES = 100_000
#: trials of a sweep's study, and points of a grid search
MAX_TRIALS = 100_000
#: a sweep's time budget in minutes (30 days)
MAX_MINUTES = 43_200
#: torch threads a record may ask for
MAX_THREADS = 4096
#: seeds of samplers and of training (numpy's range)
SEED_LIMIT = 2**32


def shown(value: Any, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters; an integer too long to print is described by its size."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4300 digits
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    return text if len(text) <= width else text[: width - 3] + "..."


def integer(param: str, value: Any, low: int, high: int | None = None, why: str = "") -> int:
    """``value`` if it is an integer (not a bool) in ``[low, high]``; ``why`` explains ``high``."""
    reason = f" ({why})" if why else ""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        upto = f" (allowed: {low} to {high}{', ' + why if why else ''})" if high is not None else reason
        raise ConfigError(f"`{param}` must be an integer >= {low}; got {shown(value)}{upto}.", param=param)
    if high is not None and value > high:
        raise ConfigError(f"`{param}` must be an integer <= {high}{reason}; got {shown(value)} (allowed: {low} to "
                          f"{high}).", param=param)
    return value


def number(param: str, value: Any, low: float, high: float | None = None, *, low_open: bool = False) -> float:
    """``value`` if it is a finite int or float in ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and (
        value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        bounds = f"{'(' if low_open else '['}{low}, {high}]" if high is not None else f"{'>' if low_open else '>='} {low}"
        allowed = f"in {bounds}" if high is not None else bounds
        raise ConfigError(f"`{param}` must be a finite number {allowed}; got {shown(value)}.", param=param)
    return float(value)


def check_room(adapter: Any, prompt_lengths: Sequence[int], gen_length: int, *, param: str = "gen_length",
               where: str = "") -> None:
    """Refuse ``gen_length`` tokens after the longest prompt when they exceed the model's positions.

    ``where`` names the prompts (``"`tasks` file 'a.jsonl'"``) in the message.
    Nothing is decoded; models that do not say their positions pass.
    """
    limit = getattr(adapter, "max_positions", None)
    if not limit or not prompt_lengths:
        return
    longest = max(prompt_lengths)
    if longest + gen_length > limit:
        prompts = f" of {where}" if where else ""
        raise ConfigError(f"`{param}` {gen_length} plus the longest prompt{prompts} ({longest} tokens) exceeds the "
                          f"model's {limit} positions; use `{param}` <= {max(limit - longest, 0)}"
                          + (" and shorter prompts." if limit - longest < 1 else "."), param=param)
