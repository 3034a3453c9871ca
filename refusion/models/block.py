"""Adapter for block-diffusion LMs: bidirectional attention inside a block, causal across blocks.

SDAR, Fast-dLLM v2 and LLaDA2-style models decode a block of masks at a time;
a token sees every token of its own block and of the blocks before it, never
a later block, so the keys/values of finished blocks are exact and can be
cached. Two layouts of the blocks (``layout``):

- ``"absolute"`` (SDAR): blocks of ``block_length`` from position 0, over the
  prompt too; the block that holds the prompt's last tokens is finished by
  the first generation block.
- ``"prompt"``: the prompt is block 0 (bidirectional inside); the generation
  region is cut into blocks of ``block_length`` from its first position.

The adapter builds the 4-D masks (:meth:`HFBlockDiffusionLM.block_mask`) that
the ``block`` engine (:mod:`refusion.engines.block`) passes to the network:
bool for ``sdpa``, additive float for ``eager``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import torch

from refusion.errors import bad_value
from refusion.models.base import ModelCapabilities
from refusion.models.hf import HFCausalLM
from refusion.plugins import hookimpl
from refusion.validators import is_integer

LAYOUTS = ("absolute", "prompt")


def block_ids(positions: torch.Tensor, prompt_length: int, block_length: int, layout: str = "prompt") -> torch.Tensor:
    """Block of each absolute position: ``p // block_length`` (``"absolute"``); for ``"prompt"``, 0 for the prompt
    and ``1 + (p - prompt_length) // block_length`` after it."""
    if layout == "absolute":
        return positions.div(block_length, rounding_mode="floor")
    after = (positions - prompt_length).clamp_min(-1)
    return torch.where(
        positions < prompt_length, torch.zeros_like(positions), 1 + after.div(block_length, rounding_mode="floor")
    )


class HFBlockDiffusionLM(HFCausalLM):
    """A Hugging Face network used as a block-diffusion LM with blocks of ``block_length``.

    The network must accept a 4-D ``attention_mask`` of shape
    ``(batch, 1, q, cached + q)`` (transformers models with ``sdpa`` or
    ``eager`` attention do) and a transformers ``Cache``. ``logit_shift`` 0:
    its logits at a mask predict that position (SDAR, LLaDA 2.x); 1: they
    predict the next position (Fast-dLLM v2's token shift), so a block's
    first position is predicted from the last position of the block before.
    """

    name = "hf-block"

    def __init__(
        self,
        model: Any,
        tokenizer: Any | None = None,
        *,
        block_length: int = 4,
        layout: str = "prompt",
        mask_token_id: int | None = None,
        eos_token_id: int | Iterable[int] | None = None,
        logit_shift: int = 0,
    ):
        if logit_shift not in (0, 1):
            raise bad_value("logit_shift", logit_shift, "0 (SDAR, LLaDA 2.x) or 1 (Fast-dLLM v2's token shift)")
        if not is_integer(block_length) or block_length < 1:
            raise bad_value("block_length", block_length, "an integer >= 1 (the block size the model was trained with)")
        if layout not in LAYOUTS:
            raise bad_value("layout", layout, f"one of {', '.join(map(repr, LAYOUTS))}")
        super().__init__(model, tokenizer, mask_token_id=mask_token_id, eos_token_id=eos_token_id)
        self.block_length = block_length
        self.layout = layout
        self.capabilities = ModelCapabilities(
            causal=False, logit_shift=logit_shift, kv_cache=True, block_length=block_length
        )

    def with_block_length(self, block_length: int) -> HFBlockDiffusionLM:
        """The same network attending in blocks of ``block_length`` (shared weights, tokenizer and ids): what a
        peer's call sets when its code builds the attention mask from its own ``block_length`` (LLaDA 2.x's
        ``generate``). Returns ``self`` when the length is already the adapter's."""
        import copy

        if not is_integer(block_length) or block_length < 1:
            raise bad_value("block_length", block_length, "an integer >= 1")
        if block_length == self.block_length:
            return self
        twin = copy.copy(self)
        twin.block_length = block_length
        twin.capabilities = attrs.evolve(self.capabilities, block_length=block_length)
        return twin

    def block_start(self, position: int, prompt_length: int) -> int:
        """The first position of the model block that holds ``position``."""
        if self.layout == "absolute":
            return position - position % self.block_length
        if position < prompt_length:
            return 0
        return position - (position - prompt_length) % self.block_length

    def block_mask(
        self, query_positions: torch.Tensor, key_positions: torch.Tensor, prompt_length: int
    ) -> torch.Tensor:
        """The 4-D mask ``(1, 1, q, k)``: a query attends to keys of its own block and of earlier blocks."""
        q = block_ids(query_positions, prompt_length, self.block_length, self.layout)
        k = block_ids(key_positions, prompt_length, self.block_length, self.layout)
        allowed = (k[None, :] <= q[:, None])[None, None].to(self.device)
        from refusion.engines.ragged import own_attention

        if own_attention(self.model.config) == "eager":
            dtype = next(self.model.parameters()).dtype
            return torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )
        return allowed


def tiny_block_diffusion(
    *, block_length: int = 4, layout: str = "prompt", logit_shift: int = 0, **kwargs: Any
) -> HFBlockDiffusionLM:
    """A tiny random Qwen3 (:func:`refusion.models.tiny.tiny_qwen3` arguments) used as a block-diffusion model."""
    from refusion.models.tiny import tiny_qwen3

    return HFBlockDiffusionLM(tiny_qwen3(**kwargs), block_length=block_length, layout=layout, logit_shift=logit_shift)


@hookimpl
def register_model_adapters(register):
    register(HFBlockDiffusionLM)
