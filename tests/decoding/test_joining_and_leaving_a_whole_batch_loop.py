"""Continuous batching over the whole-batch loops: a row that joins a running loop, and the rows left after one is
cancelled, get what they get decoded alone (tokens, slots, iterations), for every loop and for samplers that draw."""

from __future__ import annotations

import pytest

from refusion.decoding.decoder import Decoder
from refusion.decoding.forms import ProgramForm, form_for
from refusion.engines import open_engine
from refusion.generator import Generator
from tests.support.helpers import tiny

COMPOSITIONS = {
    "lossless": dict(selector="leftmost", infiller="greedy-verify", slot_size=3, serial_num_blocks=1),
    "plan-and-infill": dict(selector="threshold", infiller="parallel-ar", slot_size=3, token_threshold=0.3),
    "plan-and-infill, top-k": dict(selector="topk", infiller="parallel-ar", slot_size=2, token_threshold=0.5),
    "plan-and-infill, sampled": dict(
        selector="threshold",
        infiller="parallel-ar",
        slot_size=3,
        token_threshold=0.3,
        sampler="categorical",
        temperature=0.9,
        seed=11,
    ),
}


def _decoder(name: str, model) -> Decoder:
    decoder = Decoder.from_names(**COMPOSITIONS[name])
    assert form_for(decoder, open_engine(model, decoder, None), record=False)[0] is not ProgramForm
    return decoder


def _same(a, b):
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.commit_step.tolist() == b.commit_step.tolist()
    assert (a.num_iterations, a.stopped_at_eos) == (b.num_iterations, b.stopped_at_eos)


@pytest.mark.parametrize("name", COMPOSITIONS)
def test_a_row_that_joins_a_running_loop_gets_what_it_gets_alone(name):
    model = tiny(seed=8, eos=4)
    decoder = _decoder(name, model)
    generator = Generator(model, decoder, gen_length=12)
    first = generator.submit([1, 2, 3])
    for _ in range(3):
        generator.step()
    late = [generator.submit([5, 6]), generator.submit([9])]
    generator.run_until_idle()
    for request, prompt in zip([first, *late], ([1, 2, 3], [5, 6], [9])):
        _same(request.wait(timeout=30), decoder.decode(model, prompt, 12))
    assert generator.live_rows == 0


@pytest.mark.parametrize("name", COMPOSITIONS)
def test_a_cancelled_row_leaves_and_the_others_finish_as_alone(name):
    model = tiny(seed=9)
    decoder = _decoder(name, model)
    generator = Generator(model, decoder, gen_length=12)
    keep, drop, last = generator.submit([1, 2]), generator.submit([3, 4, 5]), generator.submit([6])
    generator.step()
    generator.cancel(drop)
    generator.run_until_idle()
    assert drop.status == "cancelled"
    for request, prompt in ((keep, [1, 2]), (last, [6])):
        _same(request.wait(timeout=30), decoder.decode(model, prompt, 12))
    assert generator.live_rows == 0


def test_requests_with_different_samplers_in_one_generator_each_get_what_they_get_alone():
    """Each request's sampler decides its rows: a greedy and a sampled request (same parts otherwise) running
    together in one generator do not share a loop's sampler."""
    model = tiny(seed=8, eos=4)
    greedy = _decoder("plan-and-infill", model)
    sampled = _decoder("plan-and-infill, sampled", model)
    generator = Generator(model, greedy, gen_length=12)
    requests = [
        (generator.submit([1, 2, 3]), greedy),
        (generator.submit([1, 2, 3], decoder=sampled), sampled),
        (generator.submit([5, 6], decoder=sampled), sampled),
    ]
    generator.run_until_idle()
    for (request, decoder), prompt in zip(requests, ([1, 2, 3], [1, 2, 3], [5, 6])):
        _same(request.wait(timeout=30), decoder.decode(model, prompt, 12))
