"""The named presets: the reference's per-task settings and the peers' decoders, as :class:`DecoderSpec` s.

Each is defined by its part names and flat parameters (routed to the parts
that declare them when the preset is first used) and built lazily, so that
listing the names (``sorted(PRESETS)``) imports no part.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from refusion.config.build import PART_KINDS
from refusion.config.spec import DecoderSpec
from refusion.errors import unknown_name

Preset = DecoderSpec
"""A preset is a :class:`~refusion.config.spec.DecoderSpec` (the name is kept for the public API)."""


#: how ReFusion's reference computes its decisions: softmax in the logits' dtype, torch.topk over the block's slots
REFERENCE_ARITHMETIC = dict(precision="logits", ties="slots")
#: how Dream's sample_tokens computes at temperature 0: softmax in the logits' dtype after its top-k filter (50: the
#: model config's generation default in transformers 4), the token the argmax of those probabilities
DREAM_ARITHMETIC = dict(precision="logits", argmax="probabilities", confidence_top_k=50)


def _paper(task: str, slot_size: int, blocks: int, slot_t: float, token_t: float) -> dict:
    return dict(
        description=f"ReFusion public eval setting for {task}: slot_size={slot_size}, serial_num_blocks={blocks}, "
        f"slot_threshold={slot_t}, token_threshold={token_t}, gen_length=512",
        gen_length=512,
        params=dict(
            slot_size=slot_size,
            serial_num_blocks=blocks,
            slot_threshold=slot_t,
            token_threshold=token_t,
            **REFERENCE_ARITHMETIC,
        ),
        peer="refusion.generate_refusion",
    )


#: LLaDA 2.x's layout: the model's blocks of 32 from position 0, one token per slot, the last block decoded whole
LLADA2_BLOCKS = dict(block_length=32, slot_size=1, align="absolute", pad=True)

#: The reference's per-task settings (ML-GSAI/ReFusion eval scripts), plus its function defaults.
DEFINITIONS: dict[str, dict] = {
    "paper": dict(
        description="defaults of the reference generate_refusion: slot_size=8, serial_num_blocks=2, "
        "slot_threshold=0.9, token_threshold=0.9, gen_length=128",
        gen_length=128,
        params=dict(slot_size=8, serial_num_blocks=2, slot_threshold=0.9, token_threshold=0.9, **REFERENCE_ARITHMETIC),
        peer="refusion.generate_refusion",
    ),
    "gsm8k": _paper("GSM8K", 32, 4, 0.9, 0.4),
    "mbpp": _paper("MBPP", 32, 4, 0.9, 0.3),
    "humaneval": _paper("HumanEval", 32, 4, 0.9, 0.4),
    "math": _paper("MATH", 32, 8, 0.8, 0.6),
    "gpqa": _paper("GPQA", 8, 32, 0.8, 0.2),
    "arc-c": _paper("ARC-C", 8, 64, 0.8, 0.1),
    "mmlu-pro": _paper("MMLU-Pro", 16, 4, 0.9, 0.4),
    "llada": dict(
        description="LLaDA (arXiv 2502.09992, generate.py): semi-AR blocks of `block_length` 32, `steps` 128 spread "
        "evenly over blocks and masks, `remasking` low_confidence (or random), Gumbel-max `temperature`, "
        "`cfg_scale`; every position decoded, the answer cut at the first EOS afterwards",
        gen_length=128,
        params=dict(
            block_length=32,
            slot_size=1,
            steps=128,
            remasking="low_confidence",
            sampler="gumbel",
            stop_at_eos=False,
            precision="logits",
            ties="canvas",
        ),
        partitioner="semi-ar",
        selector="llada-steps",
        infiller="draft",
        reorderer="no-cache",
        peer="llada.generate",
    ),
    "wino": dict(
        description="WINO (arXiv 2507.18578, Feng-Hong/WINO-DLLM decoding_wino): semi-AR blocks of `block_length` 32; "
        "each step accepts every masked position whose draft probability is > `threshold` (wide in, at most "
        "0.7 of the block's masks, 5 to 20) and masks again earlier tokens whose leave-one-out probability is < "
        "`threshold_back` (narrow out); Gumbel-max `temperature`; for models with logit shift 0 (LLaDA)",
        gen_length=128,
        params=dict(
            block_length=32,
            slot_size=1,
            threshold=0.6,
            threshold_back=0.9,
            sampler="gumbel",
            stop_at_eos=False,
            precision="float64",
        ),
        partitioner="semi-ar",
        selector="wino",
        infiller="draft",
        reorderer="no-cache",
        reviser="wino",
        peer="wino.decoding_wino",
    ),
    "dream": dict(
        description="Dream (arXiv 2508.15487, diffusion_generate): one block over the answer, `steps` 128 on the "
        "timesteps linspace(1, `eps` 1e-3), `alg` entropy (origin / maskgit_plus / topk_margin / entropy), "
        "`temperature`/`top_p`/`top_k`; for models with logit shift 1; the answer cut at the first EOS afterwards",
        gen_length=128,
        params=dict(
            slot_size=1,
            serial_num_blocks=1,
            steps=128,
            eps=1e-3,
            alg="entropy",
            stop_at_eos=False,
            **DREAM_ARITHMETIC,
            ties="canvas",
        ),
        partitioner="fixed",
        selector="dream-steps",
        infiller="draft",
        reorderer="no-cache",
        peer="dream.diffusion_generate",
    ),
    "fast-dllm": dict(
        description="Fast-dLLM (arXiv 2505.22618, generate with `threshold`): blocks of `block_length` 32, every "
        "token with confidence >= `threshold` 0.9 per step (else the best), no cache on bidirectional models "
        "(exact prefix cache on causal ones); the answer cut at the first EOS afterwards",
        gen_length=128,
        params=dict(
            block_length=32,
            slot_size=1,
            slot_threshold=0.9,
            inclusive=True,
            sampler="gumbel",
            stop_at_eos=False,
            precision="float64",
            ties="canvas",
        ),
        partitioner="semi-ar",
        infiller="draft",
        peer="fast_dllm.generate",
    ),
    "credit": dict(
        description="CreditDecoding (arXiv 2510.06133, dInfer's CreditThresholdParallelDecoder on "
        "BlockWiseDiffusionLLM, no cache): blocks of `block_length` 32; each step the block's logits fused with "
        "`credit_alpha` 0.7 x log(1 + credit), a position's credit growing by its top-1 probability ** "
        "`boost_gamma` 0.2 while masked and decaying by `decay_beta` 0.8 per step; every masked token whose "
        "fused confidence >= `threshold` 0.9 (always the best); for models with logit shift 0 (LLaDA)",
        gen_length=128,
        params=dict(
            block_length=32,
            slot_size=1,
            threshold=0.9,
            sampler="gumbel",
            stop_at_eos=False,
            precision="logits",
        ),
        partitioner="semi-ar",
        selector="credit",
        infiller="draft",
        reorderer="no-cache",
        peer="dinfer.credit",
    ),
    "d3llm": dict(
        description="d3LLM's multi-block decoding (arXiv 2601.07568, generate_multi_block, no cache): the whole "
        "answer on a full-attention canvas, blocks of `block_size` 32 added as the last passes "
        "`block_add_threshold` 0.5 of progress and fully activated as the one before passes "
        "`decoded_token_threshold` 0.5; each step the lowest-entropy mask of the blocks in flight and every one "
        "of entropy <= `threshold` 0.5, plus the first active block's best when it got none; for models with "
        "logit shift 0 (LLaDA); the answer cut at the first EOS afterwards",
        gen_length=256,
        params=dict(
            slot_size=1,
            serial_num_blocks=1,
            threshold=0.5,
            block_size=32,
            block_add_threshold=0.5,
            decoded_token_threshold=0.5,
            sampler="gumbel",
            stop_at_eos=False,
            precision="logits",
        ),
        partitioner="fixed",
        selector="d3llm",
        infiller="draft",
        reorderer="no-cache",
        peer="d3llm.generate_multi_block",
    ),
    "fast-dllm-dream": dict(
        description="Fast-dLLM's block decoder for Dream (generation_utils_block.py): blocks of `block_length` 32, "
        "each starting with its first token, then every token with confidence >= `threshold` 0.9 (`alg` "
        "confidence_threshold) or Dream's entropy schedule over `steps`; prefix cache (`dual_cache=True`: dual); "
        "for models with logit shift 1; the answer cut at the first EOS afterwards",
        gen_length=128,
        params=dict(
            block_length=32,
            slot_size=1,
            alg="confidence_threshold",
            threshold=0.9,
            steps=128,
            prefix_at_block=True,
            stop_at_eos=False,
            **DREAM_ARITHMETIC,
            ties="suffix",
        ),
        partitioner="semi-ar",
        selector="dream-blocks",
        infiller="draft",
        reorderer="prefix-cache",
        peer="fast_dllm.dream_block_generate",
    ),
    "sdar": dict(
        description="SDAR (block_diffusion_generate): the model's blocks (4) from position 0, the last one decoded "
        "whole (`pad`, as SDAR pads the answer to the block grid), `denoising_steps` 4 per block, "
        "`remasking_strategy` low_confidence_dynamic (`confidence_threshold` 0.85), multinomial sampling at "
        "`temperature` 1.0 as SDAR; stops after the block with an EOS (`stopping_criteria_idx`, as SDAR's script)",
        gen_length=128,
        params=dict(
            block_length=4,
            slot_size=1,
            align="absolute",
            pad=True,
            denoising_steps=4,
            remasking_strategy="low_confidence_dynamic",
            confidence_threshold=0.85,
            sampler="block-multinomial",
            temperature=1.0,
            stop_at_eos="block",
            ties="model-block",
        ),
        partitioner="semi-ar",
        selector="sdar-steps",
        infiller="draft",
        peer="sdar.block_diffusion_generate",
    ),
    "fast-dllm-v2": dict(
        description="Fast-dLLM v2 (its checkpoints' generate): the model's blocks (`block_length` 32) from position "
        "0, each decoded `small_block_size` 8 positions at a time: a block's first position by argmax from the "
        "block before (token shift), then in the first sub-block with masks every mask whose probability is > "
        "`threshold` (1: their generate's default, one position a step; their model card passes 0.9) and always "
        "the most probable one; stops after the block with an EOS, the answer cut after it",
        gen_length=128,
        params=dict(
            block_length=32,
            slot_size=1,
            align="absolute",
            threshold=1.0,
            small_block_size=8,
            precision="logits",
            argmax="probabilities",
            stop_at_eos="block",
        ),
        partitioner="semi-ar",
        selector="fast-dllm-v2",
        infiller="draft",
        peer="fast_dllm_v2.generate",
    ),
    "llada2": dict(
        description="LLaDA 2.0 (generate): the model's blocks (`block_length` 32) from position 0, `steps` 32 per "
        "block, step s due the block spread over the steps (earlier ones one more): every mask above `threshold` "
        "0.95 when at least that many, else the most confident ones due; `temperature`/`top_k`/`top_p` its "
        "multinomial draws over the block, draw for draw; stops after the block with an EOS",
        gen_length=128,
        params=dict(
            **LLADA2_BLOCKS,
            steps=32,
            threshold=0.95,
            sampler="block-multinomial",
            temperature=0.0,
            precision="float32",
            stop_at_eos="block",
        ),
        partitioner="semi-ar",
        selector="llada2-steps",
        infiller="draft",
        peer="llada2.generate",
    ),
    "llada2.1": dict(
        description="LLaDA 2.1 (generate, token-to-token editing): the model's blocks (`block_length` 32) from "
        "position 0; each step every mask whose argmax probability is > `threshold` 0.95 (else the most confident "
        "one) takes it, and every earlier token of the block whose argmax is another token with probability > "
        "`editing_threshold` 0.9 is replaced; up to `max_post_steps` 16 edit-only passes once a block is filled; "
        "`temperature`/`top_k`/`top_p` its draws over the block (mask transfers and edits alike), draw for draw; "
        "every block decoded, the answer cut at the first EOS afterwards",
        gen_length=128,
        params=dict(
            **LLADA2_BLOCKS,
            slot_threshold=0.95,
            editing_threshold=0.9,
            max_post_steps=16,
            sampler="block-multinomial",
            temperature=0.0,
            precision="float32",
            stop_at_eos=False,
            ties="model-block",
        ),
        partitioner="semi-ar",
        selector="threshold",
        infiller="draft",
        reviser="editing",
        peer="llada21.generate",
    ),
    "diffusion-gemma": dict(
        description="DiffusionGemma (transformers' DiffusionGemmaForBlockDiffusion.generate): canvases of the "
        "model's `canvas_length` from uniform noise; per step (`max_denoising_steps` 48 at most) a denoiser pass, "
        "the linear temperature `t_max` 0.8 -> `t_min` 0.4, a draw per position, the entropy-bound rule accepts "
        "(`entropy_bound` 0.1), the rest re-noised; a canvas stops when stable (`stability_threshold` 1) and "
        "confident (`confidence_threshold` 0.005); the canvas's argmax is sealed; stops after the canvas with an EOS "
        "(the denoising options are the `denoise` infiller's)",
        gen_length=256,
        params=dict(entropy_bound=0.1),
        selector="entropy-bound",
        infiller="denoise",
        reorderer="no-cache",
        peer="diffusion_gemma.generate",
    ),
    "ar": dict(
        description="left-to-right lossless decoding: equals greedy autoregressive decoding",
        gen_length=128,
        params=dict(slot_size=8, serial_num_blocks=1),
        selector="leftmost",
        infiller="greedy-verify",
    ),
}


DEFINITIONS["fast-dllm-prefix"] = dict(
    DEFINITIONS["fast-dllm"],
    description="Fast-dLLM threshold decoding with its prefix cache (generate_with_prefix_cache), for bidirectional "
    "models",
    reorderer="prefix-cache",
    params=dict(DEFINITIONS["fast-dllm"]["params"], ties="canvas-then-suffix"),
    peer="fast_dllm.generate_with_prefix_cache",
)
DEFINITIONS["dkv"] = dict(
    DEFINITIONS["llada"],
    description="dKV-Cache-Decode (arXiv 2505.15781, horseee/dKV-Cache llada_dkv_cache_decode.generate): "
    "LLaDA's semi-AR blocks and step schedule (`steps` 128, `block_length` 32, low_confidence, float64 "
    "confidences), a decoded token's keys/values cached one step after it is decoded and refreshed every "
    "`cache_reloading_step` 8 steps; for models with logit shift 0 (LLaDA); the answer cut at the first EOS "
    "afterwards",
    params=dict(DEFINITIONS["llada"]["params"], precision="float64", cache_reloading_step=8),
    reorderer="dkv",
    peer="dkv.generate",
)
DEFINITIONS["d3llm-kv"] = dict(
    DEFINITIONS["d3llm"],
    description="d3LLM's multi-block decoding with its delayed KV cache (generate_multi_block_kv_cache): the "
    "`d3llm` preset, and the prefix of finished blocks cached `cache_delay_iter` 2 steps after it finished, the "
    "whole canvas refreshed every `refresh_interval` 4 steps and while a block waits (d3LLM's LLaDA HumanEval "
    "settings); for models with logit shift 0 (LLaDA); the answer cut at the first EOS afterwards",
    params=dict(DEFINITIONS["d3llm"]["params"], cache_delay_iter=2, refresh_interval=4),
    reorderer="periodic",
    peer="d3llm.generate_multi_block_kv_cache",
)
DEFINITIONS["d2f"] = dict(
    description="D2F's pipelined block decoding (Discrete Diffusion Forcing, arXiv 2508.09192, "
    "eval_llada.py _generate_block_single): blocks of `block_size` 32 attending block-causally, added as the last "
    "passes `block_add_threshold` 0.1 of progress and fully activated as the one before passes "
    "`decoded_token_threshold` 0.95; in every block the masks of probability > `skip_threshold` 0.9, a fully "
    "activated block's most confident when it got none; finished blocks cached exactly (the authors' LLaDA "
    "HumanEval settings); for models with logit shift 0 (D2F's LLaDA; `d2f-dream` for Dream); the answer cut at "
    "the first EOS afterwards",
    gen_length=256,
    params=dict(
        slot_size=1,
        serial_num_blocks=1,
        block_size=32,
        block_add_threshold=0.1,
        decoded_token_threshold=0.95,
        skip_threshold=0.9,
        stop_at_eos=False,
        precision="logits",
        argmax="probabilities",
    ),
    partitioner="fixed",
    selector="d2f",
    infiller="draft",
    reorderer="block-causal",
    peer="d2f.generate_block",
)
DEFINITIONS["d2f-dream"] = dict(
    DEFINITIONS["d2f"],
    description="D2F's pipelined block decoding for Dream (eval_dream.py _generate_block_single): the `d2f` "
    "preset on a model with logit shift 1 (the last cached position, whose output predicts the next one, fed "
    "again); the answer cut at the first EOS afterwards",
    peer="d2f.generate_block_dream",
)
DEFINITIONS["fast-dllm-dual"] = dict(
    DEFINITIONS["fast-dllm"],
    description="Fast-dLLM threshold decoding with its dual cache (generate_with_dual_cache), for bidirectional models",
    reorderer="dual-cache",
    params=dict(DEFINITIONS["fast-dllm"]["params"], ties="canvas-then-serial-block"),
    peer="fast_dllm.generate_with_dual_cache",
)


class _Presets(Mapping):
    """The presets by name; each :class:`DecoderSpec` is built the first time it is looked up."""

    def __init__(self, definitions: Mapping[str, dict]):
        self._definitions = definitions
        self._built: dict[str, DecoderSpec] = {}

    def __getitem__(self, name: str) -> DecoderSpec:
        if name not in self._built:
            definition = dict(self._definitions[name])
            params = definition.pop("params")
            parts = {kind: definition.pop(kind) for kind in PART_KINDS if kind in definition}
            spec = DecoderSpec.of_parts(**parts, **definition).with_params(params)
            self._built[name] = spec
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._definitions)

    def __len__(self) -> int:
        return len(self._definitions)


PRESETS: Mapping[str, DecoderSpec] = _Presets(DEFINITIONS)
"""The named presets, by name: each a :class:`~refusion.config.spec.DecoderSpec`, built when first looked up."""


def preset(name: str) -> DecoderSpec:
    """The preset called ``name``; the error lists the known ones."""
    if name not in PRESETS:
        raise unknown_name("preset", name, PRESETS)
    return PRESETS[name]


def load_preset(path: Any) -> DecoderSpec:
    """A preset from a JSON file: a checkpoint's ``refusion.json``, ``--preset-file``, a sweep's ``preset.json``
    (:meth:`DecoderSpec.load`; the earlier ``{gen_length, params, part names}`` files are read too)."""
    return DecoderSpec.load(path)
