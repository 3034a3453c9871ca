"""Train a small Qwen3-architecture ReFusion model on the synthetic tasks, on the CPU.

``train(TrainConfig(), out_dir)`` builds the model from the config, trains it
with :mod:`refusion.training.objective` and saves weights (safetensors),
config and tokenizer, ready for :class:`refusion.models.hf.HFCausalLM`.
Same seed and same torch thread count give the same weights.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

import attrs
import torch

from refusion.training.objective import ar_example, collate, refusion_example, refusion_loss
from refusion.training.tasks import MAX_ANSWER, TASKS, examples, held_out
from refusion.training.tokenizer import char_tokenizer
from refusion.validators import positive_int


@attrs.frozen
class TrainConfig:
    """Model size, data and optimisation settings. Defaults reproduce the shipped model."""

    seed: int = 0
    steps: int = attrs.field(default=8000, validator=positive_int)
    batch_size: int = attrs.field(default=64, validator=positive_int)
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.01
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    answer_region: int = 32  # answers are padded with EOS to this many tokens
    slot_sizes: tuple[int, ...] = attrs.field(default=(2, 4, 8), converter=tuple)
    ar_fraction: float = 0.25
    tasks: tuple[str, ...] = attrs.field(default=tuple(TASKS), converter=tuple)
    held_out_per_task: int = 100


#: Decoding settings shipped with the trained model (its ``refusion.json``, a decoder spec, written from these
#: flat parameters of the paper preset); see benchmarks/ar_vs_refusion.py.
RECOMMENDED_DECODING = {
    "description": "paper strategies tuned on the synthetic held-out tasks (answers fit 32 tokens)",
    "gen_length": 32,
    "params": {"slot_size": 4, "serial_num_blocks": 1, "slot_threshold": 0.7, "token_threshold": 0.5},
}


def recommended_spec() -> Any:
    """:data:`RECOMMENDED_DECODING` as the :class:`~refusion.config.spec.DecoderSpec` shipped beside the weights."""
    from refusion.config.spec import DecoderSpec

    return DecoderSpec.from_dict(RECOMMENDED_DECODING, where="RECOMMENDED_DECODING")


def build_model(config: TrainConfig, tokenizer: Any):
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    vocab = -(-len(tokenizer) // 8) * 8
    model_config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.hidden_size // config.num_heads,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model_config.mask_token_id = tokenizer.mask_token_id
    torch.manual_seed(config.seed)
    model = Qwen3ForCausalLM(model_config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def answer_tokens(tokenizer: Any, answer: str, region: int) -> list[int]:
    """Answer ids followed by EOS up to ``region`` tokens (at least one EOS)."""
    ids = encode(tokenizer, answer)
    if len(ids) >= region:
        raise ValueError(f"answer of {len(ids)} tokens does not fit an answer region of {region}")
    return ids + [tokenizer.eos_token_id] * (region - len(ids))


def train(config: TrainConfig, out_dir: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """Train and save to ``out_dir``; return a summary (steps, seconds, parameters, final losses)."""
    from tqdm.auto import tqdm

    if config.answer_region <= MAX_ANSWER:
        raise ValueError(f"`answer_region` must exceed the longest answer ({MAX_ANSWER}); got {config.answer_region}.")
    tokenizer = char_tokenizer()
    model = build_model(config, tokenizer)
    model.train()
    excluded = {e.prompt for e in held_out(config.held_out_per_task, tasks=config.tasks)}
    stream = (e for e in examples(config.seed, config.tasks) if e.prompt not in excluded)
    rng = random.Random(config.seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < config.warmup:
            return (step + 1) / config.warmup
        progress_frac = (step - config.warmup) / max(1, config.steps - config.warmup)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress_frac))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    start = time.perf_counter()
    bar = tqdm(range(config.steps), desc="refusion train", disable=not progress)
    smoothed: dict[str, float] = {}
    for _ in bar:
        batch_examples = []
        for _ in range(config.batch_size):
            ex = next(stream)
            prompt = encode(tokenizer, ex.prompt)
            answer = answer_tokens(tokenizer, ex.answer, config.answer_region)
            if rng.random() < config.ar_fraction:
                batch_examples.append(ar_example(prompt, answer))
            else:
                batch_examples.append(
                    refusion_example(
                        prompt, answer, rng, mask_token_id=tokenizer.mask_token_id, slot_sizes=config.slot_sizes
                    )
                )
        batch = collate(batch_examples, tokenizer.pad_token_id)
        logits = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
        ).logits
        loss, parts = refusion_loss(logits, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        for key, value in parts.items():
            smoothed[key] = value if key not in smoothed else 0.98 * smoothed[key] + 0.02 * value
        bar.set_postfix({k: f"{v:.3f}" for k, v in smoothed.items()})
    seconds = time.perf_counter() - start

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    summary = {
        "config": attrs.asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(seconds, 1),
        "torch_threads": torch.get_num_threads(),
        "final_loss": {k: round(v, 4) for k, v in smoothed.items()},
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2))
    recommended_spec().save(out / "refusion.json")
    return summary
