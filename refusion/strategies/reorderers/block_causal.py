"""D2F's block-causal attention over a bidirectional model's canvas, with the exact cache of finished blocks
(Discrete Diffusion Forcing, arXiv 2508.09192)."""

from __future__ import annotations

import attrs

from refusion.decoding.protocol import BlockReuse
from refusion.plugins import hookimpl
from refusion.strategies.reorderers.reencode import Reencode
from refusion.validators import boolean, positive_int

#: a number of calls no decode reaches (the kept keys/values are exact: never refreshed)
NEVER = 2**62


@attrs.frozen
class BlockCausal(Reencode):
    """The canvas is cut into blocks of ``block_size`` positions after the prompt; a position attends to its own
    block and the blocks before it, the prompt to itself (D2F's attention: its models are trained so). A finished
    block, once every block before it is finished, is cached: fed once more in the next forward (its keys/values
    then final) and never again, exactly (``cache_finished=False``: every forward feeds the whole canvas, the
    same tokens).

    A request to the engine as the other cache policies are (:class:`~refusion.decoding.protocol.BlockReuse`
    ``mode="periodic"`` with ``chunk_causal=True``, no delay, never refreshed): the attention and what is cached
    follow the same blocks. Bidirectional models with logit shift 0 (D2F's LLaDA) or 1 (D2F's Dream: the last
    cached position, whose output predicts the next one, is fed again). The commits join the context as
    :class:`~refusion.strategies.reorderers.reencode.Reencode` appends them.
    """

    name = "block-causal"
    requires = {"causal": False, "kv_cache": True}

    block_size: int = attrs.field(default=32, validator=positive_int)
    cache_finished: bool = attrs.field(default=True, validator=boolean)

    def start_block(self, start: int, stop: int) -> BlockReuse:
        delay = 0 if self.cache_finished else NEVER  # never finished waiting: nothing kept, the whole canvas fed
        return BlockReuse("periodic", chunk=self.block_size, delay=delay, reload_every=NEVER, chunk_causal=True)


@hookimpl
def register_reorderers(register):
    register(BlockCausal)
