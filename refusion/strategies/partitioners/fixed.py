"""The paper's partition: fixed-size slots grouped into equal serial blocks."""

from __future__ import annotations

import attrs

from refusion.errors import ConfigError
from refusion.plugins import hookimpl
from refusion.state import Partition, Slot
from refusion.strategies.base import SlotPartitioner
from refusion.validators import positive_int


@attrs.frozen
class FixedSlots(SlotPartitioner):
    """Slots of ``slot_size`` tokens in ``serial_num_blocks`` equal blocks (ReFusion, Sec. 3).

    ``gen_length`` is rounded up to a multiple of ``slot_size`` (as the
    reference decoder does); the resulting number of slots must be divisible
    by ``serial_num_blocks``.
    """

    name = "fixed"

    slot_size: int = attrs.field(default=8, validator=positive_int)
    serial_num_blocks: int = attrs.field(default=2, validator=positive_int)

    def partition(self, gen_length: int) -> Partition:
        if isinstance(gen_length, bool) or not isinstance(gen_length, int) or gen_length < 1:
            raise ConfigError(f"`gen_length` must be an integer >= 1; got {gen_length!r}.")
        num_slots = -(-gen_length // self.slot_size)
        if num_slots % self.serial_num_blocks:
            allowed = [d for d in range(1, num_slots + 1) if num_slots % d == 0]
            raise ConfigError(
                f"`serial_num_blocks` must divide the number of slots ({num_slots} = ceil(gen_length {gen_length} / "
                f"slot_size {self.slot_size})); got {self.serial_num_blocks}. Allowed: {', '.join(map(str, allowed))}."
            )
        per_block = num_slots // self.serial_num_blocks
        slots = tuple(Slot(i, i * self.slot_size, self.slot_size, i // per_block) for i in range(num_slots))
        blocks = tuple(tuple(range(b * per_block, (b + 1) * per_block)) for b in range(self.serial_num_blocks))
        return Partition(num_slots * self.slot_size, slots, blocks)


@hookimpl
def register_partitioners(register):
    register(FixedSlots)
