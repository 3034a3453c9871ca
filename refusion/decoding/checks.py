"""Checks on the decoder's input and on what plugins hand back to it.

Bad input (a prompt, a length that does not fit the model) is a
:class:`~refusion.errors.ConfigError` naming the parameter, raised before any
work. A part that raises or returns malformed data gets a
:class:`~refusion.errors.PluginError` naming it, before anything reaches the
cache, so one bad plugin can never corrupt a decode or make it loop forever.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Sequence
from typing import Any

import torch

from refusion.decoding.protocol import KVSegment, ModelCall
from refusion.decoding.types import Commit, InfillResult, Partition, Plan
from refusion.errors import ConfigError, PluginError, RefusionError

_CHECK_BUILTINS = False


def check_builtins(enabled: bool = True) -> bool:
    """Check the answers of refusion's own parts too (off by default); returns the previous setting.

    The built-in parts' answers are proven to meet their contracts by the
    test suite (which turns this on for that purpose), so the decoder does
    not re-check them on every call; a part from anywhere else is checked on
    every call.
    """
    global _CHECK_BUILTINS
    previous, _CHECK_BUILTINS = _CHECK_BUILTINS, bool(enabled)
    return previous


@functools.cache
def _builtin(cls: type) -> bool:
    return cls.__module__.startswith("refusion.strategies.")


def checks_answers(part: Any) -> bool:
    """Whether the decoder checks ``part``'s answers on every call: any part but refusion's own built-ins
    (decided once per part when a decode starts; see :func:`check_builtins`)."""
    kind: Any = type(part)  # classes are hashable
    return _CHECK_BUILTINS or not _builtin(kind)


def describe(part: Any) -> str:
    """``"selector 'threshold' (refusion.strategies...ConfidenceThreshold)"``."""
    cls = type(part)
    return (
        f"{getattr(part, 'kind', 'part')} {getattr(part, 'name', cls.__name__)!r} ({cls.__module__}.{cls.__qualname__})"
    )


def plugin_error(part: Any, message: str) -> PluginError:
    return PluginError(f"{describe(part)} {message}", plugin=getattr(part, "name", None), source=type(part).__module__)


#: what a part may raise that the decoder turns into a PluginError naming it (a plugin's ``sys.exit()`` or
#: ``KeyboardInterrupt`` ends its own request, never the decoding thread that ran it)
PART_FAILURES = (Exception, SystemExit, KeyboardInterrupt)


def guarded(check: Any) -> Any:
    """Make a ``checked_*(part, ...)`` function turn anything unexpected that reading the part's answer raises
    (a lazy sequence that fails, an attribute that is missing) into a PluginError naming the part."""

    @functools.wraps(check)
    def wrapper(part: Any, *args: Any) -> Any:
        try:
            return check(part, *args)
        except RefusionError:
            raise
        except PART_FAILURES as exc:
            raise plugin_error(
                part, f"returned a malformed answer: reading it raised {type(exc).__name__}: {exc}"
            ) from exc

    return wrapper


def integer_tensor(part: Any, value: Any, what: str) -> torch.Tensor:
    """``value`` if it is a 1-D integer tensor, else a PluginError naming ``part`` and ``what`` it was."""
    if not isinstance(value, torch.Tensor):
        raise plugin_error(part, f"gave {what} as {type(value).__name__}; expected a 1-D integer torch.Tensor.")
    if value.dim() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise plugin_error(
            part,
            f"gave {what} of dtype {value.dtype} and shape {tuple(value.shape)}; expected a 1-D "
            "integer tensor (e.g. torch.long).",
        )
    return value


def call_part(part: Any, method: Any, *args: Any) -> Any:
    """Call a part's method; anything it raises (other than a refusion error; ``SystemExit`` and
    ``KeyboardInterrupt`` included) becomes a PluginError naming it."""
    try:
        return method(*args)
    except RefusionError:
        raise
    except PART_FAILURES as exc:
        raise plugin_error(part, f"raised {type(exc).__name__}: {exc}") from exc


def check_prompt(prompt_ids: Any, model: Any) -> torch.Tensor:
    """The prompt as a 1-D LongTensor on the CPU; clear errors for anything else."""
    try:
        raw = torch.as_tensor(prompt_ids)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"`prompt_ids` must be a sequence of token ids; got {type(prompt_ids).__name__} ({exc}).",
            param="prompt_ids",
        ) from exc
    if raw.numel() and (raw.is_floating_point() or raw.is_complex() or raw.dtype == torch.bool):
        raise ConfigError(f"`prompt_ids` must be integer token ids; got dtype {raw.dtype}.", param="prompt_ids")
    prompt = raw.to(torch.long).cpu()
    if prompt.dim() == 2 and prompt.shape[0] == 1:
        prompt = prompt[0]
    if prompt.dim() != 1:
        raise ConfigError(
            f"`prompt_ids` must be one prompt of shape (prompt_len,); got shape {tuple(prompt.shape)}.",
            param="prompt_ids",
        )
    if prompt.shape[0] == 0:
        raise ConfigError("`prompt_ids` must hold at least one token; got an empty prompt.", param="prompt_ids")
    low, high = (int(x) for x in torch.aminmax(prompt))
    if low < 0 or high >= model.vocab_size:
        raise ConfigError(
            f"`prompt_ids` must be token ids in [0, {model.vocab_size}); got {low}..{high}.", param="prompt_ids"
        )
    if bool((prompt == model.mask_token_id).any()):
        masked = (prompt == model.mask_token_id).nonzero().flatten().tolist()
        raise ConfigError(
            f"`prompt_ids` holds the mask token id {model.mask_token_id} at position(s) {masked[:8]}; "
            "a prompt must not contain the mask token (the decoder fills masks only in the answer).",
            param="prompt_ids",
        )
    return prompt


def check_length(model: Any, prompt_len: int, gen_length: int, decoder: Any = None) -> None:
    """Refuse a prompt plus generation longer than the model's positions, naming the longest length that fits
    (the longest ``decoder``'s partitioner accepts, when a decoder is given)."""
    limit = model.max_positions
    if limit is not None and prompt_len + gen_length > limit:
        room = limit - prompt_len
        best = decoder.nearest_lengths(room)[0] if decoder is not None and room >= 1 else None  # longest that fits
        hint = f"use gen_length <= {best}" if best else "use a shorter prompt or a smaller slot/block size"
        what = f"({gen_length})"
        raise ConfigError(
            f"`gen_length` {what} plus the prompt ({prompt_len} tokens) "
            f"exceeds the model's maximum of {limit} positions; {hint}.",
            param="gen_length",
        )


@guarded
def checked_partition(partitioner: Any, partition: Any, gen_length: int) -> Partition:
    """Slots numbered in order, contiguous from 0, covering the region once; each slot in exactly one block."""
    if not isinstance(partition, Partition):
        raise plugin_error(partitioner, f"returned {type(partition).__name__}; expected a Partition.")
    if partition.gen_length != gen_length:
        raise plugin_error(
            partitioner,
            f"returned a region of {partition.gen_length} tokens for the requested "
            f"{gen_length}; a partitioner must honour `gen_length` exactly (a shorter last slot) or "
            "raise a ConfigError naming the nearest lengths it accepts.",
        )
    offset = 0
    for i, slot in enumerate(partition.slots):
        if slot.index != i or slot.offset != offset or slot.length < 1:
            raise plugin_error(
                partitioner,
                f"returned slot {slot!r} at place {i}; slots must be numbered in order and tile the region.",
            )
        offset = slot.stop
    if offset != partition.gen_length:
        raise plugin_error(partitioner, f"slots cover {offset} tokens but `gen_length` is {partition.gen_length}.")
    members = [i for block in partition.blocks for i in block]
    if sorted(members) != list(range(len(partition.slots))):
        raise plugin_error(partitioner, "blocks must hold every slot exactly once.")
    for b, block in enumerate(partition.blocks):
        if any(partition.slots[i].block != b for i in block):
            raise plugin_error(partitioner, f"block {b} lists a slot whose `block` field says otherwise.")
    return partition


def checked_candidates(selector: Any, positions: Sequence[int]) -> int:
    """How many of a block's open slots (their first tokens' absolute ``positions``) ``selector`` may pick (its
    ``candidates_at``), checked: an integer in ``[1, len(positions)]``, else a :class:`PluginError` naming the
    selector."""
    remaining = len(positions)
    width = call_part(selector, selector.candidates_at, positions)
    if type(width) is not int or not 1 <= width <= remaining:  # bool and other number types are refused
        raise plugin_error(
            selector, f"candidates({remaining}) returned {width!r}; expected an integer in [1, {remaining}]."
        )
    return width


@guarded
def checked_selection(selector: Any, plan: Plan, chosen: Any) -> tuple[int, ...]:
    """The selector's answer as sorted, unique, in-range slot indices (Python or numpy integers, or a tensor)."""
    import numbers

    try:
        values = chosen.tolist() if isinstance(chosen, torch.Tensor) else list(chosen)
    except TypeError:
        raise plugin_error(selector, f"returned {chosen!r:.80}; expected a sequence of slot indices.") from None
    if not values:
        raise plugin_error(selector, "returned an empty selection; it must choose at least one slot.")
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        raise plugin_error(selector, f"returned non-integer indices {values!r:.120}.")
    values = [int(v) for v in values]
    bad = [v for v in values if not 0 <= v < len(plan)]
    if bad:
        raise plugin_error(selector, f"returned indices {bad} outside range(0, {len(plan)}) of the plan's slots.")
    if len(set(values)) != len(values):
        raise plugin_error(selector, f"returned duplicate indices {values!r}.")
    return tuple(sorted(values))


@guarded
def checked_call(infiller: Any, call: Any, vocab_size: int, max_positions: int | None) -> ModelCall:
    """The infiller's model call, if its token ids and positions are in range (an :class:`Extend` holds 1-D
    integer tokens and positions of one length by construction)."""
    if not isinstance(call, ModelCall):
        raise plugin_error(infiller, f"yielded {type(call).__name__}; an infiller must yield ModelCall objects.")
    if len(call.extends) == 1:
        tokens, positions = call.extends[0].tokens, call.extends[0].positions
    else:
        tokens = torch.cat([e.tokens for e in call.extends])
        positions = torch.cat([e.positions for e in call.extends])
    t_min, t_max, p_min, p_max = torch.stack((*torch.aminmax(tokens), *torch.aminmax(positions))).tolist()
    if t_min < 0 or t_max >= vocab_size:
        raise plugin_error(infiller, f"asked the model for token ids outside [0, {vocab_size}).")
    if p_min < 0 or (max_positions is not None and p_max >= max_positions):
        raise plugin_error(infiller, f"asked the model for position ids outside [0, {max_positions}).")
    for e in call.extends:
        if e.reads is not None and not isinstance(e.reads, slice):
            reads = e.reads
            ok = (
                isinstance(reads, torch.Tensor)
                and reads.dim() == 1
                and not reads.is_floating_point()
                and (not len(reads) or (int(reads.min()) >= -len(e.tokens) and int(reads.max()) < len(e.tokens)))
            )
            if not ok:
                raise plugin_error(
                    infiller,
                    f"declared `reads` {reads!r} that do not index its {len(e.tokens)} "
                    "fed tokens (a slice or a 1-D tensor of row indices).",
                )
    return call


def bounded(
    infiller: Any, program: Generator, budget: int, vocab_size: int, max_positions: int | None, check: bool = True
):
    """Drive an infiller's generator for at most ``budget`` model calls; wrap its errors.
    ``check``: check each call's ids and positions (:func:`checked_call`)."""
    calls = 0
    try:
        call = next(program)
        while True:
            calls += 1
            if calls > budget:
                program.close()
                raise plugin_error(
                    infiller, f"made more than {budget} model calls in one iteration; it must terminate."
                )
            outputs = yield checked_call(infiller, call, vocab_size, max_positions) if check else call
            call = program.send(outputs)
    except StopIteration as stop:
        return stop.value
    except PluginError:
        raise
    except PART_FAILURES as exc:
        raise plugin_error(infiller, f"raised {type(exc).__name__}: {exc}") from exc


@guarded
def checked_result(
    infiller: Any, result: Any, plan: Plan, chosen: Sequence[int], eos_ids: frozenset[int], mask_id: int, vocab: int
) -> InfillResult:
    """Check an :class:`InfillResult` against the plan and the selection."""
    if not isinstance(result, InfillResult):
        raise plugin_error(infiller, f"returned {type(result).__name__}; expected an InfillResult.")
    if not result.commits:
        raise plugin_error(infiller, "committed no slot; it must finish at least one chosen slot per iteration.")
    allowed = {plan.slots[i].index: i for i in chosen}
    seen = set()
    for commit in result.commits:
        if not isinstance(commit, Commit):
            raise plugin_error(infiller, f"returned {type(commit).__name__} among its commits; expected Commit.")
        slot = commit.slot
        if slot.index not in allowed:
            raise plugin_error(
                infiller, f"committed slot {slot.index}, which was not chosen (chosen: {sorted(allowed)})."
            )
        if slot.index in seen:
            raise plugin_error(infiller, f"committed slot {slot.index} twice.")
        seen.add(slot.index)
        tokens = integer_tensor(infiller, commit.tokens, f"the tokens of slot {slot.index}")
        positions = integer_tensor(infiller, commit.positions, f"the positions of slot {slot.index}")
        m = tokens.shape[0]
        if not 1 <= m <= slot.length:
            raise plugin_error(
                infiller, f"committed {tuple(tokens.shape)} tokens for slot {slot.index} of length {slot.length}."
            )
        if m < slot.length and int(tokens[-1]) not in eos_ids:
            raise plugin_error(
                infiller, f"committed a partial slot {slot.index} ({m}/{slot.length} tokens) not ending in EOS."
            )
        rows = plan.rows(allowed[slot.index])
        if positions.shape != tokens.shape or not torch.equal(positions.cpu(), plan.positions[rows][:m].cpu()):
            raise plugin_error(infiller, f"committed slot {slot.index} at wrong position ids.")
        if commit.kv is not None and (not isinstance(commit.kv, KVSegment) or len(commit.kv) > m):
            raise plugin_error(infiller, f"committed keys/values for more tokens than slot {slot.index} holds.")
    every = torch.cat([c.tokens for c in result.commits]) if len(result.commits) > 1 else result.commits[0].tokens
    low, high = torch.aminmax(every)
    if int(low) < 0 or int(high) >= vocab or bool((every == mask_id).any()):
        bad = next(
            c
            for c in result.commits
            if int(c.tokens.min()) < 0 or int(c.tokens.max()) >= vocab or bool((c.tokens == mask_id).any())
        )
        raise plugin_error(infiller, f"committed invalid token ids for slot {bad.slot.index} (out of range or mask).")
    return result


def checked_post_fill_passes(reviser: Any) -> int:
    """``reviser.post_fill_passes``, checked once when a decoder is built: an integer in
    ``[0, MAX_POST_FILL_PASSES]`` (:mod:`refusion.limits`: each pass is a forward over a filled block).

    A value set as the reviser's own parameter (an init field named ``post_fill_passes``) is the user's: a
    :class:`ConfigError` naming it; a value the reviser computes, or a property that raises, is the plugin's: a
    :class:`PluginError` naming the reviser. ``True`` is not ``1`` and ``3.0`` not ``3``.
    """
    import attrs

    from refusion.limits import MAX_POST_FILL_PASSES
    from refusion.validators import is_integer, shown

    value = call_part(reviser, lambda: reviser.post_fill_passes)
    if is_integer(value) and 0 <= value <= MAX_POST_FILL_PASSES:
        return value
    rule = (
        f"an integer in [0, {MAX_POST_FILL_PASSES}] (edit-only passes over a filled block, a forward each: "
        "refusion.limits.MAX_POST_FILL_PASSES)"
    )
    field = (attrs.fields_dict(type(reviser)) if attrs.has(type(reviser)) else {}).get("post_fill_passes")
    if field is not None and field.init:
        raise ConfigError(
            f"reviser {getattr(reviser, 'name', type(reviser).__name__)!r}: `post_fill_passes` must be {rule}; "
            f"got {shown(value)}.",
            param="post_fill_passes",
        )
    raise plugin_error(reviser, f"has `post_fill_passes` = {shown(value)}; it must be {rule}.")
