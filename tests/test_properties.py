"""Properties over every registered strategy combination.

(b) decoding terminates within one iteration per slot, fills every position up
to the end exactly once, leaves no mask, and the cached positions of the
answer are a permutation of the generated region; (c) logits read through the
reordered cache equal a fresh forward of the reorganized sequence.
"""

import itertools

import pytest
import torch
from hypothesis import given, strategies as st

from refusion.cache.calls import Branch, Extend, ModelCall
from refusion.cache.executor import RepeatExecutor
from refusion.decoder import Decoder
from refusion.registry import registry
from refusion.testing import check_result
from tests.helpers import layouts, model_setups


def combinations():
    reg = registry()
    return list(itertools.product(reg.names("selector"), reg.names("infiller"), reg.names("reorderer")))


COMBOS = combinations()


def _decoder(combo, slot, blocks, data):
    selector, infiller, reorderer = combo
    params = dict(slot_size=slot, serial_num_blocks=blocks)
    if selector == "threshold":
        params["slot_threshold"] = data.draw(st.floats(0, 1))
    if selector in ("topk", "margin", "entropy"):
        params["k"] = data.draw(st.integers(1, 4))
    if infiller == "parallel-ar":
        params["token_threshold"] = data.draw(st.floats(0, 1))
    return Decoder.from_names(selector=selector, infiller=infiller, reorderer=reorderer, **params)


@pytest.mark.parametrize("combo", COMBOS, ids=["/".join(c) for c in COMBOS])
@given(setup=model_setups(), layout=layouts(), data=st.data())
def test_terminates_and_completes(combo, setup, layout, data):
    adapter, prompt = setup
    slot, blocks, gen_length = layout
    session = _decoder(combo, slot, blocks, data).session(adapter, prompt, gen_length)
    result = session.run()
    check_result(result, adapter)
    assert len(result.steps) <= len(result.partition.slots)
    assert all(sum(n for _, n in s.committed) >= 1 for s in result.steps)
    cached = session.cache.positions[len(prompt):]
    assert len(set(cached.tolist())) == len(cached), "a position was cached twice"
    region = set(range(len(prompt), len(prompt) + len(result.tokens)))
    assert region <= set(cached.tolist())
    if not result.stopped_at_eos:
        assert sorted(cached.tolist()) == sorted(region)


def _fresh_logits(adapter, cache, probe, probe_pos):
    n, q = len(cache), len(probe)
    pattern = torch.zeros(n + q, n + q, dtype=torch.bool)
    pattern[:n, :n] = cache.attention_pattern()
    pattern[n:, :n] = True
    pattern[n:, n:] = torch.tril(torch.ones(q, q, dtype=torch.bool))
    ids = torch.cat((cache.tokens, probe))[None]
    pos = torch.cat((cache.positions, probe_pos))[None]
    with torch.no_grad():
        return adapter.model(input_ids=ids, position_ids=pos, attention_mask=pattern[None, None]).logits[0, n:]


@pytest.mark.parametrize("reorderer", ["commit-order", "reencode"])
@given(setup=model_setups(), layout=layouts(), data=st.data(), stop_after=st.integers(1, 6))
def test_cache_reads_equal_fresh_forward(reorderer, setup, layout, data, stop_after):
    adapter, prompt = setup
    slot, blocks, gen_length = layout
    combo = (data.draw(st.sampled_from(registry().names("selector"))),
             data.draw(st.sampled_from(registry().names("infiller"))), reorderer)
    session = _decoder(combo, slot, blocks, data).session(adapter, prompt, gen_length)
    executor = RepeatExecutor(adapter, session.cache)
    program = session.program()
    call, plans = next(program), 0
    with torch.inference_mode():
        while True:
            is_plan = len(call.extends) == 1 and bool((call.extends[0].tokens == adapter.mask_token_id).all())
            if is_plan:
                plans += 1
                if plans > stop_after:
                    break
            try:
                call = program.send(executor.run(call))
            except StopIteration:
                break
        cache = session.cache
        start = int(cache.positions.max()) + 1
        probe = torch.tensor([adapter.mask_token_id, 1, adapter.mask_token_id])
        probe_pos = torch.arange(start, start + 3)
        (out,) = executor.run(ModelCall.of(Extend(Branch(), probe, probe_pos)))
        torch.testing.assert_close(out.logits, _fresh_logits(adapter, cache, probe, probe_pos), rtol=1e-9, atol=1e-9)
