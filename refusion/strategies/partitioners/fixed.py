"""The paper's partition: fixed-size slots grouped into equal serial blocks."""

from __future__ import annotations

import attrs

from refusion.decoding.types import Partition, Slot
from refusion.errors import ConfigError
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotPartitioner
from refusion.validators import check_integer, positive_int


def check_gen_length(gen_length: object) -> None:
    """Refuse a ``gen_length`` that is not an integer >= 1."""
    check_integer("gen_length", gen_length, 1)


def slots_of(offset: int, length: int, slot_size: int, first_index: int, block: int) -> list[Slot]:
    """``length`` tokens from ``offset`` cut into slots of ``slot_size``; the last one may be shorter."""
    return [
        Slot(first_index + i, offset + start, min(slot_size, length - start), block)
        for i, start in enumerate(range(0, length, slot_size))
    ]


@attrs.frozen
class FixedSlots(SlotPartitioner):
    """Slots of ``slot_size`` tokens in ``serial_num_blocks`` equal blocks (ReFusion, Sec. 3).

    ``gen_length`` is honoured exactly: when it is not a multiple of
    ``slot_size`` the last slot is shorter (the reference decoder rounds up
    instead). The number of slots, ``ceil(gen_length / slot_size)``, must be
    divisible by ``serial_num_blocks``; otherwise the error names the nearest
    lengths that are.
    """

    name = "fixed"

    slot_size: int = attrs.field(default=8, validator=positive_int)
    serial_num_blocks: int = attrs.field(default=2, validator=positive_int)

    def nearest_lengths(self, gen_length: int) -> tuple[int | None, int | None]:
        """Accepted lengths give a number of slots, ``ceil(n / slot_size)``, that ``serial_num_blocks`` divides."""
        size, blocks = self.slot_size, self.serial_num_blocks
        num_slots = -(-gen_length // size)
        if num_slots % blocks == 0:
            return gen_length, gen_length
        below = (num_slots // blocks) * blocks * size  # the longest length with a whole number of slots per block
        above = ((num_slots // blocks + 1) * blocks - 1) * size + 1  # the shortest longer one
        return (below if below >= 1 else None), above

    def partition(self, gen_length: int) -> Partition:
        check_gen_length(gen_length)
        size, blocks = self.slot_size, self.serial_num_blocks
        num_slots = -(-gen_length // size)
        if num_slots % blocks:
            nearest = " or ".join(str(n) for n in self.nearest_lengths(gen_length) if n is not None)
            allowed = [d for d in range(1, min(num_slots, 4096) + 1) if num_slots % d == 0]
            raise ConfigError(
                f"`gen_length` {gen_length} gives {num_slots} slots of `slot_size` {size}, which `serial_num_blocks` "
                f"{blocks} does not divide. Nearest allowed `gen_length`: {nearest}; or `serial_num_blocks` in: "
                f"{', '.join(map(str, allowed))}.",
                param="gen_length",
            )
        per_block = num_slots // blocks
        slots = tuple(Slot(i, i * size, min(size, gen_length - i * size), i // per_block) for i in range(num_slots))
        groups = tuple(tuple(range(b * per_block, (b + 1) * per_block)) for b in range(blocks))
        return Partition(gen_length, slots, groups)


@hookimpl
def register_partitioners(register):
    register(FixedSlots)
