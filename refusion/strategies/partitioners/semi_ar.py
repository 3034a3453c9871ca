"""LLaDA's semi-autoregressive blocks, parametrised by block length."""

from __future__ import annotations

import attrs

from refusion.decoding.types import Partition
from refusion.limits import block_positions
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotPartitioner
from refusion.strategies.partitioners.fixed import check_gen_length, slots_of
from refusion.validators import boolean, one_of

ALIGNMENTS = ("region", "absolute")


@attrs.frozen
class SemiAutoregressive(SlotPartitioner):
    """Blocks of ``block_length`` tokens decoded left to right, cut into slots of ``slot_size`` (default 1).

    LLaDA (Nie et al., arXiv 2502.09992, Sec. 2.4) and Fast-dLLM decode one
    token per slot inside blocks of 32. ``gen_length`` is honoured exactly: the
    last block (and its last slot) may be shorter; ``block_length`` must be a
    multiple of ``slot_size``.

    ``align="region"`` (default) counts blocks from the region's first
    position. ``align="absolute"`` counts them from position 0, as block
    diffusion models such as SDAR do: the first block then ends at the next
    multiple of ``block_length`` after the prompt (it is shorter when the
    prompt's length is not a multiple), so the decoder's blocks are the
    model's.

    ``pad=True`` decodes whole blocks: when the answer ends inside a block,
    the region grows to that block's end (the partition's ``gen_length`` is
    then larger than asked, its ``answer_length`` the length asked). With
    ``align="absolute"`` (the ``sdar``, ``llada2`` and ``llada2.1`` presets)
    that is SDAR's ``block_diffusion_generate`` and LLaDA 2.x's ``generate``:
    the last block is decoded with all of its positions masked (the padding
    takes part in the block's decisions) and the answer is cut at the length
    asked, as LLaDA 2.x's ``x[:, :prompt_length + gen_length]``.
    """

    name = "semi-ar"

    block_length: int = attrs.field(default=32, validator=block_positions)
    slot_size: int = attrs.field(default=1, validator=block_positions)
    align: str = attrs.field(default="region", validator=one_of(ALIGNMENTS))
    pad: bool = attrs.field(default=False, validator=boolean)

    def __attrs_post_init__(self):
        if self.block_length % self.slot_size:
            from refusion.errors import ConfigError

            raise ConfigError(
                f"`block_length` ({self.block_length}) must be a multiple of `slot_size` ({self.slot_size}).",
                param="block_length",
            )

    def nearest_lengths(self, gen_length: int) -> tuple[int | None, int | None]:
        """Every length is accepted (the last block may be shorter)."""
        return gen_length, gen_length

    def partition(self, gen_length: int) -> Partition:
        return self.partition_after(0, gen_length)

    def padded_length(self, prompt_length: int, gen_length: int) -> int:
        """The region's length after a ``prompt_length``-token prompt: ``gen_length``, or with ``pad`` up to the end
        of the block that holds its last position."""
        if not self.pad:
            return gen_length
        if self.align == "region":
            return -(-gen_length // self.block_length) * self.block_length
        return -(-(prompt_length + gen_length) // self.block_length) * self.block_length - prompt_length

    def partition_after(self, prompt_length: int, gen_length: int) -> Partition:
        check_gen_length(gen_length)
        asked, gen_length = gen_length, self.padded_length(prompt_length, gen_length)
        first = self.block_length
        if self.align == "absolute" and prompt_length % self.block_length:
            first = self.block_length - prompt_length % self.block_length
        starts = [0, *range(first, gen_length, self.block_length)]
        slots: list = []
        blocks: list = []
        for b, (offset, end) in enumerate(zip(starts, [*starts[1:], gen_length])):
            block = slots_of(offset, end - offset, self.slot_size, len(slots), b)
            blocks.append(tuple(s.index for s in block))
            slots.extend(block)
        return Partition(gen_length, tuple(slots), tuple(blocks), asked if gen_length != asked else None)


@hookimpl
def register_partitioners(register):
    register(SemiAutoregressive)
