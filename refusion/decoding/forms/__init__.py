"""The forms rows run in: the batched forms infillers name, and the per-sequence adapter for everything else.

:func:`form_for` says which form a decoder's rows take on an engine, and why not a batched one. The built-in
batched forms: :mod:`~refusion.decoding.forms.lossless` (``greedy-verify``) and
:mod:`~refusion.decoding.forms.plan_infill` (``parallel-ar``); :mod:`~refusion.decoding.forms.program` runs any
decoder, one program per row, on the same forwards.
"""

from __future__ import annotations

from typing import Any

from refusion.decoding.forms.base import BatchedForm, resolve
from refusion.decoding.forms.program import ProgramForm


def form_for(decoder: Any, engine: Any, record: bool = False) -> tuple[type[BatchedForm], str | None]:
    """``(form, reason)``: the form ``decoder``'s rows take on ``engine`` (``record``: keeping iteration records),
    and why it is not a batched one (``None`` when it is)."""
    infiller = decoder.infiller
    batched = resolve(getattr(infiller, "batched", None))
    if batched is None:
        return ProgramForm, f"infiller {infiller.name!r} has no batched form (trait `batched`)"
    if not getattr(engine, "lays_out", False):
        return ProgramForm, f"engine {engine.name!r} runs calls, not a shared feed"
    reason = batched.refuses(decoder, engine, record)
    if reason is not None:
        return ProgramForm, reason
    return batched, None


__all__ = ["BatchedForm", "ProgramForm", "form_for"]
