"""A Generator isolates its requests: a raising callback or a failing step hurts only what it must, nothing hangs."""

import threading

import pytest

from refusion.decoding.decoder import Decoder
from refusion.errors import CallbackError, StalledError
from refusion.generator import Generator
from tests.support.helpers import tiny

DECODER = dict(slot_size=2, serial_num_blocks=1, slot_threshold=0.9, token_threshold=0.9)
PROMPTS = [[1, 2], [3, 4, 5], [6], [7, 8]]


@pytest.fixture(scope="module")
def model():
    return tiny(vocab=16, seed=2, scale=6.0)


def alone(model, prompt, gen_length=6):
    return Decoder.from_names(**DECODER).decode(model, prompt, gen_length).tokens.tolist()


def boom(event):
    raise RuntimeError("callback bug")


def test_a_raising_callback_fails_its_request_and_the_background_thread_serves_the_rest(model):
    with Generator(model, max_rows=2, **DECODER).start() as generator:
        bad = generator.submit(PROMPTS[0], gen_length=6, on_event=boom)
        good = [generator.submit(p, gen_length=6) for p in PROMPTS[1:]]
        assert [r.wait(timeout=120).tokens.tolist() for r in good] == [alone(model, p) for p in PROMPTS[1:]]
        with pytest.raises(CallbackError, match="request 0 raised RuntimeError: callback bug") as caught:
            bad.wait(timeout=120)
        assert isinstance(caught.value.__cause__, RuntimeError)
        assert bad.status == "failed" and bad.callback_error is caught.value
        assert generator.running, "the background thread survived"
        later = generator.submit(PROMPTS[0], gen_length=6)
        assert later.wait(timeout=120).tokens.tolist() == alone(model, PROMPTS[0])
        assert generator.live_rows == 0


def test_a_caller_stepping_the_generator_never_sees_another_requests_callback_error(model):
    generator = Generator(model, max_rows=4, **DECODER)
    bad = generator.submit(PROMPTS[0], gen_length=6, on_event=boom)
    good = generator.submit(PROMPTS[1], gen_length=6)
    assert good.wait().tokens.tolist() == alone(model, PROMPTS[1])  # steps the generator itself
    with pytest.raises(CallbackError):
        bad.wait()
    assert [e.finished for e in good][-1]  # its events end with the final one
    assert generator.idle()


def test_a_callback_raising_on_the_final_event_is_detached_and_the_result_stands(model):
    seen = []

    def fail_at_end(event):
        seen.append(event)
        if event.finished:
            raise ValueError("late")

    generator = Generator(model, **DECODER)
    request = generator.submit(PROMPTS[2], gen_length=6, on_event=fail_at_end)
    assert request.wait().tokens.tolist() == alone(model, PROMPTS[2])
    assert request.status == "finished" and isinstance(request.callback_error, CallbackError)
    assert seen[-1].finished


def test_a_step_whose_bookkeeping_raises_fails_the_live_requests_and_the_generator_goes_on(model, monkeypatch):
    generator = Generator(model, max_rows=2, **DECODER)
    first = [generator.submit(p, gen_length=6) for p in PROMPTS[:2]]
    original, calls = Generator._report, []

    def broken(self, request, events, result):
        calls.append(request)
        if len(calls) == 1:
            raise KeyError("bookkeeping bug")
        return original(self, request, events, result)

    monkeypatch.setattr(Generator, "_report", broken)
    generator.step()  # admits both and raises inside: both fail, step() itself returns
    assert [r.status for r in first] == ["failed", "failed"]
    assert all(isinstance(r.error, KeyError) for r in first)
    monkeypatch.setattr(Generator, "_report", original)
    again = generator.submit(PROMPTS[3], gen_length=6)
    assert again.wait().tokens.tolist() == alone(model, PROMPTS[3])


def test_a_request_that_can_make_no_progress_raises_instead_of_waiting_forever(model):
    generator = Generator(model, **DECODER)
    request = generator.submit(PROMPTS[0], gen_length=6)
    generator.scheduler._waiting.clear()  # lost by a fault: neither queued nor decoding
    result = []
    thread = threading.Thread(target=lambda: result.append(pytest.raises(StalledError, request.wait)))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and result, "wait() returned"
    assert "can make no more progress" in str(result[0].value)
