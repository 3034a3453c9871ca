"""d3LLM's delayed, periodically refreshed prefix cache (``BlockReuse(mode="periodic")``, reorderer ``periodic``):
which columns each call feeds, rule by rule, on a hand-made canvas of a 4-token prompt and two chunks of 4."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.decoding.protocol import BlockReuse
from refusion.engines.canvas import BlockCache, periodic_columns


def masks(*positions: int, n: int = 12) -> np.ndarray:
    masked = np.zeros(n, dtype=bool)
    masked[list(positions)] = True
    return masked


def fed(block: BlockCache, masked: np.ndarray) -> tuple[int, int]:
    columns = periodic_columns(masked, block)
    assert np.array_equal(columns, np.arange(columns[0], len(masked)))  # always a suffix of the canvas
    return int(columns[0]), block.kept_end


def block(delay: int, refresh: int, start: int = 4) -> BlockCache:
    return BlockCache.of(BlockReuse("periodic", chunk=4, delay=delay, reload_every=refresh), start, 12)


def test_a_finished_chunk_waits_its_delay_then_joins_the_kept_prefix_and_refreshes_come_on_multiples():
    b = block(delay=1, refresh=3)
    answer = masks(*range(4, 12))
    assert fed(b, answer) == (0, 4)  # call 1: the prompt (complete at call 0) joins: fed whole, kept from now
    assert fed(b, answer) == (4, 4)  # call 2: from the kept prefix's end
    assert fed(b, answer) == (0, 4)  # call 3: a multiple of 3, a refresh of the whole canvas
    second = masks(*range(8, 12))
    assert fed(b, second) == (0, 4)  # call 4: chunk 1 finished now and waits: a refresh
    assert fed(b, second) == (4, 8)  # call 5: it joins; fed from the old end (its keys/values from this call)
    assert fed(b, second) == (0, 8)  # call 6: a refresh
    assert fed(b, second) == (8, 8)  # call 7


def test_with_no_delay_a_chunk_joins_at_the_call_that_sees_it_finished():
    b = block(delay=0, refresh=100)
    assert fed(b, masks(*range(4, 12))) == (0, 4)
    assert fed(b, masks(*range(8, 12))) == (4, 8)
    assert fed(b, masks(10)) == (8, 8)


def test_a_chunks_clock_starts_only_once_the_chunks_before_it_are_kept():
    b = block(delay=2, refresh=100)
    done = masks()
    assert fed(b, done) == (0, 0)  # call 1: the prompt waits (1 < 2); chunks 1 and 2 are not yet timed
    assert b.complete_at == {0: 0}
    assert fed(b, done) == (0, 4)  # call 2: the prompt joins, chunk 1's clock starts (waits)
    assert b.complete_at == {0: 0, 1: 2}
    assert fed(b, done) == (0, 4)  # call 3: chunk 1 still waiting: a refresh
    assert fed(b, done) == (4, 8)  # call 4: chunk 1 joins, chunk 2's clock starts


def test_a_position_masked_again_moves_the_kept_prefix_back_to_its_chunk():
    b = block(delay=0, refresh=100)
    fed(b, masks(*range(4, 12)))
    assert fed(b, masks(*range(8, 12))) == (4, 8)
    assert fed(b, masks(5, 9)) == (4, 4)  # a reviser masked position 5: chunk 1 is fed again
    assert 1 not in b.complete_at


def test_nothing_is_kept_until_a_chunk_joins_so_every_call_feeds_the_whole_canvas():
    b = block(delay=0, refresh=100, start=0)  # no prompt before the block: no chunk 0 finished at call 0
    assert [fed(b, masks(*range(0, 12)))[0] for _ in range(3)] == [0, 0, 0]
    assert not b.has_kept


@functools.cache
def bidirectional(shift: int = 0):
    from refusion.models.mdm import tiny_bidirectional

    return tiny_bidirectional(vocab_size=32, max_positions=256, logit_scale=6.0, logit_shift=shift)


@settings(max_examples=12, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(2, 30), min_size=1, max_size=7), min_size=1, max_size=3),  # 31: mask
    size=st.integers(2, 8),
    blocks=st.integers(1, 4),
    add=st.sampled_from([0.0, 0.3, 1.0]),
    skip=st.sampled_from([0.05, 0.5, 1.0]),
    shift=st.sampled_from([0, 1]),
)
def test_block_causal_attention_makes_the_cache_of_finished_blocks_exact(prompts, size, blocks, add, skip, shift):
    """With ``chunk_causal`` a finished block sees only finished blocks: feeding it once more and then caching it
    gives the tokens of feeding the whole canvas at every forward, in as many forwards, for any batch, with a
    logit shift or without."""
    import refusion

    preset = "d2f-dream" if shift else "d2f"
    options = dict(preset=preset, gen_length=size * blocks, block_size=size, block_add_threshold=add)
    options.update(skip_threshold=skip)
    cached = refusion.generate(prompts, bidirectional(shift), **options)
    whole = refusion.generate(prompts, bidirectional(shift), **options, cache_finished=False)
    assert [r.region_tokens for r in cached] == [r.region_tokens for r in whole]
    assert [r.forwards for r in cached] == [r.forwards for r in whole]
    assert sum(r.fed_tokens for r in cached) <= sum(r.fed_tokens for r in whole)


def test_every_extend_of_a_call_attends_block_causally_in_its_own_lane():
    """A call's further extend is fed in a lane of its own, whole canvas, under the same block-causal attention:
    its logits equal the first extend's, and differ from full attention's in the block that no longer sees the next
    one."""
    import torch

    from refusion.decoding.protocol import ROOT, Extend, ModelCall
    from refusion.engines.canvas import CanvasEngine

    model = bidirectional()
    masks = [model.mask_token_id] * 8

    def logits(reuse):
        engine = CanvasEngine(model)
        state = engine.admit(torch.tensor([3, 4, 5]), 8)
        state.start_block(3, 11, reuse)
        call = ModelCall((Extend(ROOT, masks, list(range(3, 11))), Extend(ROOT, masks, list(range(3, 11)))))
        return [out.scores.logits for out in engine.run({state: call})[state]]

    causal = logits(BlockReuse("periodic", chunk=4, delay=0, reload_every=10**9, chunk_causal=True))
    full = logits(None)
    torch.testing.assert_close(causal[1], causal[0])
    assert not torch.allclose(causal[0][:4], full[0][:4])  # the first block does not see the second
