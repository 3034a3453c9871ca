"""One loaded model shared by several threads and a running Generator: every decode gets its single-threaded tokens.

Forwards of one network are serialised by :func:`refusion.models.base.exclusive`;
the branch engine switches the network's attention implementation only while
holding it, so no other thread's forward sees the switch.
"""

import threading

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refusion.decoding.decoder import Decoder
from refusion.generator import Generator
from refusion.models.base import exclusive
from refusion.models.hf import HFCausalLM
from tests.support.helpers import tiny

PARTS = [
    dict(slot_size=2, serial_num_blocks=1, slot_threshold=0.5, token_threshold=0.5),
    dict(slot_size=2, serial_num_blocks=2, selector="topk", k=2, infiller="greedy-verify"),
    dict(slot_size=3, serial_num_blocks=1, selector="leftmost", reorderer="reencode"),
    dict(slot_size=2, serial_num_blocks=1, temperature=1.3, seed=5),
]


@st.composite
def jobs(draw, vocab):
    """A decoder (its parts, engine), prompt and length for one decode."""
    params = dict(draw(st.sampled_from(PARTS)), engine=draw(st.sampled_from(["branch", "repeat"])))
    decoder = Decoder.from_names(**params)
    block = params["slot_size"] * params["serial_num_blocks"]
    prompt = draw(st.lists(st.integers(0, vocab - 2), min_size=1, max_size=6))
    return decoder, prompt, block * draw(st.integers(1, 3))


def alone(decoder, model, prompt, gen_length):
    return decoder.decode(model, prompt, gen_length).tokens.tolist()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_threads_and_a_running_generator_on_one_model_get_the_single_threaded_tokens(data):
    vocab = 16
    model = tiny(vocab=vocab, seed=data.draw(st.integers(0, 100)), scale=6.0)
    per_thread = [data.draw(st.lists(jobs(vocab), min_size=2, max_size=3)) for _ in range(3)]
    background = data.draw(st.lists(jobs(vocab), min_size=2, max_size=4))
    want = {id(job): alone(job[0], model, job[1], job[2]) for job in [*sum(per_thread, []), *background]}
    got, errors = {}, []

    def work(jobs_of_thread):
        try:
            for job in jobs_of_thread:
                got[id(job)] = alone(job[0], model, job[1], job[2])
        except Exception as exc:
            errors.append(exc)

    generator = Generator(model, engine="branch", max_rows=2).start()
    try:
        requests = [
            (job, generator.submit(job[1], decoder=job[0], gen_length=job[2]))
            for job in background
            if job[0].engine == "branch"
        ]
        threads = [threading.Thread(target=work, args=(jobs_of_thread,)) for jobs_of_thread in per_thread]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        for job, request in requests:
            got[id(job)] = request.wait(timeout=300).tokens.tolist()
    finally:
        generator.close(drain=False, timeout=30)
    assert not errors, errors
    assert {k: got[k] for k in got} == {k: want[k] for k in got}
    assert len(got) == sum(map(len, per_thread)) + len(requests)
    job = per_thread[0][0]
    assert alone(job[0], model, job[1], job[2]) == want[id(job)], "the model works afterwards"


def test_the_network_is_back_to_its_own_attention_after_threads_used_packed_forwards():
    model = tiny(vocab=16, seed=4, scale=6.0)
    before = model.model.config._attn_implementation
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1, engine="branch")
    threads = [threading.Thread(target=decoder.decode_batch, args=(model, [[1, 2], [3, 4, 5]], 4)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert model.model.config._attn_implementation == before
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        plain = model.model(input_ids=ids).logits
    assert torch.isfinite(plain).all()


def test_adapters_wrapping_one_network_share_its_forward_lock():
    model = tiny(vocab=16, seed=1)
    other = HFCausalLM(model.model, mask_token_id=model.mask_token_id)
    assert exclusive(model) is exclusive(other) is exclusive(model.model)
    assert exclusive(tiny(vocab=16, seed=1)) is not exclusive(model)
    with exclusive(model), exclusive(other):  # re-entrant: an engine may hold it around a forward that takes it
        pass
