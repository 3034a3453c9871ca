"""Lossless infilling: a draft token is kept only where it equals the AR argmax.

Each chosen slot is a branch after the context. Every round feeds the
branch's known tokens that have no keys/values yet plus up to ``spec`` of its
unverified draft tokens; a draft is accepted where it equals the argmax of
the logits one step earlier; the first mismatch is replaced by the AR argmax
(so every round gains at least one token) and the drafts after it by this
round's argmax guesses (Jacobi iteration, Santilli et al., arXiv 2305.10427).

A slot that starts right after the last context token gets its first token
from the context's own next-token logits, so with the ``leftmost`` selector the
output is exactly greedy AR decoding, whatever the drafts. For other slots the
first token is the plan's draft (nothing better is known at that position).

``adaptive`` (default) sizes the speculation like a speculative decoder: the
first slot feeds all its drafts; afterwards the number of drafts fed per
round follows how many were accepted (doubling after a round that accepted
all, shrinking to what was accepted otherwise; when the plan's drafts failed,
one Jacobi guess is still tried before giving up), kept across iterations in
the sequence's memory. When guesses keep failing it feeds none: each round is
then one AR step, the plan's forward is skipped (nothing reads it), and every
``probe_every`` slots one draft is tried again. ``adaptive=False`` always
feeds every unverified draft (plain Jacobi).
"""

from __future__ import annotations

import attrs
import torch

from refusion.decoding.protocol import ROOT, Branch, ModelCall
from refusion.decoding.types import Commit, InfillResult, Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import InfillContext, Infiller, InfillGenerator
from refusion.validators import positive_int

MEMORY = "greedy-verify"


@attrs.define
class _Slot:
    order: int
    tokens: torch.Tensor
    positions: torch.Tensor
    branch: Branch = ROOT
    accepted: int = 1
    refined: bool = False  # the tokens after `accepted` are Jacobi guesses of an earlier round (not plan drafts)

    @property
    def length(self) -> int:
        return self.tokens.shape[0]


@attrs.define
class _Speculation:
    """Per-sequence state: drafts to feed per round (``None``: a whole slot), slots since the last probe,
    and whether the decoder asked this iteration (the plan can be skipped only then)."""

    spec: int | None = None
    idle: int = 0
    asked: bool = False


@attrs.frozen
class GreedyVerify(Infiller):
    """Accept drafts only where they match the AR argmax; commit the AR token at the first mismatch."""

    name = "greedy-verify"
    requires = {"causal": True, "kv_cache": True}
    batched = "refusion.decoding.forms.lossless:Lossless"

    adaptive: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    probe_every: int = attrs.field(default=8, validator=positive_int)

    def _state(self, ctx: InfillContext) -> _Speculation:
        return ctx.memory.setdefault(MEMORY, _Speculation())

    def needs_drafts(self, ctx: InfillContext, slots) -> bool:
        state = self._state(ctx)
        state.asked = True
        if not self.adaptive or ctx.last_scores is None:
            return True
        if any(ctx.region_start + slot.offset != ctx.last_position + 1 for slot in slots):
            return True
        if state.spec is None or state.spec > 0:
            return True
        state.idle += 1
        if state.idle >= self.probe_every:  # try one draft again now and then
            state.idle, state.spec = 0, 1
            return True
        return False

    def infill(self, ctx: InfillContext, plan: Plan, chosen: tuple[int, ...]) -> InfillGenerator:
        state = self._state(ctx)
        work = []
        for order, i in enumerate(chosen):
            rows = plan.rows(i)
            positions = plan.positions[rows]
            adjacent = ctx.last_scores is not None and int(positions[0]) == ctx.last_position + 1
            if plan.drafted:
                tokens = plan.slot_tokens(i).clone()
            elif adjacent:
                tokens = torch.full((rows.stop - rows.start,), ctx.mask_token_id, dtype=torch.long)
            else:
                raise RuntimeError("greedy-verify needs drafts for a slot that does not follow the context")
            if adjacent:
                tokens[0] = ctx.sample(ctx.last_scores)[0][0]
            work.append(_Slot(order, tokens, positions))
        limit = max(s.length for s in work)
        spec = (limit if state.spec is None else state.spec) if self.adaptive else limit
        skippable, state.asked = state.asked, False  # could the next plan be skipped?
        if not plan.drafted:
            spec = 0
        elif spec == 0:
            spec = 1  # the drafts were computed anyway: try one

        done: dict[int, tuple[Commit, object]] = {}
        active = work
        while active:
            windows, extends = [], []
            for s in active:
                fed_from = len(s.branch)
                fed_to = min(s.length, s.accepted + spec) if s.accepted < s.length else s.length
                windows.append((fed_from, fed_to))
                reads = slice(s.accepted - 1 - fed_from, None) if s.accepted < s.length else slice(-1, None)
                extends.append(
                    ctx.extend(s.tokens[fed_from:fed_to], s.positions[fed_from:fed_to], s.branch, reads=reads)
                )
            outs = yield ModelCall(extends)  # type: ignore[arg-type]  # the core's attrs converter (tuple) is untyped for mypy
            still, cutoff, fed_spec, agreed_spec, from_plan = [], None, 0, 0, False
            for s, o, (fed_from, fed_to) in zip(active, outs, windows):
                lo = s.accepted - 1 - fed_from  # the row that predicts the first unverified token
                if s.accepted >= s.length:  # only re-fed for keys/values and the next token's logits
                    s.branch = s.branch.extended(o, fed_to - fed_from)
                    last = o.scores[fed_to - 1 - fed_from]
                else:
                    # guess[j] predicts token s.accepted + j (on the drafts' device: one comparison, no mixing)
                    guess = ctx.sample(o.scores[lo:])[0].to(s.tokens.device)
                    drafts = s.tokens[s.accepted : fed_to]
                    match = drafts == guess[: len(drafts)]
                    agreed = int(match.long().cumprod(0).sum())
                    fed_spec += len(drafts)
                    agreed_spec += agreed
                    from_plan |= bool(len(drafts)) and not s.refined
                    known = s.accepted + agreed  # tokens[:known] verified; guess[agreed] is the AR token at `known`
                    s.branch = s.branch.extended(o, known - fed_from)
                    last = o.scores[known - 1 - fed_from] if known == fed_to else None  # type: ignore[assignment]
                    if known < s.length:
                        s.tokens[known] = guess[agreed]
                        refined = guess[agreed + 1 :]  # Jacobi: later guesses, conditioned on this round's drafts
                        stop = min(s.length, known + 1 + len(refined))
                        s.tokens[known + 1 : stop] = refined[: stop - known - 1]
                        s.refined = stop > known + 1
                        s.accepted = known + 1
                        last = None
                    else:
                        s.accepted = s.length
                eos = ctx.is_eos(s.tokens[: s.accepted]).nonzero()
                finished = len(eos) or (
                    s.accepted == s.length and (len(s.branch) == s.length or not self._refeed(spec, skippable))
                )
                if finished:
                    stop = int(eos[0]) + 1 if len(eos) else s.length
                    kv = s.branch.kv[: min(stop, len(s.branch))] if s.branch.kv is not None else None
                    commit = Commit(plan.slots[chosen[s.order]], s.tokens[:stop], s.positions[:stop], kv, chain=s.order)
                    done[s.order] = (commit, last if stop == s.length and len(s.branch) == s.length else None)
                    if len(eos):
                        cutoff = s.order
                        break
                else:
                    still.append(s)
            if self.adaptive and fed_spec:
                if agreed_spec == fed_spec:
                    spec = min(limit, max(1, 2 * spec))
                else:  # plan drafts failed: still try one Jacobi guess before giving up on speculation
                    spec = agreed_spec // max(1, len(active))
                    if from_plan:
                        spec = max(1, spec)
            if cutoff is not None:
                done = {k: v for k, v in done.items() if k <= cutoff}
                still = [s for s in still if s.order < cutoff]
            active = still
        if self.adaptive:
            state.spec = spec
        ordered = [done[k] for k in sorted(done)]
        return InfillResult([c for c, _ in ordered], next_logits=ordered[-1][1])  # type: ignore[misc]  # as above

    def _refeed(self, spec: int, skippable: bool) -> bool:
        """Feed a finished slot's last token(s) once more for their keys/values and the next token's logits?

        Only when the next plan will be skipped (AR mode, and the selector reads
        no scores): otherwise the pending tokens ride along with the plan's
        forward for free.
        """
        return self.adaptive and skippable and spec == 0


@hookimpl
def register_infillers(register):
    register(GreedyVerify)
