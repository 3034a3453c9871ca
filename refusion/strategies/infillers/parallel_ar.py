"""The paper's infiller: global verification, then parallel autoregressive infilling.

ReFusion (arXiv 2512.13586), Sec. 3.2, as in the reference ``generate_refusion``:

1. *Global verification*: the chosen drafts are fed concatenated after the
   context. A token's score is its AR probability (from the logits one step
   earlier); each slot's first token keeps its plan confidence and is always
   accepted. If the longest prefix of the concatenation scoring above
   ``token_threshold`` contains an EOS, or covers whole slots, those slots are
   committed with the keys/values of this pass (one chain).
2. Otherwise *parallel infilling*: each chosen slot becomes a branch sharing
   the context. Each round drafts the branch's unaccepted tokens from masks,
   verifies them causally, and accepts the first unaccepted token plus every
   following one scoring above ``token_threshold``, until every branch is full.
   An accepted EOS ends its branch and drops the branches after it.

Branches advance independently (the reference re-feeds all of them from the
slowest one's position; the tokens are the same), and each branch's keys/values
are its own (computed against the context and the branch only), as in the paper.
"""

from __future__ import annotations

import attrs
import torch

from refusion.decoding.protocol import ROOT, Branch, ExtendOutput, ModelCall
from refusion.decoding.sampling import PRECISIONS, token_probability
from refusion.decoding.types import Commit, InfillResult, Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import InfillContext, Infiller, InfillGenerator
from refusion.validators import one_of, probability


@attrs.define
class _Branch:
    """Mutable bookkeeping of one chosen slot during parallel infilling."""

    order: int
    tokens: torch.Tensor
    positions: torch.Tensor
    accepted: int
    branch: Branch = ROOT

    @property
    def length(self) -> int:
        return self.tokens.shape[0]

    @property
    def kv_len(self) -> int:
        return len(self.branch)


def _first_eos(ctx: InfillContext, tokens: torch.Tensor) -> int | None:
    hits = ctx.is_eos(tokens).nonzero()
    return int(hits[0]) if len(hits) else None


@attrs.frozen
class ParallelAR(Infiller):
    """Global verification + parallel AR infilling with acceptance threshold ``token_threshold``.

    ``precision`` (:data:`~refusion.decoding.sampling.PRECISIONS`) is how
    verification probabilities are computed: ``"logits"`` as the reference
    does (``softmax`` in the logits' dtype, compared with ``token_threshold``
    in that dtype), ``"float32"`` on refusion's fused LM-head path.
    """

    name = "parallel-ar"
    requires = {"causal": True, "kv_cache": True}
    batched = "refusion.decoding.forms.plan_infill:PlanInfill"

    token_threshold: float = attrs.field(default=0.9, validator=probability)
    precision: str = attrs.field(default="float32", validator=one_of(PRECISIONS))

    def infill(self, ctx: InfillContext, plan: Plan, chosen: tuple[int, ...]) -> InfillGenerator:
        rows = [plan.rows(i) for i in chosen]
        lengths = [r.stop - r.start for r in rows]
        tokens = plan.slots_tokens(chosen)
        starts = torch.tensor([0] + lengths[:-1], device=tokens.device).cumsum(0)
        positions = torch.cat([plan.positions[r] for r in rows]) if len(chosen) > 1 else plan.positions[rows[0]]

        fused = self.precision == "float32"  # rows projected with the other sequences' (the fused statistics)
        (out,) = yield ModelCall.of(ctx.extend(tokens, positions, reads=slice(0, len(tokens) - 1) if fused else None))
        first = plan.first_confidence[list(chosen)]
        score = torch.empty(tokens.shape[0], dtype=first.dtype)
        score[1:] = token_probability(out.scores[:-1], tokens[1:], self.precision).cpu()
        score[starts] = first
        accept = score > self.token_threshold
        accept[starts] = True
        prefix = int(accept.long().cumprod(0).sum())

        eos = _first_eos(ctx, tokens[:prefix])
        cut = eos + 1 if eos is not None else sum(s for s in _whole_slots(lengths, prefix))
        if cut:
            return self._commit_chain(plan, chosen, tokens, positions, lengths, out, cut)

        # Parallel infilling; the per-slot acceptance of the global pass is the starting point.
        branches = []
        for order, (start, length) in enumerate(zip(starts.tolist(), lengths)):
            accepted = int(accept[start : start + length].long().cumprod(0).sum())
            branches.append(
                _Branch(order, tokens[start : start + length].clone(), positions[start : start + length], accepted)
            )
        return (yield from self._parallel(ctx, plan, chosen, branches))

    def _commit_chain(self, plan, chosen, tokens, positions, lengths, out: ExtendOutput, cut: int) -> InfillResult:
        commits, start = [], 0
        for i, length in zip(chosen, lengths):
            if start >= cut:
                break
            stop = min(start + length, cut)
            commits.append(
                Commit(plan.slots[i], tokens[start:stop], positions[start:stop], out.kv[start:stop], chain=0)
            )
            start += length
        return InfillResult(commits, next_logits=out.scores[cut - 1])  # type: ignore[arg-type]  # the core's attrs converter (tuple) is untyped for mypy

    def _parallel(self, ctx, plan, chosen, branches: list[_Branch]) -> InfillGenerator:
        fused = self.precision == "float32"
        done: dict[int, tuple[Commit, torch.Tensor]] = {}
        active = list(branches)
        while active:
            drafting = [b for b in active if b.accepted < b.length]
            if drafting:
                outs = yield ModelCall(
                    ctx.extend(
                        self._masked(ctx, b),
                        b.positions[b.kv_len :],
                        b.branch,
                        reads=slice(b.accepted - b.kv_len, None) if fused else None,
                    )
                    for b in drafting
                )
                for b, o in zip(drafting, outs):
                    proposal, _ = ctx.sample(o.scores[b.accepted - b.kv_len :])
                    b.tokens[b.accepted :] = proposal.cpu()

            outs = yield ModelCall(
                ctx.extend(
                    b.tokens[b.kv_len :], b.positions[b.kv_len :], b.branch, reads=slice(None) if fused else None
                )
                for b in active
            )
            cutoff, still_active = None, []
            for b, o in zip(active, outs):
                if cutoff is not None:
                    break  # branches are in position order: the rest lie after an accepted EOS
                self._accept(b, o)
                eos = _first_eos(ctx, b.tokens[: b.accepted])
                if eos is None and b.accepted < b.length:
                    b.branch = b.branch.extended(o, b.accepted - 1 - b.kv_len)
                    still_active.append(b)
                    continue
                stop = b.length if eos is None else eos + 1
                kv = b.branch.extended(o, stop - b.kv_len).kv
                commit = Commit(plan.slots[chosen[b.order]], b.tokens[:stop], b.positions[:stop], kv, chain=b.order)
                done[b.order] = (commit, o.scores[stop - 1 - b.kv_len])
                if eos is not None:
                    cutoff = b.order
            if cutoff is not None:
                done = {k: v for k, v in done.items() if k <= cutoff}
            active = still_active
        ordered = [done[k] for k in sorted(done)]
        return InfillResult([c for c, _ in ordered], next_logits=ordered[-1][1])  # type: ignore[misc]  # as above

    def _masked(self, ctx: InfillContext, b: _Branch) -> torch.Tensor:
        window = b.tokens[b.kv_len :].clone()
        window[b.accepted - b.kv_len :] = ctx.mask_token_id
        return window

    def _accept(self, b: _Branch, out: ExtendOutput) -> None:
        """Accept the first unaccepted token and every following one scoring above the threshold."""
        if b.accepted >= b.length:
            return
        nxt = b.accepted + 1  # forced
        if nxt < b.length:
            window = b.tokens[b.kv_len :]
            # token at index j (>= nxt) is scored by the logits one step earlier.
            p = token_probability(
                out.scores[nxt - 1 - b.kv_len : b.length - 1 - b.kv_len], window[nxt - b.kv_len :], self.precision
            )
            nxt += int((p > self.token_threshold).long().cumprod(0).sum())
        b.accepted = nxt


def _whole_slots(lengths: list[int], prefix: int):
    """Lengths of the leading slots that lie entirely within ``prefix`` tokens."""
    total = 0
    for length in lengths:
        if total + length > prefix:
            return
        total += length
        yield length


@hookimpl
def register_infillers(register):
    register(ParallelAR)
