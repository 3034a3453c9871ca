"""A one-step Jacobi infiller: every chosen slot refines its drafts with one forward, then commits.

Each chosen slot is fed, as its own branch after the committed context, with
its draft tokens. In a causal model output row ``j`` predicts token ``j + 1``,
so the slot's new tokens are its first token followed by the argmax of rows
``0 .. length - 2``: one Jacobi iteration (Santilli et al., arXiv 2305.10427),
each token conditioned on the drafts before it. The slot is cut after its
first EOS. The slots do not see each other, so each is its own ``chain``.
"""

from __future__ import annotations

import attrs
import torch

from refusion.decoding.protocol import ModelCall
from refusion.decoding.types import Commit, InfillResult, Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import InfillContext, Infiller, InfillProgram
from refusion.validators import probability


@attrs.frozen
class OneStepJacobi(Infiller):
    """Refine each chosen slot's drafts with one forward; keep a draft whose confidence reaches ``keep_above``."""

    name = "one-step-jacobi"
    requires = {"causal": True}  # row j predicts token j + 1 only in a causal model

    keep_above: float = attrs.field(default=1.0, validator=probability)  # NaN, inf, -1 are refused here

    def infill(self, ctx: InfillContext, plan: Plan, chosen: tuple[int, ...]) -> InfillProgram:
        firsts, extends = [], []
        for i in chosen:
            drafts, positions = plan.slot_tokens(i), plan.positions[plan.rows(i)]
            first = drafts[0]
            if ctx.last_scores is not None and int(positions[0]) == ctx.last_position + 1:
                first = ctx.sample(ctx.last_scores)[0][0]  # the slot follows the context: its AR token is known
            firsts.append(first)
            fed = torch.cat([first.view(1).to(drafts.device), drafts[1:]])
            extends.append(ctx.extend(fed, positions))  # a branch of the committed context
        outputs = yield ModelCall(extends)  # one forward for every chosen slot
        commits = []
        for order, (i, first, out) in enumerate(zip(chosen, firsts, outputs)):
            drafts, positions = plan.slot_tokens(i), plan.positions[plan.rows(i)]
            refined, _ = ctx.sample(out.scores)  # refined[j] predicts token j + 1
            confident = plan.confidence[plan.rows(i)] >= self.keep_above
            tokens = torch.cat(
                [first.view(1).cpu(), torch.where(confident[1:].cpu(), drafts[1:].cpu(), refined[:-1].cpu())]
            )
            eos = ctx.is_eos(tokens).nonzero()
            stop = int(eos[0]) + 1 if len(eos) else len(tokens)  # cut after the first EOS
            commits.append(Commit(plan.slots[i], tokens[:stop], positions[:stop], kv=None, chain=order))
            if len(eos):
                break  # slots after an EOS are dropped by the decoder anyway
        return InfillResult(commits)


@hookimpl
def register_infillers(register):
    register(OneStepJacobi)
