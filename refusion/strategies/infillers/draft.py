"""Commit the plan's drafts as they are: masked-diffusion decoding (LLaDA, Dream, Fast-dLLM)."""

from __future__ import annotations

import attrs

from refusion.decoding.types import Commit, InfillResult, Plan
from refusion.plugins import hookimpl
from refusion.strategies.base import InfillContext, Infiller, InfillGenerator


@attrs.frozen
class AcceptDraft(Infiller):
    """Every chosen slot takes the diffusion step's draft tokens; no verification, no model call.

    This is how masked diffusion LMs unmask: LLaDA (Nie et al., arXiv
    2502.09992) with one-token slots and ``topk``/``random`` selection, Fast-dLLM
    (Wu et al., arXiv 2505.22618) with ``threshold``/``factor`` selection. Works
    with causal and bidirectional models.
    """

    name = "draft"

    def infill(self, ctx: InfillContext, plan: Plan, chosen: tuple[int, ...]) -> InfillGenerator:
        yield from ()
        commits = []
        for i in chosen:
            commits.append(Commit(plan.slots[i], plan.slot_tokens(i), plan.positions[plan.rows(i)], kv=None, chain=i))
        return InfillResult(commits)  # type: ignore[arg-type]  # the core's attrs converter (tuple) is untyped for mypy


@hookimpl
def register_infillers(register):
    register(AcceptDraft)
