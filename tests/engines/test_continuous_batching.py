"""Continuous batching: requests join and leave a running engine and decode as if alone."""

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError
from refusion.generator import Generator
from refusion.models.mdm import tiny_bidirectional
from tests.support.helpers import tiny

CAUSAL = dict(
    selector=["threshold", "topk", "leftmost", "random"],
    infiller=["parallel-ar", "greedy-verify"],
    reorderer=["commit-order", "reencode"],
)
BIDIRECTIONAL = dict(
    selector=["threshold", "topk", "random", "factor"],
    infiller=["draft"],
    reorderer=["commit-order", "prefix-cache", "dual-cache", "no-cache"],
)


@st.composite
def requests(draw, parts, vocab):
    """A decoder, prompt, length, seed and arrival step for one request."""
    selector = draw(st.sampled_from(parts["selector"]))
    slot = draw(st.integers(1, 3))
    params = dict(
        selector=selector,
        infiller=draw(st.sampled_from(parts["infiller"])),
        reorderer=draw(st.sampled_from(parts["reorderer"])),
        slot_size=slot,
        serial_num_blocks=draw(st.integers(1, 2)),
    )
    if selector == "threshold":
        params["slot_threshold"] = draw(st.sampled_from([0.0, 0.3, 0.7, 0.95]))
    if selector in ("topk", "random"):
        params["k"] = draw(st.integers(1, 3))
    if params["infiller"] == "parallel-ar":
        params["token_threshold"] = draw(st.sampled_from([0.0, 0.5, 0.9]))
    if draw(st.booleans()):
        params["temperature"] = draw(st.sampled_from([0.7, 1.5]))
    decoder = Decoder.from_names(**params)
    gen_length = slot * params["serial_num_blocks"] * draw(st.integers(1, 3))
    prompt = draw(st.lists(st.integers(0, vocab - 2), min_size=1, max_size=6))
    return decoder, prompt, gen_length, draw(st.integers(0, 50)), draw(st.integers(0, 6))


def run_with_arrivals(generator, jobs):
    """Submit each job at its arrival step while the generator runs; return the requests in job order."""
    submitted, step = {}, 0
    while len(submitted) < len(jobs) or not generator.idle():
        for i, (decoder, prompt, gen_length, seed, arrival) in enumerate(jobs):
            if i not in submitted and arrival <= step:
                submitted[i] = generator.submit(prompt, decoder=decoder, gen_length=gen_length, seed=seed, record=True)
        generator.step()
        assert generator.live_rows <= generator.max_rows
        step += 1
    return [submitted[i] for i in range(len(jobs))]


@pytest.mark.parametrize("engine", ["branch", "repeat", "canvas"])
@settings(max_examples=12)
@given(data=st.data())
def test_joining_a_running_batch_equals_decoding_alone(engine, data):
    vocab = 16
    seed = data.draw(st.integers(0, 1000))
    eos = data.draw(st.sampled_from([None, 2]))
    if engine == "canvas":
        model = tiny_bidirectional(
            vocab_size=vocab,
            seed=seed,
            logit_scale=8.0,
            eos_token_id=eos,
            logit_shift=data.draw(st.sampled_from([0, 1])),
        )
        parts = BIDIRECTIONAL
    else:
        model = tiny(vocab=vocab, seed=seed, scale=8.0, eos=eos)
        parts = CAUSAL
    jobs = data.draw(st.lists(requests(parts, vocab), min_size=1, max_size=5))
    generator = Generator(model, jobs[0][0], engine=engine, max_rows=data.draw(st.integers(1, 4)))
    done = run_with_arrivals(generator, jobs)
    for request, (decoder, prompt, gen_length, seed, _) in zip(done, jobs):
        alone = attrs.evolve(decoder, seed=seed).decode(model, prompt, gen_length, engine=engine, record=True)
        assert request.status == "finished"
        assert request.result.tokens.tolist() == alone.tokens.tolist()
        assert [s.committed for s in request.result.iterations] == [s.committed for s in alone.iterations]
    assert generator.live_rows == 0 and generator.reserved_tokens == 0


def test_events_stream_the_contiguous_prefix_and_end_with_the_result():
    model = tiny(vocab=16, seed=3, scale=8.0, eos=2)
    decoder = Decoder.from_names(selector="topk", k=1, slot_size=2, serial_num_blocks=1)
    generator = Generator(model, decoder, gen_length=12)
    request = generator.submit([1, 2, 3], record=True)
    events = list(request)
    assert events[-1].finished and events[-1].result is request.result
    streamed = [t for e in events for t in e.prefix_tokens]
    assert streamed == request.result.tokens.tolist()
    assert [e.step.iteration for e in events[:-1]] == list(range(request.result.num_iterations))
    committed = sorted(c.slot for e in events for c in e.commits)
    assert committed == sorted(s for step in request.result.iterations for s, _ in step.committed)
    assert any(e.commits and not e.prefix_tokens for e in events[:-1]) or len(events) == 2  # out-of-order commits


def test_admission_waits_for_a_free_row_and_for_reserved_tokens():
    model = tiny(vocab=16, seed=1, scale=8.0)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1, slot_threshold=0.99, token_threshold=0.99)
    generator = Generator(model, decoder, max_rows=2, max_tokens=30, gen_length=8)
    requests = [generator.submit([1 + i, 2], record=True) for i in range(5)]  # 10 positions each: 3 would need 30
    peak_rows = peak_tokens = 0
    while not generator.idle():
        generator.step()
        peak_rows = max(peak_rows, generator.live_rows)
        peak_tokens = max(peak_tokens, generator.reserved_tokens)
    assert peak_rows == 2 and peak_tokens <= 30
    for i, request in enumerate(requests):
        assert request.result.tokens.tolist() == decoder.decode(model, [1 + i, 2], 8, record=True).tokens.tolist()
    with pytest.raises(ConfigError, match="needs 40 positions .* more than `max_batch_tokens` \\(30\\)"):
        generator.submit([1, 2, 3, 4, 5, 6, 7, 8], gen_length=32, record=True)


@pytest.mark.parametrize("engine", ["branch", "repeat"])
def test_a_cancelled_request_frees_its_row_and_leaves_the_others_alone(engine):
    model = tiny(vocab=16, seed=5, scale=8.0)
    decoder = Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=2, serial_num_blocks=1)
    generator = Generator(model, decoder, engine=engine, max_rows=2, gen_length=16)
    first, second, third = (generator.submit([i + 1, 3], record=True) for i in range(3))
    generator.step()
    generator.step()
    assert first.status == second.status == "running" and third.status == "waiting"
    first.cancel()
    generator.step()
    assert first.status == "cancelled" and first.result is None and third.status == "running"
    generator.run_until_idle()
    for i, request in ((1, second), (2, third)):
        assert request.result.tokens.tolist() == decoder.decode(model, [i + 1, 3], 16, record=True).tokens.tolist()
    assert list(first)[-1].cancelled
    if engine == "branch":
        cached = len(generator.engine.prefixes or ())  # pages only the prefix cache still holds
        assert generator.engine.kv.pool.used == cached  # the cancelled and the finished requests gave theirs back


def test_a_background_thread_serves_requests_submitted_from_other_threads():
    import threading

    model = tiny(vocab=16, seed=2, scale=8.0, eos=2)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1)
    generator = Generator(model, decoder, gen_length=8, max_rows=3).start()
    results = {}

    def client(i):
        results[i] = generator.submit([i + 1, 5], seed=i, record=True).wait(timeout=60).tokens.tolist()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    generator.close()
    assert results == {i: decoder.decode(model, [i + 1, 5], 8, record=True).tokens.tolist() for i in range(6)}
    with pytest.raises(ConfigError, match="closed"):
        generator.submit([1], record=True)


def test_close_without_draining_cancels_what_is_left():
    model = tiny(vocab=16, seed=2, scale=8.0)
    generator = Generator(
        model, Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=1), gen_length=32, max_rows=1
    )
    requests = [generator.submit([1, 2], record=True) for _ in range(3)]
    generator.step()
    generator.close(drain=False)
    assert all(r.status == "cancelled" for r in requests)
    assert generator.live_rows == 0


def test_bad_requests_fail_at_submit():
    model = tiny(vocab=16)
    generator = Generator(model, Decoder.from_names(slot_size=2))
    with pytest.raises(ConfigError, match="token ids in \\[0, 16\\)"):
        generator.submit([99], record=True)
    with pytest.raises(ConfigError, match="`gen_length` must be an integer >= 1"):
        generator.submit([1], gen_length=0, record=True)
    with pytest.raises(ConfigError, match="`engine` 'repeat' differs from this generator's engine 'branch'"):
        generator.submit([1], decoder=Decoder.from_names(engine="repeat"), record=True)
    with pytest.raises(ConfigError, match="`max_rows` must be an integer >= 1"):
        Generator(model, max_rows=0)
    assert generator.idle()
    assert torch.is_tensor(generator.submit([1], gen_length=4, record=True).wait().tokens)
