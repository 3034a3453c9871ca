"""Adapter for canvas-denoising LMs: a causal encoder writes the context, a denoiser re-decides a whole canvas.

DiffusionGemma (transformers' ``DiffusionGemmaForBlockDiffusion``) decodes an
answer canvas by canvas: the encoder runs causally over the prompt and every
finished canvas and keeps their keys/values in a transformers ``Cache``; the
denoiser reads that cache (without writing it) and proposes every position of
the current canvas at once, attending bidirectionally inside it, with the
previous step's logits as self-conditioning. There is no mask token: a canvas
starts as (and is re-noised with) uniformly random tokens.

:class:`CanvasDenoiserLM` states that contract (``capabilities.denoiser``);
the ``denoiser`` engine (:mod:`refusion.engines.denoiser`) runs its two calls
and :class:`~refusion.decoding.denoising.DenoisingSession` decodes with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from refusion.errors import ConfigError
from refusion.models.base import ModelAdapter, ModelCapabilities
from refusion.models.hf import eos_ids

#: the mask id a canvas-denoising model reports: it has none (no token id equals it)
NO_MASK = -1


class CanvasDenoiserLM(ModelAdapter):
    """A transformers ``DiffusionGemmaForBlockDiffusion`` (or a network with its ``model.encoder`` /
    ``model.decoder`` split and the same ``forward`` keywords) as a canvas-denoising LM.

    ``canvas_length`` is the model's (``config.canvas_length``): it is the
    block of ``capabilities.block_length``. ``mask_token_id`` is
    :data:`NO_MASK`. Every call below increments ``forwards`` by one.
    """

    name = "hf-denoiser"

    def __init__(self, model: Any, tokenizer: Any | None = None, *, eos_token_id: int | Iterable[int] | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        text = model.config.get_text_config(decoder=True)
        self.text_config = text
        self.vocab_size = int(text.vocab_size)
        self.canvas_length = int(model.config.canvas_length)
        self.mask_token_id = NO_MASK
        self.eos_token_ids = eos_ids(eos_token_id, model, tokenizer, self.vocab_size)
        self.max_positions = getattr(text, "max_position_embeddings", None)
        self.capabilities = ModelCapabilities(
            causal=False, logit_shift=0, kv_cache=True, block_length=self.canvas_length, denoiser=True
        )
        self.forwards = 0
        self.preset = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def embedding_dtype(self) -> torch.dtype:
        """The dtype the self-conditioning logits are fed back in (the denoiser's embedding table's)."""
        return self.model.model.decoder.embed_tokens.weight.dtype

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.text_config)

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any, positions: torch.Tensor | None = None
    ) -> Any:
        """Run the causal encoder over ``input_ids`` ``(batch, n)``, the entries not yet in ``cache``.

        ``attention_mask`` ``(batch, cached + n)`` (bool, 1 = attend) covers the
        cached entries and these (a batch of sequences: padding is 0). Positions continue after the cache
        (``positions`` ``(batch, n)``: each row's own). Returns the extended cache (transformers may return the
        same object).
        """
        self.forwards += 1
        cached = attention_mask.shape[1] - input_ids.shape[1]
        if positions is None:
            positions = torch.arange(cached, attention_mask.shape[1], dtype=torch.int32, device=input_ids.device)[None]
        encoder = self.model.model.encoder
        shape_only = torch.empty((input_ids.shape[0], input_ids.shape[1], 0), dtype=self.model.dtype)
        masks = encoder.create_masks_for_generate(
            config=self.model.config,
            inputs_embeds=shape_only.to(input_ids.device),
            attention_mask=attention_mask,
            cache=cache,
            position_ids=positions,
            mm_token_type_ids=None,
        )
        out = encoder(input_ids=input_ids, attention_mask=masks, cache=cache, position_ids=positions)
        return out.cache

    def canvas_mask(self, canvas: torch.Tensor, attention_mask: torch.Tensor, cache: Any) -> Any:
        """The denoiser's attention masks for ``canvas`` over ``cache``; ``attention_mask`` ``(batch, cached +
        canvas)`` (bool). Computed once per canvas (it depends on the cache, not on the canvas's tokens)."""
        return self.model.model.decoder.create_diffusion_decoder_attention_mask(
            config=self.model.config,
            inputs_embeds=canvas.unsqueeze(-1),
            cache=cache,
            decoder_attention_mask=attention_mask,
        )

    def denoise(
        self,
        canvas: torch.Tensor,
        start: int | torch.Tensor,
        masks: Any,
        cache: Any,
        self_conditioning: torch.Tensor | None,
        conditioned: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The denoiser's float32 logits ``(batch, canvas, vocab)`` for ``canvas`` ``(batch, canvas)`` at positions
        ``start:start + canvas`` after the cached context (``start`` entries; a ``(batch,)`` tensor: each row's),
        given the previous step's (processed) logits as ``self_conditioning`` (``None`` at a canvas's first step;
        ``conditioned`` ``(batch,)`` bool: which rows have them, the others' are ignored); ``masks`` from
        :meth:`canvas_mask`. Reads ``cache`` without changing it."""
        self.forwards += 1
        steps = torch.arange(canvas.shape[1], dtype=torch.int32, device=canvas.device)
        if isinstance(start, torch.Tensor):
            positions = start.to(device=canvas.device, dtype=torch.int32)[:, None] + steps[None]
        else:
            positions = (steps + start)[None]
        extra = {} if conditioned is None else {"self_conditioning_mask": conditioned.to(canvas.device)}
        out = self.model(
            decoder_input_ids=canvas,
            self_conditioning_logits=self_conditioning,
            decoder_attention_mask=masks,
            cache=cache,
            decoder_position_ids=positions,
            **extra,
        )
        return out.logits

    def forward(self, input_ids, position_ids, attention_mask, cache, logits_to_keep=0):
        raise ConfigError(
            f"{type(self).__name__} denoises whole canvases (encode, then denoise): it has no single forward that "
            "plan-and-infill engines can call. Decode it with the 'denoiser' engine (the default for it).",
            param="engine",
        )
