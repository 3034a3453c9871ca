"""``editing``: LLaDA 2.1's token-to-token editing (inclusionAI LLaDA2.1 ``generate``: ``editing_threshold``,
``max_post_steps``).

Each step's forward already sees the open block's accepted tokens; where its
argmax at such a token is another token with probability above
``editing_threshold`` (strictly), that token is replaced (LLaDA 2.1 edits
only tokens accepted before the step, never the prompt). After the block's
last mask is filled, up to ``max_post_steps`` edit-only passes follow (one
forward each); the block is sealed after a pass that edits nothing. An
argmax that is the mask token masks the position again (LLaDA 2.1 writes it
back, so the position is decoded anew). Pair it with the ``threshold``
selector (mask-to-token above ``threshold``, else the most confident one)
and the ``draft`` infiller. With a sampler the "argmax" is the step's draw at
that position (one draw over the block feeds the masks' drafts and the edits,
as LLaDA 2.1 samples): the ``llada2.1`` preset.
"""

from __future__ import annotations

import attrs

from refusion.limits import MAX_POST_FILL_PASSES
from refusion.plugins import hookimpl
from refusion.strategies.base import Reviser, Revision, RevisionView
from refusion.validators import int_in, probability


@attrs.frozen
class EditingReviser(Reviser):
    """Replace earlier-accepted tokens of the open block whose forward argmax differs with probability above
    ``editing_threshold``; then up to ``max_post_steps`` edit-only passes once the block is filled."""

    name = "editing"
    #: the forward must see the accepted tokens of the open block: a bidirectional (or block-diffusion) model
    requires = {"causal": False}
    predicts = True

    editing_threshold: float = attrs.field(default=0.9, validator=probability)
    max_post_steps: int = attrs.field(
        default=16, validator=int_in(0, MAX_POST_FILL_PASSES, "edit-only passes: refusion.limits.MAX_POST_FILL_PASSES")
    )

    @property
    def post_fill_passes(self) -> int:
        return self.max_post_steps

    def revise(self, view: RevisionView) -> Revision | None:
        if view.predicted is None or view.predicted_probability is None:
            return None
        edit = (
            ~view.accepted_now & (view.predicted_probability > self.editing_threshold) & (view.predicted != view.tokens)
        )
        if not bool(edit.any()):
            return None
        offsets, tokens = view.offsets[edit].tolist(), view.predicted[edit].tolist()
        mask = view.mask_token_id
        return Revision(
            remask=[o for o, t in zip(offsets, tokens) if t == mask],
            replace={o: t for o, t in zip(offsets, tokens) if t != mask},
        )


@hookimpl
def register_revisers(register):
    register(EditingReviser)
