"""Properties over every registered strategy combination.

(b) decoding terminates within one iteration per slot, fills every position up
to the end exactly once, leaves no mask, and the cached positions of the
answer are a permutation of the generated region; (c) logits read through the
reordered cache equal a fresh forward of the reorganized sequence.
"""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.decoding.decoder import Decoder
from refusion.decoding.plans import Plans
from refusion.decoding.protocol import Branch, Extend, ModelCall, Projection, Selection
from refusion.plugins.registry import registry
from refusion.testing import check_result
from tests.support.helpers import layouts, model_setups


def fits(kind, names):
    """Whether parts with these names work on a causal (True) or bidirectional (False) model."""
    reg = registry()
    return all(
        reg.get(k, n).requires.get("causal", kind) == kind
        and not reg.get(k, n).requires.get("denoiser", False)
        and reg.get(k, n).requires.get("block_length", 0) == 0
        for k, n in names.items()
    )  # parts for canvas-denoising models only (the `denoise` infiller) are decoded in tests/peers, parts for
    # block-diffusion models only (the `sub-block-cache` reorderer) in tests/engines/test_block_diffusion.py


def combinations(causal):
    reg = registry()
    out = []
    for s, i, r in itertools.product(reg.names("selector"), reg.names("infiller"), reg.names("reorderer")):
        if fits(causal, {"selector": s, "infiller": i, "reorderer": r}):
            out.append((s, i, r))
    return out


COMBOS = [(True, c) for c in combinations(True)] + [(False, c) for c in combinations(False)]


def _decoder(combo, slot, blocks, data, partitioner="fixed"):
    selector, infiller, reorderer = combo
    if partitioner == "fixed":
        params = dict(slot_size=slot, serial_num_blocks=blocks)
    else:
        params = dict(slot_size=slot, block_length=slot * data.draw(st.integers(1, 3)))
    if selector == "threshold":
        params["slot_threshold"] = data.draw(st.floats(0, 1))
    if selector in ("topk", "margin", "entropy", "random"):
        params["k"] = data.draw(st.integers(1, 4))
    if selector == "factor":
        params["factor"] = data.draw(st.floats(0.1, 4.0))
    if infiller == "parallel-ar":
        params["token_threshold"] = data.draw(st.floats(0, 1))
    return Decoder.from_names(
        partitioner=partitioner, selector=selector, infiller=infiller, reorderer=reorderer, **params
    )


def _model(causal, setup, data, combo=()):
    from refusion.models.mdm import tiny_bidirectional

    adapter, prompt = setup
    if causal:
        return adapter, prompt
    reg = registry()
    wanted = {reg.get(k, n).requires.get("logit_shift") for k, n in zip(("selector", "infiller", "reorderer"), combo)}
    shift = data.draw(st.sampled_from([0, 1] if wanted <= {None} else sorted(wanted - {None})))
    eos = next(iter(adapter.eos_token_ids), None)
    return tiny_bidirectional(
        logit_shift=shift,
        vocab_size=adapter.vocab_size,
        seed=data.draw(st.integers(0, 99)),
        logit_scale=8.0,
        eos_token_id=eos,
    ), prompt


@pytest.mark.parametrize("causal, combo", COMBOS, ids=[("causal/" if c else "bidir/") + "/".join(x) for c, x in COMBOS])
@settings(max_examples=6)
@given(setup=model_setups(), layout=layouts(), data=st.data())
def test_terminates_and_completes(causal, combo, setup, layout, data):
    adapter, prompt = _model(causal, setup, data, combo)
    slot, blocks, gen_length = layout
    partitioner = data.draw(st.sampled_from(["fixed", "semi-ar"]))
    session = _decoder(combo, slot, blocks, data, partitioner).session(adapter, prompt, gen_length, record=True)
    result = session.run()
    check_result(result, adapter)
    assert result.num_iterations <= len(result.partition.slots)
    assert all(sum(n for _, n in s.committed) >= 1 for s in result.iterations)
    cached = session.cache.positions[len(prompt) :]
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


@pytest.mark.parametrize("engine", ["repeat", "branch"])
@pytest.mark.parametrize("reorderer", ["commit-order", "reencode"])
@given(setup=model_setups(), layout=layouts(), data=st.data(), stop_after=st.integers(1, 6))
def test_cache_reads_equal_fresh_forward(engine, reorderer, setup, layout, data, stop_after):
    adapter, prompt = setup
    slot, blocks, gen_length = layout
    combo = (
        data.draw(st.sampled_from(registry().names("selector"))),
        data.draw(st.sampled_from([n for n in registry().names("infiller") if fits(True, {"infiller": n})])),
        reorderer,
    )
    session = _decoder(combo, slot, blocks, data).session(adapter, prompt, gen_length, engine=engine)

    def run(call):
        return session.engine.run({session.state: call})[session.state]

    program = session.program()
    call, plans = next(program), 0
    with torch.inference_mode():
        while True:
            if isinstance(call, (Projection, Selection)):  # resolved on demand / by the selector alone
                answer = call.selector.choose(Plans([call.plan]))[0] if isinstance(call, Selection) else None
                try:
                    call = program.send(answer)
                except StopIteration:
                    break
                continue
            is_plan = len(call.extends) == 1 and bool((call.extends[0].tokens == adapter.mask_token_id).all())
            if is_plan:
                plans += 1
                if plans > stop_after:
                    break
            try:
                call = program.send(run(call))
            except StopIteration:
                break
        cache = session.cache
        start = int(cache.positions.max()) + 1
        probe = torch.tensor([adapter.mask_token_id, 1, adapter.mask_token_id])
        probe_pos = torch.arange(start, start + 3)
        (out,) = run(ModelCall.of(Extend(Branch(), probe, probe_pos)))
        torch.testing.assert_close(out.logits, _fresh_logits(adapter, cache, probe, probe_pos), rtol=1e-9, atol=1e-9)
