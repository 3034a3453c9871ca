"""Shared builders for the tests."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from refusion.models.hf import HFCausalLM
from refusion.models.tiny import tiny_qwen3

MASK_NOTE = "refusion never drafts the mask token; AR references suppress it too"


def tiny(vocab=24, seed=0, scale=8.0, eos=None, **kw) -> HFCausalLM:
    return HFCausalLM(tiny_qwen3(vocab_size=vocab, seed=seed, logit_scale=scale, eos_token_id=eos, **kw))


def decode_counting_loop_forwards(decoder, model, prompts, gen_length, *, columnar):
    """``drive`` the prompts together: the results, the sessions and how many whole-batch loop forwards ran
    (``run_flat`` calls; ``columnar=False``: every session as its per-sequence program, none)."""
    from refusion.engines import drive, open_engine

    prepared = [decoder.prepare(model, p, gen_length) for p in prompts]
    engine = open_engine(model, decoder, None)
    calls = []
    run_flat = engine.run_flat
    engine.run_flat = lambda *a: calls.append(1) or run_flat(*a)
    sessions = [decoder.start(model, engine, p) for p in prepared]
    return drive(engine, sessions, columnar=columnar), sessions, len(calls)


def hf_greedy(adapter: HFCausalLM, prompt, max_new_tokens):
    """transformers' own greedy generate with a KV cache (mask token suppressed)."""
    eos = sorted(adapter.eos_token_ids) or None
    out = adapter.model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=adapter.mask_token_id,
        suppress_tokens=[adapter.mask_token_id],
    )
    gen = out[0, len(prompt) :].tolist()
    if eos:
        for i, t in enumerate(gen):
            if t in eos:
                return gen[: i + 1]
    return gen


@st.composite
def model_setups(draw, eos_choices=(None, 2)):
    vocab = draw(st.sampled_from([8, 16, 32]))
    seed = draw(st.integers(0, 10_000))
    scale = draw(st.sampled_from([2.0, 6.0, 12.0, 24.0]))
    eos = draw(st.sampled_from(eos_choices))
    prompt = draw(st.lists(st.integers(0, vocab - 2), min_size=1, max_size=7))
    return tiny(vocab=vocab, seed=seed, scale=scale, eos=eos), prompt


@st.composite
def layouts(draw):
    """(slot_size, serial_num_blocks, gen_length) that fit together; the last slot may be shorter."""
    slot = draw(st.integers(1, 5))
    blocks = draw(st.integers(1, 3))
    slots_per_block = draw(st.integers(1, 3))
    total = slot * blocks * slots_per_block
    gen_length = draw(st.integers(max(1, total - slot + 1), total))
    return slot, blocks, gen_length
