"""Each peer preset decodes, by default, token for token as the restated peer algorithm
(tests/support/peer_restatements.py)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import refusion
from tests.support import peer_restatements as peer
from tests.support.peer_models import EOS, MASK, peer_model

prompts = st.lists(st.integers(0, MASK - 1), min_size=1, max_size=5)


def decoded(result):
    """Every position of the region (the presets decode them all), and the answer cut at the first EOS."""
    return result.region_tokens, result.tokens.tolist()


def check(result, reference):
    every, answer = decoded(result)
    assert every == reference
    assert answer == peer.cut_at_eos(reference, EOS)


@settings(max_examples=6)
@given(
    seed=st.integers(0, 1000),
    prompt=prompts,
    block=st.sampled_from([4, 6]),
    blocks=st.integers(1, 2),
    per_block=st.integers(2, 5),
    eos_bias=st.sampled_from([0.0, 2.0]),
)
def test_llada_preset_equals_llada_with_uneven_step_schedules(seed, prompt, block, blocks, per_block, eos_bias):
    model = peer_model(seed, eos_bias=eos_bias)
    gen, steps = block * blocks, per_block * blocks
    result = refusion.generate(
        prompt, model, preset="llada", gen_length=gen, block_length=block, steps=steps, record=True
    )
    check(result, peer.llada(model.model, prompt, steps=steps, gen_length=gen, block_length=block, mask_id=MASK))
    assert (
        result.forwards == result.num_iterations
    )  # one full-canvas forward per step, steps that unmask nothing skipped
    schedule = [n for n in peer.llada_schedule(block, per_block) if n] * blocks
    assert [sum(n for _, n in s.committed) for s in result.iterations] == schedule


def test_llada_schedule_block_16_over_7_steps():
    from refusion.strategies.selectors.llada_steps import even_schedule

    assert even_schedule(16, 7) == [3, 3, 2, 2, 2, 2, 2] == peer.llada_schedule(16, 7)
    result = refusion.generate(
        [1, 2], peer_model(3), preset="llada", gen_length=16, block_length=16, steps=7, record=True
    )
    assert [sum(n for _, n in s.committed) for s in result.iterations] == [3, 3, 2, 2, 2, 2, 2]


def test_llada_preset_decodes_past_an_early_eos_and_cuts_afterwards():
    model = peer_model(5, eos_bias=3.0)
    prompt, gen = [4, 7], 12
    reference = peer.llada(model.model, prompt, steps=12, gen_length=gen, block_length=4, mask_id=MASK)
    assert EOS in reference[:-4]  # an early EOS, with positions decoded after it
    result = refusion.generate(prompt, model, preset="llada", gen_length=gen, block_length=4, steps=12, record=True)
    check(result, reference)
    early = refusion.generate(
        prompt, model, preset="llada", gen_length=gen, block_length=4, steps=12, stop_at_eos=True, record=True
    )
    assert early.num_iterations < result.num_iterations  # the early stop stays an option


@settings(max_examples=5)
@given(
    seed=st.integers(0, 1000),
    prompt=prompts,
    cfg=st.sampled_from([0.0, 0.5, 2.0]),
    temperature=st.sampled_from([0.0, 0.7, 1.0]),
    remasking=st.sampled_from(["low_confidence", "random"]),
    draw_seed=st.integers(0, 100),
)
def test_llada_preset_matches_cfg_and_seeded_gumbel_sampling_draw_for_draw(
    seed, prompt, cfg, temperature, remasking, draw_seed
):
    model = peer_model(seed, eos_bias=1.0)
    kwargs = dict(steps=6, gen_length=8, block_length=4)
    result = refusion.generate(
        prompt,
        model,
        preset="llada",
        cfg_scale=cfg,
        temperature=temperature,
        remasking=remasking,
        seed=draw_seed,
        **kwargs,
        record=True,
    )
    reference = peer.llada(
        model.model,
        prompt,
        mask_id=MASK,
        cfg_scale=cfg,
        temperature=temperature,
        remasking=remasking,
        generator=torch.Generator().manual_seed(draw_seed),
        **kwargs,
    )
    check(result, reference)


@settings(max_examples=8)
@given(
    seed=st.integers(0, 1000),
    prompt=prompts,
    alg=st.sampled_from(["origin", "maskgit_plus", "topk_margin", "entropy"]),
    steps=st.sampled_from([3, 5, 8, 11]),
    eps=st.sampled_from([1e-3, 0.1]),
    draw_seed=st.integers(0, 100),
)
def test_dream_preset_equals_dream_for_every_alg(seed, prompt, alg, steps, eps, draw_seed):
    model = peer_model(seed, shift=1, eos_bias=1.0)
    result = refusion.generate(
        prompt, model, preset="dream", gen_length=10, steps=steps, eps=eps, alg=alg, seed=draw_seed, record=True
    )
    reference = peer.dream(
        model.model,
        prompt,
        steps=steps,
        gen_length=10,
        mask_id=MASK,
        eps=eps,
        alg=alg,
        generator=torch.Generator().manual_seed(draw_seed),
    )
    check(result, reference)


@settings(max_examples=6)
@given(
    seed=st.integers(0, 1000),
    prompt=prompts,
    threshold=st.sampled_from([0.3, 0.6, 0.9]),
    preset=st.sampled_from(["fast-dllm", "fast-dllm-dual"]),
    eos_bias=st.sampled_from([0.0, 2.0]),
)
def test_fast_dllm_presets_equal_fast_dllm(seed, prompt, threshold, preset, eos_bias):
    model = peer_model(seed, eos_bias=eos_bias)
    result = refusion.generate(
        prompt, model, preset=preset, gen_length=8, block_length=4, threshold=threshold, record=True
    )
    reference = peer.fast_dllm(
        model.model,
        prompt,
        gen_length=8,
        block_length=4,
        mask_id=MASK,
        threshold=threshold,
        dual_cache=preset == "fast-dllm-dual",
    )
    check(result, reference)
