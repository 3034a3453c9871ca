"""dKV-Cache's delayed cache of decoded tokens for bidirectional diffusion LMs (Ma et al., arXiv 2505.15781)."""

from __future__ import annotations

import attrs

from refusion.decoding.protocol import BlockReuse
from refusion.plugins import hookimpl
from refusion.strategies.reorderers.reencode import Reencode
from refusion.validators import positive_int


@attrs.frozen
class DelayedCache(Reencode):
    """A decoded token's keys/values are computed in the forward after the one that decoded it and reused from then
    on; masks are always recomputed (dKV-Cache-Decode). In each block the first two forwards and every
    ``cache_reloading_step``-th one feed the whole canvas (a refresh); the others feed only the positions still
    masked at the forward before. ``cache_reloading_step=1`` refreshes at every step: the plain MDM's forwards.

    A cache policy as a reorderer: the reorderer already says, per block, which keys/values of a bidirectional
    model are reused (:class:`~refusion.decoding.protocol.BlockReuse`), and the engine, which holds them, applies
    it per forward (``mode="decoded"``). Models with logit shift 0 (LLaDA). The commits join the context as
    :class:`~refusion.strategies.reorderers.reencode.Reencode` appends them (their keys/values by a later forward).
    """

    name = "dkv"
    requires = {"causal": False, "kv_cache": True, "logit_shift": 0}

    cache_reloading_step: int = attrs.field(default=8, validator=positive_int)

    def start_block(self, start: int, stop: int) -> BlockReuse:
        return BlockReuse("decoded", reload_every=self.cache_reloading_step)


@hookimpl
def register_reorderers(register):
    register(DelayedCache)
