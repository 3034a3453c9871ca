"""Lossless infilling: a draft token is kept only where it equals the AR argmax.

Each chosen slot is a branch after the context. Every round feeds the branch's
unverified tokens; a token is accepted where it equals the argmax of the logits
one step earlier; at the first mismatch the AR argmax replaces it (so every
round gains at least one token) and the tokens after it are replaced by this
round's argmax guesses (Jacobi iteration, Santilli et al., arXiv 2305.10427).

A slot that starts right after the last context token gets its first token
from the context's own next-token logits, so with the ``leftmost`` selector the
output is exactly greedy AR decoding. For other slots the first token is the
plan's draft (nothing better is known at that position).
"""

from __future__ import annotations

import attrs
import torch

from refusion.protocol import Branch, ModelCall
from refusion.plugins import hookimpl
from refusion.state import Commit, InfillResult, Plan
from refusion.strategies.base import InfillContext, Infiller, InfillGenerator


@attrs.define
class _Slot:
    order: int
    tokens: torch.Tensor
    positions: torch.Tensor
    branch: Branch = attrs.field(factory=Branch)
    accepted: int = 1

    @property
    def length(self) -> int:
        return self.tokens.shape[0]


@attrs.frozen
class GreedyVerify(Infiller):
    """Accept drafts only where they match the AR argmax; commit the AR token at the first mismatch."""

    name = "greedy-verify"
    requires = {"causal": True, "kv_cache": True}

    def infill(self, ctx: InfillContext, plan: Plan, chosen: tuple[int, ...]) -> InfillGenerator:
        work = []
        for order, i in enumerate(chosen):
            rows = plan.rows(i)
            tokens = plan.tokens[rows].clone()
            positions = plan.positions[rows]
            if ctx.last_logits is not None and int(positions[0]) == ctx.last_position + 1:
                tokens[0] = ctx.sample(ctx.last_logits[None])[0][0]
            work.append(_Slot(order, tokens, positions))

        done: dict[int, tuple[Commit, torch.Tensor | None]] = {}
        active = work
        while active:
            outs = yield ModelCall(ctx.extend(s.tokens[len(s.branch) :], s.positions[len(s.branch) :], s.branch) for s in active)
            still, cutoff = [], None
            for s, o in zip(active, outs):
                fed_from = len(s.branch)
                guess = ctx.sample(o.logits)[0]  # guess[w] predicts token fed_from + w + 1
                later = s.tokens[s.accepted :]
                match = later == guess[s.accepted - 1 - fed_from : s.length - 1 - fed_from]
                agreed = int(match.long().cumprod(0).sum())
                mismatch = s.accepted + agreed
                if mismatch < s.length:
                    s.tokens[mismatch:] = guess[mismatch - 1 - fed_from : s.length - 1 - fed_from]
                    s.branch = s.branch.extended(o, mismatch - fed_from)
                    s.accepted = mismatch + 1
                    last_logits = None
                else:
                    s.branch = s.branch.extended(o, s.length - fed_from)
                    s.accepted = s.length
                    last_logits = o.logits[s.length - 1 - fed_from]
                eos = ctx.is_eos(s.tokens[: s.accepted]).nonzero()
                if len(eos) or s.accepted == s.length:
                    stop = int(eos[0]) + 1 if len(eos) else s.length
                    kv = s.branch.kv[: min(stop, len(s.branch))] if s.branch.kv is not None else None
                    commit = Commit(plan.slots[chosen[s.order]], s.tokens[:stop], s.positions[:stop], kv, chain=s.order)
                    done[s.order] = (commit, last_logits if stop == s.length else None)
                    if len(eos):
                        cutoff = s.order
                        break
                else:
                    still.append(s)
            if cutoff is not None:
                done = {k: v for k, v in done.items() if k <= cutoff}
                still = [s for s in still if s.order < cutoff]
            active = still
        ordered = [done[k] for k in sorted(done)]
        return InfillResult([c for c, _ in ordered], next_logits=ordered[-1][1])


@hookimpl
def register_infillers(register):
    register(GreedyVerify)
