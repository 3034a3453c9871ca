"""The canvas-denoising loop's own options (DiffusionGemma), owned by the infiller that declares them."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from refusion.decoding.types import Plan
from refusion.errors import ConfigError, bad_value
from refusion.limits import MAX_DENOISING_STEPS
from refusion.plugins import hookimpl
from refusion.strategies.base import InfillContext, Infiller, InfillGenerator
from refusion.validators import boolean, int_in, is_number, non_negative_int, non_negative_number


def _confidence(instance: Any, attribute: Any, value: Any) -> None:
    if not is_number(value) or not value > 0:
        raise bad_value(attribute.name, value, "a finite number > 0 (mean entropy in nats)")


@attrs.frozen
class Denoise(Infiller):
    """How a canvas-denoising model (``capabilities.denoiser``: DiffusionGemma) re-decides its canvases.

    The options of the canvas-denoising loop (:mod:`refusion.decoding.denoising`), named as transformers'
    ``DiffusionGemmaForBlockDiffusion.generate`` names them: per canvas at most ``max_denoising_steps``
    denoiser passes, the logits divided by the linear temperature from ``t_max`` (first step) to ``t_min``
    (last); with ``renoise`` every position the selector does not accept becomes fresh noise (else it keeps
    its token); the canvas stops once its argmax held for ``stability_threshold`` earlier steps and its mean
    entropy (nats, at the step's temperature) is below ``confidence_threshold``. The loop seals each canvas's
    last argmax itself: this infiller is never asked to :meth:`infill`, and runs on canvas-denoising models
    only.
    """

    name = "denoise"
    #: the options of a loop that only canvas-denoising models run
    requires: ClassVar[dict[str, object]] = {"denoiser": True}

    max_denoising_steps: int = attrs.field(
        default=48, validator=int_in(1, MAX_DENOISING_STEPS, "a forward each: refusion.limits.MAX_DENOISING_STEPS")
    )
    t_min: float = attrs.field(default=0.4, validator=non_negative_number)
    t_max: float = attrs.field(default=0.8, validator=non_negative_number)
    stability_threshold: int = attrs.field(default=1, validator=non_negative_int)
    confidence_threshold: float = attrs.field(default=0.005, validator=_confidence)
    renoise: bool = attrs.field(default=True, validator=boolean)

    def __attrs_post_init__(self) -> None:
        if not self.t_max > self.t_min:
            raise ConfigError(
                f"`t_max` ({self.t_max}) must be greater than `t_min` ({self.t_min}): the denoising temperature "
                "falls from t_max at a canvas's first step to t_min at its last.",
                param="t_max",
            )

    def infill(self, ctx: InfillContext, plan: Plan, chosen: tuple[int, ...]) -> InfillGenerator:
        raise ConfigError(
            "infiller 'denoise' holds the options of the canvas-denoising loop, which seals its canvases itself; "
            "it decodes canvas-denoising models only (DiffusionGemma).",
            param="infiller",
        )


@hookimpl
def register_infillers(register):
    register(Denoise)
