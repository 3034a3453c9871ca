"""The generator's small serving additions: a bounded queue, its state, and surviving an engine error."""

import pytest

from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError, QueueFull
from refusion.generator import Generator
from tests.support.helpers import tiny


def test_a_full_queue_refuses_new_requests_until_one_is_admitted():
    model = tiny(vocab=16, seed=1, scale=8.0)
    generator = Generator(
        model, Decoder.from_names(slot_size=2, serial_num_blocks=1), gen_length=4, max_rows=1, max_queue=2
    )
    generator.submit([1, 2])
    generator.submit([3, 4])
    with pytest.raises(QueueFull, match="`max_queue` \\(2\\)"):
        generator.submit([5, 6])
    generator.step()  # admits one: room in the queue again
    generator.submit([5, 6])
    generator.run_until_idle()
    assert generator.idle() and generator.live_rows == 0


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_queue_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match="`max_queue` must be an integer >= 1 \\(None = unbounded\\)"):
        Generator(tiny(vocab=16, seed=1), Decoder.from_names(), max_queue=bad)


def test_closing_and_running_report_the_generator_state():
    generator = Generator(tiny(vocab=16, seed=1), Decoder.from_names(slot_size=2), gen_length=4)
    assert not generator.running and not generator.closing
    generator.start()
    assert generator.running
    generator.close()
    assert generator.closing and not generator.running


def test_an_engine_error_fails_the_live_requests_and_the_generator_goes_on():
    model = tiny(vocab=16, seed=4, scale=8.0)
    decoder = Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=1, serial_num_blocks=1)
    generator = Generator(model, decoder, gen_length=6, max_rows=2)
    live = [generator.submit([1, 2]), generator.submit([2, 3])]
    waiting = generator.submit([3, 4])
    engine = generator.engine
    calls = []

    def broken(run):  # the second forward fails, whatever its rows decode
        def forward(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("device lost")
            return run(*args, **kwargs)

        return forward

    engine.run, engine.forward = broken(engine.run), broken(engine.forward)
    generator.start()
    for request in live:
        with pytest.raises(RuntimeError, match="device lost"):
            request.wait(timeout=30)
        assert request.status == "failed" and list(request)[-1].error is request.error
    assert waiting.wait(timeout=30).tokens.tolist() == decoder.decode(model, [3, 4], 6).tokens.tolist()
    generator.close()
    assert generator.live_rows == 0 and generator.reserved_tokens == 0


def test_a_request_that_cannot_start_fails_alone(monkeypatch):
    model = tiny(vocab=16, seed=4, scale=8.0)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1)
    generator = Generator(model, decoder, gen_length=4)
    doomed, fine = generator.submit([1, 2]), generator.submit([2, 3])
    start = type(decoder).start

    def no_room(self, model, engine, prepared, **options):
        if prepared is doomed.prepared:
            raise MemoryError("no room for its cache")
        return start(self, model, engine, prepared, **options)

    monkeypatch.setattr(Decoder, "start", no_room)
    generator.run_until_idle()
    assert doomed.status == "failed" and isinstance(doomed.error, MemoryError)
    assert fine.result.tokens.tolist() == decoder.decode(model, [2, 3], 4).tokens.tolist()
