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
    """Decode the prompts together: the results, the sessions and how many forwards a batched form fed
    (``columnar=False``: every session as its per-sequence program, none)."""
    from refusion.decoding.loop import DecodeLoop, run_to_end
    from refusion.engines import open_engine

    prepared = [decoder.prepare(model, p, gen_length) for p in prompts]
    engine = open_engine(model, decoder, None)
    loop = DecodeLoop(engine, batched=columnar)
    sessions = [decoder.start(model, engine, p) for p in prepared]
    return run_to_end(loop, sessions), sessions, loop.batched_forwards


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


#: decoder options for every path a session can take on the branch engine: the lossless loop, the plan-and-infill
#: loop (greedy and sampled) and a per-sequence program
SESSION_PATHS = {
    "lossless loop": dict(selector="leftmost", infiller="greedy-verify", slot_size=2),
    "plan-and-infill loop": dict(slot_size=2, slot_threshold=0.5, token_threshold=0.5),
    "sampled plan-and-infill loop": dict(slot_size=2, slot_threshold=0.5, token_threshold=0.5, temperature=0.9),
    "program (random selector, re-encoding)": dict(selector="random", k=2, reorderer="reencode", slot_size=2),
}


def draw_paged_setup(data, path: str, vocab: int = 16):
    """``(model, decoder, page_size)`` drawn for a paged-engine property: a tiny model of ``vocab`` tokens (with or
    without EOS), the decoder of :data:`SESSION_PATHS` ``[path]``, pages of 1-4 tokens."""
    from refusion.decoding.decoder import Decoder

    model = tiny(vocab=vocab, seed=data.draw(st.integers(0, 500)), eos=data.draw(st.sampled_from([None, 2])))
    return model, Decoder.from_names(**SESSION_PATHS[path]), data.draw(st.integers(1, 4))


@st.composite
def layouts(draw):
    """(slot_size, serial_num_blocks, gen_length) that fit together; the last slot may be shorter."""
    slot = draw(st.integers(1, 5))
    blocks = draw(st.integers(1, 3))
    slots_per_block = draw(st.integers(1, 3))
    total = slot * blocks * slots_per_block
    gen_length = draw(st.integers(max(1, total - slot + 1), total))
    return slot, blocks, gen_length
