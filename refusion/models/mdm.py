"""Adapter for bidirectional masked diffusion LMs: LLaDA-style (no logit shift) and Dream-style (shift 1).

The network sees the whole canvas with bidirectional attention and no exact
KV cache (Fast-dLLM's approximate caches can still reuse keys/values when the
network accepts a transformers ``Cache``). Strategies that verify drafts
autoregressively (``parallel-ar``, ``greedy-verify``) are refused for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from refusion.errors import ConfigError
from refusion.models.base import ModelCapabilities
from refusion.models.hf import HFCausalLM, cache_keyword
from refusion.plugins import hookimpl


class HFMaskedDiffusionLM(HFCausalLM):
    """A Hugging Face model used as a bidirectional masked diffusion LM.

    ``logit_shift`` is 0 when the logits at a mask predict that position
    (LLaDA) and 1 when they predict the next position (Dream). Keyword
    arguments the network's ``forward`` does not take (``position_ids``,
    ``cache``) are not passed to it.
    """

    name = "hf-mdm"

    def __init__(
        self,
        model: Any,
        tokenizer: Any | None = None,
        *,
        logit_shift: int = 0,
        mask_token_id: int | None = None,
        eos_token_id: int | Iterable[int] | None = None,
    ):
        if logit_shift not in (0, 1):
            raise ConfigError(
                f"`logit_shift` must be 0 (LLaDA) or 1 (Dream); got {logit_shift!r}.", param="logit_shift"
            )
        super().__init__(model, tokenizer, mask_token_id=mask_token_id, eos_token_id=eos_token_id)
        accepted = set(inspect.signature(model.forward).parameters)
        self._takes = {k for k in ("position_ids", "attention_mask", "use_cache") if k in accepted}
        self._cache_keyword = cache_keyword(model.forward)
        self.capabilities = ModelCapabilities(
            causal=False, logit_shift=logit_shift, kv_cache=self._cache_keyword is not None
        )

    def _inputs(self, position_ids, attention_mask, cache):
        kwargs = {"position_ids": position_ids, "attention_mask": attention_mask, "use_cache": cache is not None}
        kwargs = {k: v for k, v in kwargs.items() if k in self._takes}
        if self._cache_keyword is not None and cache is not None:
            kwargs[self._cache_keyword] = cache
        return kwargs

    def forward(self, input_ids, position_ids, attention_mask, cache, logits_to_keep=0):
        self.forwards += 1
        out = self.model(input_ids=input_ids, **self._inputs(position_ids, attention_mask, cache))
        logits = out.logits if hasattr(out, "logits") else out[0]
        return logits[:, -logits_to_keep:] if logits_to_keep else logits


def tiny_bidirectional(*, logit_shift: int = 0, **kwargs: Any) -> HFMaskedDiffusionLM:
    """A tiny random bidirectional Qwen3 as an LLaDA-style (shift 0) or Dream-style (shift 1) model."""
    from refusion.models.tiny import tiny_qwen3

    model = tiny_qwen3(**kwargs)
    model.config.is_causal = False
    return HFMaskedDiffusionLM(model, logit_shift=logit_shift)


@hookimpl
def register_model_adapters(register):
    register(HFMaskedDiffusionLM)
