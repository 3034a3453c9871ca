"""A third-party-style plugin used by the registry tests: one part of every kind."""

import attrs

from refusion.models.hf import HFCausalLM
from refusion.plugins import hookimpl
from refusion.strategies.base import SlotSelector
from refusion.strategies.infillers.greedy_verify import GreedyVerify
from refusion.strategies.partitioners.fixed import FixedSlots
from refusion.strategies.reorderers.reencode import Reencode


@attrs.frozen
class Rightmost(SlotSelector):
    """Always the rightmost remaining slot."""

    name = "rightmost"

    def select(self, plan):
        return [len(plan) - 1]


class OneBlock(FixedSlots):
    name = "one-block"


class Lossless(GreedyVerify):
    name = "lossless"


class Exact(Reencode):
    name = "exact"


class Adapter(HFCausalLM):
    name = "sample-adapter"


@hookimpl
def register_selectors(register):
    register(Rightmost)


@hookimpl
def register_partitioners(register):
    register(OneBlock)


@hookimpl
def register_infillers(register):
    register(Lossless)


@hookimpl
def register_reorderers(register):
    register(Exact)


@hookimpl
def register_model_adapters(register):
    register(Adapter)
