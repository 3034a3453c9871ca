"""Fast-dLLM v2's sub-block cache for block-diffusion models (Wu et al., arXiv 2509.26328)."""

from __future__ import annotations

import attrs

from refusion.decoding.protocol import BlockReuse
from refusion.models.base import AtLeast
from refusion.plugins import hookimpl
from refusion.strategies.reorderers.reencode import Reencode
from refusion.validators import positive_int


@attrs.frozen
class SubBlockCache(Reencode):
    """Inside the model's block, only the current sub-block of ``small_block_size`` positions is recomputed.

    The second level of Fast-dLLM v2's cache (the first, finished blocks'
    keys/values, is the ``block`` engine's exact cache): once a full forward
    of the block has kept its keys/values, a step whose positions lie in one
    sub-block that already holds its first token feeds that sub-block alone
    and attends to the kept block, keys/values of the other sub-blocks from
    that earlier forward (an approximation); a step in a sub-block whose first
    position is still masked feeds the whole block again
    (:class:`~refusion.decoding.protocol.BlockReuse` ``mode="sub-block"``).
    Pair it with a selector that decides inside one sub-block
    (``fast-dllm-v2``); with another, steps span sub-blocks and feed the whole
    block.
    """

    name = "sub-block-cache"
    #: a block-diffusion model (the ``block`` engine holds the block's keys/values)
    requires = {"causal": False, "kv_cache": True, "block_length": AtLeast(1)}

    small_block_size: int = attrs.field(default=8, validator=positive_int)

    def start_block(self, start: int, stop: int) -> BlockReuse:
        return BlockReuse("sub-block", sub_block=self.small_block_size)


@hookimpl
def register_reorderers(register):
    register(SubBlockCache)
