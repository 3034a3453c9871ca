"""LLaDA's semi-autoregressive blocks, parametrised by block length."""

from __future__ import annotations

import attrs

from refusion.plugins import hookimpl
from refusion.state import Partition
from refusion.strategies.base import SlotPartitioner
from refusion.strategies.partitioners.fixed import check_gen_length, slots_of
from refusion.validators import positive_int


@attrs.frozen
class SemiAutoregressive(SlotPartitioner):
    """Blocks of ``block_length`` tokens decoded left to right, cut into slots of ``slot_size`` (default 1).

    LLaDA (Nie et al., arXiv 2502.09992, Sec. 2.4) and Fast-dLLM decode one
    token per slot inside blocks of 32. ``gen_length`` is honoured exactly: the
    last block (and its last slot) may be shorter; ``block_length`` must be a
    multiple of ``slot_size``.
    """

    name = "semi-ar"

    block_length: int = attrs.field(default=32, validator=positive_int)
    slot_size: int = attrs.field(default=1, validator=positive_int)

    def __attrs_post_init__(self):
        if self.block_length % self.slot_size:
            from refusion.errors import ConfigError

            raise ConfigError(
                f"`block_length` ({self.block_length}) must be a multiple of `slot_size` ({self.slot_size})."
            )

    def partition(self, gen_length: int) -> Partition:
        check_gen_length(gen_length)
        slots: list = []
        blocks: list = []
        for b, offset in enumerate(range(0, gen_length, self.block_length)):
            block = slots_of(offset, min(self.block_length, gen_length - offset), self.slot_size, len(slots), b)
            blocks.append(tuple(s.index for s in block))
            slots.extend(block)
        return Partition(gen_length, tuple(slots), tuple(blocks))


@hookimpl
def register_partitioners(register):
    register(SemiAutoregressive)
