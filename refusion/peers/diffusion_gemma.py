"""transformers' ``DiffusionGemmaForBlockDiffusion.generate`` as the ``diffusion-gemma`` preset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.peers.base import PeerCall, PeerFunction, check_eos_ids, check_no_padding, length_argument, refuse, taken

NAME = "transformers' DiffusionGemmaForBlockDiffusion.generate"

#: arguments of generate that change how it is run, not which tokens it gives
NEUTRAL = ("return_dict_in_generate", "disable_compile", "pad_token_id", "bos_token_id")


def translate_generate(args: Mapping[str, Any], model: Any) -> PeerCall:
    """``max_denoising_steps``, ``t_min``, ``t_max``, ``stability_threshold`` and ``confidence_threshold`` keep
    their names (decoder options); ``sampler_config`` (an ``EntropyBoundSamplerConfig`` or its dict) gives the
    ``entropy-bound`` selector's ``entropy_bound``; ``max_new_tokens`` is the generation length (rounded up to
    whole canvases, as generate does); ``eos_token_id`` must be the model's. What only changes how generate
    runs (``return_dict_in_generate``, ``disable_compile``, ``pad_token_id``, ``bos_token_id``) is accepted;
    the rest is refused, naming it."""
    if model is not None and not model.capabilities.denoiser:
        raise refuse(
            NAME,
            "model",
            type(model).__name__,
            "it decodes canvas-denoising models (DiffusionGemma) only; the `entropy-bound` selector runs on others.",
        )
    params: dict[str, Any] = taken(
        args, "max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold"
    )
    sampler = args.get("sampler_config")
    if sampler is not None:
        bound = (
            sampler.get("entropy_bound") if isinstance(sampler, Mapping) else getattr(sampler, "entropy_bound", None)
        )
        if bound is None:
            raise refuse(
                NAME,
                "sampler_config",
                sampler,
                "an EntropyBoundSamplerConfig (with `entropy_bound`) is the one sampler it takes.",
            )
        params["entropy_bound"] = bound
    check_eos_ids(NAME, "eos_token_id", args.get("eos_token_id"), model)
    check_no_padding(NAME, args.get("attention_mask"))
    if args.get("max_length") is not None:
        raise refuse(NAME, "max_length", args["max_length"], "give the answer's length as `max_new_tokens`.")
    if args.get("cache_implementation") is not None:
        raise refuse(
            NAME,
            "cache_implementation",
            args["cache_implementation"],
            "the 'denoiser' engine keeps each sequence's context in transformers' dynamic cache.",
        )
    for arg in ("decoder_input_ids", "self_conditioning_logits", "logits_processor", "stopping_criteria", "streamer"):
        if args.get(arg) is not None:
            raise refuse(
                NAME,
                arg,
                type(args[arg]).__name__,
                "canvases start from the prompt's own noise and stop by the decoder's options; stream with "
                "refusion's generator or `refusion serve`.",
            )
    return PeerCall(params=params, gen_length=length_argument(args))


GENERATE = PeerFunction(
    name="diffusion_gemma.generate",
    preset="diffusion-gemma",
    source="transformers models/diffusion_gemma/generation_diffusion_gemma.py: DiffusionGemmaGenerationMixin.generate",
    arguments=(
        "max_new_tokens",
        "max_length",
        "max_denoising_steps",
        "sampler_config",
        "t_min",
        "t_max",
        "stability_threshold",
        "confidence_threshold",
        "eos_token_id",
        "attention_mask",
        "cache_implementation",
        "decoder_input_ids",
        "self_conditioning_logits",
        "logits_processor",
        "stopping_criteria",
        "streamer",
        *NEUTRAL,
    ),
    translate=translate_generate,
    requires={"denoiser": True},
)

FUNCTIONS = (GENERATE,)
