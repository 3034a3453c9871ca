"""A third-party-style plugin used by the registry tests: one part of every kind."""

import attrs
import torch

from refusion.decoding.context import SequenceCache
from refusion.decoding.protocol import ExtendOutput
from refusion.engines.base import Engine, SequenceState
from refusion.models.families.refusion import ReFusion
from refusion.models.hf import HFCausalLM
from refusion.plugins import hookimpl
from refusion.strategies.base import Reviser, Revision, SlotSelector
from refusion.strategies.infillers.greedy_verify import GreedyVerify
from refusion.strategies.partitioners.fixed import FixedSlots
from refusion.strategies.reorderers.reencode import Reencode


@attrs.frozen
class Rightmost(SlotSelector):
    """Always the rightmost remaining slot."""

    name = "rightmost"

    def select(self, plan):
        return [len(plan) - 1]


@attrs.frozen
class MaskRepeats(Reviser):
    """Masks again, once per block, every earlier-accepted token equal to the token accepted just before it."""

    name = "mask-repeats"

    def revise(self, view):
        if view.memory.get("done"):
            return None
        view.memory["done"] = True
        tokens = view.tokens.tolist()
        again = [int(o) for i, o in enumerate(view.offsets.tolist()) if i and tokens[i] == tokens[i - 1]]
        return Revision(remask=again)


class OneBlock(FixedSlots):
    name = "one-block"


class Lossless(GreedyVerify):
    name = "lossless"


class Exact(Reencode):
    name = "exact"


class Adapter(HFCausalLM):
    name = "sample-adapter"


class SampleFamily(ReFusion):
    """Checkpoints whose config.json says ``model_type: "sample-qwen"``, run as transformers' Qwen3."""

    name = "sample-family"
    description = "a test family: model_type sample-qwen as Qwen3ForCausalLM"
    model_types = ("sample-qwen",)
    remote_modules = ()

    def matches(self, config):
        return config.get("model_type") in self.model_types

    def stock_config(self, config):
        return super().stock_config({**config, "model_type": "qwen3"})


class _LengthStore:
    """Keeps no keys/values, only how many entries are encoded."""

    def __init__(self):
        self.length = 0

    def __len__(self):
        return self.length

    def append(self, kv):
        self.length += len(kv)

    def truncate(self, length):
        self.length = min(self.length, length)


class RecomputeEngine(Engine):
    """A fourth engine, as a plugin would write one: no cache, every extend is one full forward.

    The context is re-fed in cache order under the attention pattern its cache
    would embody (``SequenceCache.attention_pattern``), so its outputs equal
    those of the caching engines; slow and simple, a reference for them.
    """

    name = "recompute"
    priority = -1  # never chosen unless named

    @classmethod
    def unsupported(cls, model):
        return None if model.capabilities.causal and hasattr(model, "model") else "it needs a causal HF model"

    def admit(self, prompt, region_length):
        counters = self.new_counters()
        context = SequenceCache(_LengthStore(), prompt, torch.arange(prompt.shape[0]))
        return SequenceState(context, counters, prompt.shape[0], region_length)

    @torch.no_grad()
    def run(self, calls):
        self.epoch.value += 1
        return {state: tuple(self._extend(state, e) for e in call.extends) for state, call in calls.items()}

    def _extend(self, state, extend):
        from transformers import DynamicCache

        context = state.context
        n, b, q = len(context), len(extend.parent), len(extend.tokens)
        total = n + b + q
        mask = torch.zeros(total, total, dtype=torch.bool)
        mask[:n, :n] = context.attention_pattern()
        mask[n:, :n] = True
        mask[n:, n:] = torch.tril(torch.ones(b + q, b + q, dtype=torch.bool))
        ids = torch.cat((context.tokens, extend.parent.tokens, extend.tokens))[None]
        pos = torch.cat((context.positions, extend.parent.positions, extend.positions))[None]
        cache = DynamicCache(config=self.model.model.config)
        logits = self.model.forward(ids, pos, mask[None, None], cache)[0]
        self.served({state: total})
        if context.pending:
            context.store.length = n
            context.mark_encoded(logits[n - 1])
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        return ExtendOutput(extend, logits[n + b :], layers, 0, n + b, self.epoch, self.epoch.value)


@hookimpl
def register_engines(register):
    register(RecomputeEngine)


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
def register_revisers(register):
    register(MaskRepeats)


@hookimpl
def register_model_adapters(register):
    register(Adapter)


@hookimpl
def register_model_families(register):
    register(SampleFamily)
