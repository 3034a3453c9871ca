"""Every size limit refusion enforces on its inputs, stated once.

A run, request or row larger than these is refused before any work starts,
with an error naming the parameter (:mod:`refusion.validators` makes the
checks). Nothing here imports torch: the command line checks its flags
against these before loading anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from refusion.errors import ConfigError
from refusion.validators import int_in

#: tokens generated per prompt, whatever the model's positions (those are checked too, once it is loaded)
MAX_GEN_LENGTH = 65_536
#: held-out examples per shipped task a caller may ask for (``refusion bench --per-task``, ``held-out:N``, records)
MAX_PER_TASK = 1000
#: examples of a task set (a JSON Lines file, lm-evaluation-harness ``limit``, a bench record's task set)
MAX_EXAMPLES = 100_000
#: trials of a sweep's study, and points of a grid search
MAX_TRIALS = 100_000
#: a sweep's time budget in minutes (30 days)
MAX_MINUTES = 43_200
#: torch threads a record or a command may ask for
MAX_THREADS = 4096
#: seeds of samplers and of training (numpy's range)
SEED_LIMIT = 2**32
#: token ids given on the command line lie below this
MAX_TOKEN_ID = 2**31 - 1
#: the default bound on a server's request body, in bytes (``refusion serve --max-body-bytes``)
MAX_BODY_BYTES = 256 * 1024
#: the memory a command may give keys/values (``--kv-memory``, ``kv_memory=``): 1 EiB, past any machine
MAX_KV_MEMORY = 2**60
#: prompt text may hold this many characters per model position; longer text is refused before it is tokenised
CHARS_PER_POSITION = 8

# -- loop counts: every count a request, a row or a checkpoint can set that makes a decode loop, bounded ------------
#: steps of a selector's schedule (``steps`` of ``llada-steps``, ``dream-steps``, ``dream-blocks``,
#: ``llada2-steps``; SDAR's ``denoising_steps``): steps that would unmask nothing are skipped, so more steps than
#: tokens change nothing, but the schedule is still computed step by step
MAX_STEPS = MAX_GEN_LENGTH
#: denoiser passes per canvas of a canvas-denoising model (``max_denoising_steps``; DiffusionGemma's default 48):
#: one model forward each
MAX_DENOISING_STEPS = 1024
#: edit-only passes over a filled block (a reviser's ``post_fill_passes``, the ``editing`` reviser's
#: ``max_post_steps``; LLaDA 2.1's default 16): one model forward each, per block
MAX_POST_FILL_PASSES = 64
#: a block's or a slot's length (``block_length`` of ``semi-ar``, ``sdar-steps``, ``llada2-steps`` and of a
#: block-diffusion model, ``slot_size`` of ``semi-ar``): a selector ranks a row of that many positions each step
MAX_BLOCK_LENGTH = MAX_GEN_LENGTH
#: the attrs validator of a block's or a slot's length: an integer in [1, MAX_BLOCK_LENGTH]
block_positions = int_in(1, MAX_BLOCK_LENGTH, "positions: refusion.limits.MAX_BLOCK_LENGTH")
#: the attrs validator of a selector's schedule steps: an integer in [1, MAX_STEPS]
schedule_steps = int_in(1, MAX_STEPS, "a schedule's steps: refusion.limits.MAX_STEPS")
#: ``calls_per_token``: an infiller's model calls per chosen token, and a revising block's iterations per token
#: (each plus 8), before the part is stopped with an error
MAX_CALLS_PER_TOKEN = 64


def prompt_chars(max_positions: int | None) -> int | None:
    """The most characters of prompt text a model of ``max_positions`` positions is sent (``None``: no bound)."""
    return None if max_positions is None else CHARS_PER_POSITION * max_positions


def check_room(
    adapter: Any, prompt_lengths: Sequence[int], gen_length: int, *, param: str = "gen_length", where: str = ""
) -> None:
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
        raise ConfigError(
            f"`{param}` {gen_length} plus the longest prompt{prompts} ({longest} tokens) exceeds the "
            f"model's {limit} positions; use `{param}` <= {max(limit - longest, 0)}"
            + (" and shorter prompts." if limit - longest < 1 else "."),
            param=param,
        )


#: the live rows of a batcher, a server or a batch worker unless told otherwise (``max_rows``)
DEFAULT_MAX_ROWS = 16
