"""Block-diffusion models (logits at a mask predicting it, or the next position: Fast-dLLM v2's token shift): the exact
cache of finished blocks equals recomputing everything, batch equals single."""

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.decoding.decoder import Decoder
from refusion.engines.block import BlockEngine, BlockRecomputeEngine
from refusion.errors import ConfigError
from refusion.models.block import block_ids, tiny_block_diffusion
from refusion.models.mdm import tiny_bidirectional

SELECTORS = {
    "threshold": dict(slot_threshold=0.6),
    "topk": dict(k=2),
    "factor": dict(factor=1.0),
    "llada-steps": dict(steps=6),
    "entropy": dict(k=1),
}


def block_decoder(selector, block_length, **extra):
    return Decoder.from_names(
        partitioner="semi-ar",
        selector=selector,
        infiller="draft",
        block_length=block_length,
        **{**SELECTORS[selector], **extra},
    )


def recording(engine):
    """The engine, with the logits of every answered extend appended to ``engine.seen``."""
    engine.seen = []
    lay_out = engine.lay_out

    def wrapped(state, call, feed):
        finish = lay_out(state, call, feed)

        def done(scores):
            outputs = finish(scores)
            engine.seen.extend(out.logits.clone() for out in outputs)
            return outputs

        return done

    engine.lay_out = wrapped
    return engine


@settings(max_examples=10)
@given(
    seed=st.integers(0, 1000),
    prompt=st.lists(st.integers(0, 13), min_size=1, max_size=6),
    block_length=st.integers(2, 4),
    blocks=st.integers(1, 3),
    selector=st.sampled_from(sorted(SELECTORS)),
    eos=st.sampled_from([None, 2]),
    stop_at_eos=st.booleans(),
    shift=st.sampled_from([0, 1]),
)
def test_cached_blocks_equal_recomputing_everything(
    seed, prompt, block_length, blocks, selector, eos, stop_at_eos, shift
):
    model = tiny_block_diffusion(
        block_length=block_length, vocab_size=16, seed=seed, logit_scale=4.0, eos_token_id=eos, logit_shift=shift
    )
    steps = SELECTORS[selector].get("steps")
    extra = {"steps": blocks * max(1, block_length - 1)} if steps else {}
    decoder = attrs.evolve(block_decoder(selector, block_length, **extra), stop_at_eos=stop_at_eos)
    cached, full = recording(BlockEngine(model)), recording(BlockRecomputeEngine(model))
    a = decoder.decode(model, prompt, block_length * blocks, engine=cached, record=True)
    b = decoder.decode(model, prompt, block_length * blocks, engine=full, record=True)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert [s.committed for s in a.iterations] == [s.committed for s in b.iterations]
    assert len(cached.seen) == len(full.seen)
    assert max(float((x - y).abs().max()) for x, y in zip(cached.seen, full.seen)) < 1e-9
    assert a.fed_tokens <= b.fed_tokens


def test_finished_blocks_are_fed_once():
    model = tiny_block_diffusion(block_length=4, vocab_size=16, seed=3, logit_scale=4.0)
    fed = []
    scores = model.scores
    model.scores = lambda ids, *a: fed.append(ids.shape[1]) or scores(ids, *a)
    result = block_decoder("topk", 4).decode(model, [1, 2, 3], 12, record=True)  # 3 blocks of 4, 2 tokens per step
    assert result.engine == "block"
    # first call: prompt + block; later calls of a block: the block; first call of the next: previous block + block
    assert fed == [3 + 4, 4, 4 + 4, 4, 4 + 4, 4]


def test_a_token_shifted_model_also_feeds_the_position_that_predicts_the_blocks_first():
    model = tiny_block_diffusion(block_length=4, vocab_size=16, seed=3, logit_scale=4.0, logit_shift=1)
    fed = []
    scores = model.scores
    model.scores = lambda ids, *a: fed.append(ids.shape[1]) or scores(ids, *a)
    result = block_decoder("topk", 4).decode(model, [1, 2, 3], 12, record=True)
    assert result.engine == "block"
    # the previous block's last position is fed again with each call of a block: its output predicts the first
    assert fed == [3 + 4, 1 + 4, 4 + 4 + 1, 1 + 4, 4 + 4 + 1, 1 + 4]


@settings(max_examples=5)
@given(
    seed=st.integers(0, 1000),
    prompts=st.lists(st.lists(st.integers(0, 13), min_size=1, max_size=7), min_size=2, max_size=4),
    shift=st.sampled_from([0, 1]),
)
def test_batch_equals_single_with_ragged_prompts(seed, prompts, shift):
    model = tiny_block_diffusion(
        block_length=3, vocab_size=16, seed=seed, logit_scale=4.0, eos_token_id=2, logit_shift=shift
    )
    decoder = block_decoder("threshold", 3)
    batched = decoder.decode_batch(model, prompts, 9, record=True)
    for prompt, result in zip(prompts, batched):
        assert result.tokens.tolist() == decoder.decode(model, prompt, 9, record=True).tokens.tolist()


@settings(max_examples=8)
@given(
    seed=st.integers(0, 1000),
    prompt=st.lists(st.integers(0, 13), min_size=1, max_size=9),
    shift=st.sampled_from([0, 1]),
)
def test_a_sub_block_as_long_as_the_block_gives_the_exact_caches_tokens(seed, prompt, shift):
    """The sub-block cache with one sub-block per block feeds what a full forward feeds, over exact columns."""
    model = tiny_block_diffusion(
        block_length=4, vocab_size=16, seed=seed, logit_scale=4.0, layout="absolute", logit_shift=shift
    )
    params = dict(selector="fast-dllm-v2", threshold=0.3, small_block_size=4, slot_size=1, align="absolute")
    exact = Decoder.from_names(partitioner="semi-ar", infiller="draft", block_length=4, **params)
    sub = attrs.evolve(exact, reorderer=Decoder.from_names(reorderer="sub-block-cache", small_block_size=4).reorderer)
    a, b = exact.decode(model, prompt, 12, record=True), sub.decode(model, prompt, 12, record=True)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.forwards == b.forwards and b.fed_tokens <= a.fed_tokens


def test_the_sub_block_cache_feeds_one_sub_block_once_its_first_position_holds_a_token():
    model = tiny_block_diffusion(block_length=8, vocab_size=16, seed=5, logit_scale=4.0, layout="absolute")
    fed = []
    scores = model.scores
    model.scores = lambda ids, *a: fed.append(ids.shape[1]) or scores(ids, *a)
    decoder = Decoder.from_names(
        partitioner="semi-ar",
        selector="fast-dllm-v2",
        infiller="draft",
        reorderer="sub-block-cache",
        block_length=8,
        small_block_size=4,
        threshold=1.0,  # one position a step: each sub-block's first position decided first, then alone
        slot_size=1,
        align="absolute",
    )
    decoder.decode(model, [1, 2, 3, 4, 5, 6, 7, 8], 8, record=True)
    # the prompt and the block (the block's first position is a mask: nothing kept), then the block kept by a full
    # forward, then its first sub-block alone while it is the current one; a new sub-block starts with a mask: full
    assert fed[:2] == [8 + 8, 8] and 4 in fed and all(n in (4, 8) for n in fed[1:])


def test_an_infiller_calling_with_two_extends_runs_under_the_sub_block_cache():
    """A further extend of a call gets a lane from the exact columns, whatever the block keeps for the first."""
    from refusion.decoding.protocol import ModelCall
    from refusion.strategies.infillers.draft import AcceptDraft

    class Rescoring(AcceptDraft):
        name = "rescoring-draft"

        def infill(self, ctx, plan, chosen):
            positions = plan.positions[plan.first_rows][list(chosen)]
            masks = torch.full_like(positions, ctx.mask_token_id)
            yield ModelCall.of(ctx.extend(masks, positions), ctx.extend(masks, positions))
            return (yield from super().infill(ctx, plan, chosen))

    model = tiny_block_diffusion(block_length=8, vocab_size=16, seed=5, logit_scale=4.0, layout="absolute")
    params = dict(
        partitioner="semi-ar",
        selector="fast-dllm-v2",
        reorderer="sub-block-cache",
        block_length=8,
        small_block_size=4,
        threshold=1.0,
        slot_size=1,
        align="absolute",
    )
    plain = Decoder.from_names(infiller="draft", **params).decode(model, [1, 2, 3, 4, 5, 6, 7, 8], 16)
    rescored = Decoder.from_names(infiller=Rescoring(), **params).decode(model, [1, 2, 3, 4, 5, 6, 7, 8], 16)
    assert rescored.tokens.tolist() == plain.tokens.tolist()
    assert rescored.forwards > plain.forwards


def test_attention_is_bidirectional_inside_a_block_and_causal_across_blocks():
    model = tiny_block_diffusion(block_length=3, vocab_size=16, seed=7, logit_scale=4.0)
    prompt_length, ids = 2, torch.tensor([1, 4, 5, 6, 7, 8, 9, 10])  # blocks: [0 1] [2 3 4] [5 6 7]
    assert block_ids(torch.arange(8), prompt_length, 3).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]

    def logits(tokens):
        positions = torch.arange(len(tokens))
        mask = model.block_mask(positions, positions, prompt_length)
        return model.scores(tokens[None], positions[None], mask, None).logits[0]

    base = logits(ids)
    later = ids.clone()
    later[6] = 3  # a token of the last block
    assert torch.equal(logits(later)[:5], base[:5])  # earlier blocks do not see it
    assert not torch.allclose(logits(later)[5], base[5])  # its own block does
    same = ids.clone()
    same[4] = 3
    assert not torch.allclose(logits(same)[2], base[2])  # bidirectional inside the block


def test_parts_and_engines_the_block_model_cannot_serve_are_refused_with_the_reason():
    model = tiny_block_diffusion(block_length=4, vocab_size=16)
    with pytest.raises(ConfigError, match="infiller 'parallel-ar' needs a model with `causal=True`"):
        Decoder.from_names(partitioner="semi-ar", block_length=4).decode(model, [1], 8, record=True)
    with pytest.raises(ConfigError, match="exact cache of finished blocks; the reorderer's 'prefix'"):
        block_decoder("topk", 4, reorderer="prefix-cache").decode(model, [1], 8, record=True)
    with pytest.raises(ConfigError, match="not one of the model's blocks of `block_length` 4"):
        block_decoder("topk", 8).decode(model, [1], 8, record=True)
    with pytest.raises(ConfigError, match="engine 'block' has none"):
        block_decoder("topk", 4, cfg_scale=1.0).decode(model, [1], 8, record=True)
    with pytest.raises(ConfigError, match="reorderer 'sub-block-cache' needs a model with `block_length=1 or more`"):
        bidirectional = tiny_bidirectional(vocab_size=16)
        Decoder.from_names(partitioner="semi-ar", infiller="draft", reorderer="sub-block-cache", block_length=4).decode(
            bidirectional, [1], 8
        )
    with pytest.raises(ConfigError, match="block-diffusion models use the 'block' engine"):
        block_decoder("topk", 4, engine="canvas").decode(model, [1], 8, record=True)
