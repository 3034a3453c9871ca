"""d3LLM's delayed, periodically refreshed prefix cache for bidirectional diffusion LMs (arXiv 2601.07568)."""

from __future__ import annotations

import attrs

from refusion.decoding.protocol import BlockReuse
from refusion.plugins import hookimpl
from refusion.strategies.reorderers.reencode import Reencode
from refusion.validators import non_negative_int, positive_int


@attrs.frozen
class PeriodicCache(Reencode):
    """The prefix of finished chunks is cached ``cache_delay_iter`` steps after it finished, and the whole canvas
    refreshed every ``refresh_interval``-th step (d3LLM's ``generate_multi_block_kv_cache``).

    The block is cut into chunks of ``block_size`` positions (d3LLM's blocks; the prompt is one more). A chunk
    whose every position holds a token, once every chunk before it is cached, waits ``cache_delay_iter`` steps
    and joins the cached prefix; a step that grows the prefix, and once something is cached a step with no chunk
    waiting whose number is not a multiple of ``refresh_interval``, feeds only the positions after the prefix;
    every other step feeds the whole canvas and rewrites the prefix's keys/values
    (:class:`~refusion.decoding.protocol.BlockReuse` ``mode="periodic"``). Models with logit shift 0 (LLaDA).

    A cache policy as a reorderer, as ``dkv`` is: the reorderer already says per block which keys/values a
    bidirectional model reuses, and the engine that holds them applies it per forward. The commits join the
    context as :class:`~refusion.strategies.reorderers.reencode.Reencode` appends them. Defaults: d3LLM's LLaDA
    HumanEval settings (``cache_delay_iter=2``, ``refresh_interval=4``, blocks of 32).
    """

    name = "periodic"
    requires = {"causal": False, "kv_cache": True, "logit_shift": 0}

    block_size: int = attrs.field(default=32, validator=positive_int)
    cache_delay_iter: int = attrs.field(default=2, validator=non_negative_int)
    refresh_interval: int = attrs.field(default=4, validator=positive_int)

    def start_block(self, start: int, stop: int) -> BlockReuse:
        return BlockReuse(
            "periodic", chunk=self.block_size, delay=self.cache_delay_iter, reload_every=self.refresh_interval
        )


@hookimpl
def register_reorderers(register):
    register(PeriodicCache)
