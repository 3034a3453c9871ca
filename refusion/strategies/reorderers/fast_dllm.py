"""Fast-dLLM's approximate KV caches for bidirectional diffusion LMs (Wu et al., arXiv 2505.22618)."""

from __future__ import annotations

from typing import ClassVar, Literal

import attrs

from refusion.decoding.protocol import BlockReuse
from refusion.plugins import hookimpl
from refusion.strategies.reorderers.reencode import Reencode
from refusion.validators import boolean


@attrs.frozen
class PrefixCache(Reencode):
    """Keys/values of everything before the current block are computed once per block and reused.

    Each step feeds the current block and the masked suffix; the prefix's
    keys/values are refreshed when the next block starts (Fast-dLLM, Sec. 3.2).
    ``prefix_at_block`` (for models with shifted logits): see
    :class:`~refusion.decoding.protocol.BlockReuse`; the ``fast-dllm-dream`` preset sets
    it, as Fast-dLLM's Dream decoder caches exactly the positions before the block.
    """

    name = "prefix-cache"
    requires = {"causal": False, "kv_cache": True}
    mode: ClassVar[Literal["prefix", "dual"]] = "prefix"

    prefix_at_block: bool = attrs.field(default=False, validator=boolean)

    def start_block(self, start: int, stop: int) -> BlockReuse:
        return BlockReuse(self.mode, prefix_at_block=self.prefix_at_block)


@attrs.frozen
class DualCache(PrefixCache):
    """Like ``prefix-cache``, and the masked suffix after the block is cached too: each step feeds the block only."""

    name = "dual-cache"
    mode = "dual"


@hookimpl
def register_reorderers(register):
    register(PrefixCache)
    register(DualCache)
