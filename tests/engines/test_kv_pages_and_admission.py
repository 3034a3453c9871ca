"""Live rows on pages: memory is what the rows hold, nothing moves when a row leaves, and requests are admitted by
the memory they may need, never failing a running one."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.decoding.decoder import Decoder
from refusion.engines.branch import BranchEngine
from refusion.engines.factory import open_engine
from refusion.errors import ConfigError
from refusion.generator import Generator
from tests.support.helpers import SESSION_PATHS, draw_paged_setup, tiny

#: the two whole-batch loops (their rows' lengths settle after every forward) and a per-sequence program
PATHS = ["lossless loop", "plan-and-infill loop", "program (random selector, re-encoding)"]


def probe(engine: BranchEngine) -> list[tuple[int, int]]:
    """After every settled forward of a whole-batch loop: (pages held, pages the live rows' own columns fill)."""
    samples: list[tuple[int, int]] = []
    for name in ("keep_columns", "hold_columns"):
        original = getattr(engine, name)

        def settled(states, counts, _original=original):
            _original(states, counts)
            own = sum(engine.kv.pages_for(state.store.table.length) for state in states)
            samples.append((engine.kv.pool.used, own))

        setattr(engine, name, settled)
    return samples


@pytest.mark.parametrize("name", PATHS)
@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_ragged_rows_hold_only_their_own_pages_and_nothing_moves_when_one_leaves(name, data):
    vocab = 16
    model, decoder, page_size = draw_paged_setup(data, name, vocab)
    prompts = data.draw(st.lists(st.lists(st.integers(0, vocab - 2), min_size=1, max_size=12), min_size=2, max_size=5))
    gens = [4 * data.draw(st.integers(1, 3)) for _ in prompts]  # rows leave at different steps

    engine = BranchEngine(model, page_size=page_size)
    samples = probe(engine)
    generator = Generator(model, decoder, engine=engine, max_rows=len(prompts))
    requests = [generator.submit(p, gen_length=g, seed=i) for i, (p, g) in enumerate(zip(prompts, gens))]
    results = [r.wait() for r in requests]

    for (prompt, gen, seed), result in zip(zip(prompts, gens, range(len(prompts))), results):
        alone = Generator(model, decoder, engine="branch", prefix_cache=False).submit(prompt, gen_length=gen, seed=seed)
        assert result.tokens.tolist() == alone.wait().tokens.tolist()
    assert bool(samples) == name.endswith("loop")  # programs run through the engine's per-call path instead
    assert all(held == own for held, own in samples)  # after each forward: exactly the pages the rows fill
    assert engine.counters.kv_context_bytes == engine.kv.pool.growth_bytes  # no row copied, leaving or not
    assert engine.kv.pool.used == 0 and not engine.reserved  # every row gave its pages back


def budget_for(model, pages: int, page_size: int = 4) -> int:
    """``kv_memory`` bytes of ``pages`` pages of ``model``'s keys/values."""
    return pages * BranchEngine(model, page_size=page_size, kv_memory=1).kv.pool.page_bytes


def test_requests_wait_for_memory_and_a_running_one_never_lacks_room():
    model = tiny(vocab=16, seed=3)
    decoder = Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=2)
    engine = BranchEngine(model, page_size=4, kv_memory=budget_for(model, 8))  # one request's reservation fits
    assert engine.reservation(6, 8) == 7  # (6 + 2 * 8) tokens -> 6 pages, plus one
    generator = Generator(model, decoder, engine=engine, max_rows=4, gen_length=8)
    requests = [generator.submit([1 + i, 2, 3, 4, 5, 6]) for i in range(3)]
    generator.step()
    assert [r.status for r in requests] == ["running", "waiting", "waiting"]  # rows are free, memory is not
    while not generator.idle():
        generator.step()
        assert sum(r.status == "running" for r in requests) <= 1 and engine.kv.pool.over_limit == 0
    for i, request in enumerate(requests):
        assert request.status == "finished"
        expected = Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=2).decode(
            model, [1 + i, 2, 3, 4, 5, 6], 8
        )
        assert request.result.tokens.tolist() == expected.tokens.tolist()


def test_a_request_that_cannot_fit_even_alone_is_refused_at_submit_naming_kv_memory():
    model = tiny(vocab=16, seed=3)
    engine = BranchEngine(model, page_size=4, kv_memory=budget_for(model, 4))
    generator = Generator(model, Decoder.from_names(slot_size=2), engine=engine, gen_length=8)
    with pytest.raises(ConfigError, match="kv_memory") as error:
        generator.submit([1, 2, 3, 4, 5, 6])
    assert error.value.param == "kv_memory" and "needs 7 pages" in str(error.value)
    small = generator.submit([1], gen_length=4)  # (1 + 2 * 4) tokens -> 3 pages, plus one: fits
    assert small.wait() is not None and small.status == "finished"


def open_live_engine_with_a_budget():
    model = tiny(vocab=16)
    return open_engine(model, None, BranchEngine(model), kv_memory=1 << 20)


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: BranchEngine(tiny(vocab=16), kv_memory=0), "kv_memory"),
        (lambda: Generator(tiny(vocab=16), kv_memory="8GiB"), "kv_memory"),
        (lambda: Generator(tiny(vocab=16), engine="repeat", kv_memory=1 << 20), "engine 'repeat' has none"),
        (lambda: open_live_engine_with_a_budget(), "live engine"),
    ],
)
def test_bad_kv_memory_is_refused_naming_it(build, words):
    with pytest.raises(ConfigError, match=words) as error:
        build()
    assert error.value.param == "kv_memory"


def test_the_server_answers_a_request_too_large_for_its_kv_memory_with_a_400_naming_it():
    from fastapi.testclient import TestClient

    from refusion.api import load_model
    from refusion.serve import create_app

    model = load_model()
    pages = BranchEngine(model, kv_memory=1).kv.pool
    generator = Generator(model, kv_memory=8 * pages.page_bytes)  # 8 pages of 16 tokens
    with TestClient(create_app(generator)) as client:
        body = {"model": "refusion", "prompt": "rev hello=", "max_tokens": 8}
        assert client.post("/v1/completions", json=body).status_code == 200
        too_long = client.post("/v1/completions", json={**body, "max_tokens": 64})  # 10 + 2 * 64 tokens: 10 pages
        assert too_long.status_code == 400, too_long.text
        error = too_long.json()["error"]
        assert error["param"] == "kv_memory" and "kv_memory" in error["message"]


@pytest.mark.parametrize("name", PATHS[1:])
def test_the_paged_kernel_gives_the_tokens_of_gathered_attention(name, monkeypatch):
    """``paged_kernel=True`` (the default on CUDA) reads each row's keys from its pages in the Triton kernel; here
    it runs in Triton's interpreter on ragged rows, branches and chains alike."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from refusion_kernels import backend

    backend.triton_available.cache_clear()
    model = tiny(vocab=16, seed=11)
    decoder = Decoder.from_names(**SESSION_PATHS[name])
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [13]]  # pages of 4: rows of one and of two pages
    kernel = BranchEngine(model, paged_kernel=True, page_size=4)
    gathered = BranchEngine(model, paged_kernel=False, page_size=4)
    a = decoder.decode_batch(model, prompts, 4, engine=kernel)
    b = decoder.decode_batch(model, prompts, 4, engine=gathered)
    assert [r.tokens.tolist() for r in a] == [r.tokens.tolist() for r in b]
    backend.triton_available.cache_clear()


def test_the_paged_kernel_is_refused_where_it_cannot_run(monkeypatch):
    from refusion_kernels import backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    backend.triton_available.cache_clear()
    try:
        with pytest.raises(ConfigError, match="paged_kernel") as error:
            BranchEngine(tiny(vocab=16), paged_kernel=True)  # no GPU here and no interpreter
        assert error.value.param == "paged_kernel"
        assert not BranchEngine(tiny(vocab=16)).paged_kernel  # the default on the CPU: gathered rows
    finally:
        backend.triton_available.cache_clear()


def test_a_request_whose_start_fails_gives_its_pages_and_reservation_back():
    model = tiny(vocab=16, seed=3)
    engine = BranchEngine(model, prefix_cache=True, page_size=4, kv_memory=budget_for(model, 16))
    generator = Generator(model, Decoder.from_names(slot_size=2), engine=engine, gen_length=8)
    generator.submit([1, 2, 3, 4, 5, 6]).wait()  # its full page is in the prefix cache now
    for _ in range(3):  # guidance needs another engine: the start fails after the engine admitted the sequence
        with pytest.raises(ConfigError, match="cfg_scale"):
            generator.submit([1, 2, 3, 4, 5, 7], decoder=Decoder.from_names(slot_size=2, cfg_scale=1.0)).wait()
    assert not engine.reserved and engine.kv.pool.used == len(engine.prefixes) == engine.prefixes.evictable
    assert generator.submit([1, 2, 3, 4, 9, 9]).wait() is not None  # and the next request runs


def test_a_request_that_no_longer_fits_with_nothing_running_fails_instead_of_waiting():
    model = tiny(vocab=16, seed=3)
    engine = BranchEngine(model, page_size=4, kv_memory=budget_for(model, 16))
    generator = Generator(model, Decoder.from_names(slot_size=2), engine=engine, gen_length=8)
    request = generator.submit([1, 2, 3, 4, 5, 6])  # fits the budget when submitted
    engine.kv.pool.limit = 4  # then the device lost memory (a failed growth shrinks the budget so)
    with pytest.raises(ConfigError, match="kv_memory"):
        request.wait()
    assert request.status == "failed" and generator.idle()
