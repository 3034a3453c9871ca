"""A part that raises, answers malformed or calls ``sys.exit()`` for one request of a running batch fails that request
only: its pages and reservation go back, every other row of the shared steps gets what it gets alone, and the
generator's thread keeps serving."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import attrs
import pytest

from refusion.decoding.decoder import Decoder
from refusion.errors import PluginError
from refusion.generator import Generator
from refusion.models.mdm import tiny_bidirectional
from refusion.strategies.base import Reviser, SlotSelector
from refusion.strategies.selectors.threshold import ConfidenceThreshold
from tests.support.helpers import tiny

PROMPTS = [[1, 2], [3, 4, 5], [6, 7, 8, 9], [2, 9], [5, 5, 5, 5, 5]]
GEN = 8


def _fail(how: str):
    if how == "raise":
        raise RuntimeError("boom")
    if how == "exit":
        sys.exit(3)
    if how == "interrupt":
        raise KeyboardInterrupt
    raise AssertionError(how)


@attrs.frozen
class FailsOnOneCanvas(ConfidenceThreshold):
    """The paper's selector, except for the plans whose canvas is ``canvas`` tokens long: there it fails ``how``
    (raise, exit, interrupt, or a malformed answer: too few choices, an empty choice)."""

    name = "fails-on-one-canvas-test"
    canvas: int = 0
    how: str = "raise"

    def select(self, plan) -> Sequence[int]:
        if plan.canvas_length == self.canvas:
            if self.how == "empty":
                return []
            if self.how == "short":
                return [len(plan) + 5]
            _fail(self.how)
        return super().select(plan)

    def choose(self, plans):
        bad = [i for i in range(len(plans)) if plans[i].canvas_length == self.canvas]
        if bad and self.how == "short":
            return [[0]] * (len(plans) - 1)  # one choice too few for the whole group
        if bad and self.how == "empty":
            return [[] if i in bad else list(super().select(plans[i])) for i in range(len(plans))]
        if bad:
            _fail(self.how)
        return super().choose(plans)


def _generator(model, decoder):
    return Generator(model, decoder, gen_length=GEN, max_rows=8).start()


@pytest.mark.parametrize("how", ["raise", "exit", "interrupt", "short", "empty"])
def test_a_selector_failing_for_one_request_of_a_batch_fails_that_request_alone(how):
    model = tiny(vocab=24, seed=4)
    target = len(PROMPTS[2]) + GEN
    decoder = Decoder.from_names(selector=FailsOnOneCanvas(canvas=target, how=how), slot_size=2, token_threshold=0.4)
    plain = Decoder.from_names(selector=ConfidenceThreshold(), slot_size=2, token_threshold=0.4)
    generator = _generator(model, decoder)
    try:
        requests = [generator.submit(p) for p in PROMPTS]
        for prompt, request in zip(PROMPTS, requests):
            if len(prompt) + GEN == target:
                with pytest.raises(PluginError, match="fails-on-one-canvas-test"):
                    request.wait(timeout=60)
                assert request.status == "failed"
            else:
                alone = plain.decode(model, prompt, GEN)
                assert request.wait(timeout=60).tokens.tolist() == alone.tokens.tolist()
        later = generator.submit(PROMPTS[0])  # the thread still serves
        assert later.wait(timeout=60).tokens.tolist() == plain.decode(model, PROMPTS[0], GEN).tokens.tolist()
        engine = generator.engine
        assert not engine.reserved and engine.kv.pool.used == len(engine.prefixes or ())
    finally:
        generator.close()


@attrs.frozen
class ExitsOnOneBlock(Reviser):
    """Revises nothing, except in the blocks that end at region offset ``stop``: there it calls ``sys.exit()``."""

    name = "exits-on-one-block-test"
    stop: int = 0

    def revise(self, view):
        if view.block_stop == self.stop:
            sys.exit(5)
        return None


def test_a_reviser_calling_sys_exit_in_one_request_ends_that_request_and_not_the_thread():
    model = tiny_bidirectional(vocab_size=24, seed=3)
    parts = dict(partitioner="semi-ar", selector="topk", infiller="draft", reorderer="no-cache", block_length=4)
    decoder = Decoder.from_names(reviser=ExitsOnOneBlock(stop=GEN + 2), **parts)
    generator = Generator(model, decoder, gen_length=GEN, max_rows=8).start()
    try:
        lengths = [GEN, GEN, GEN + 2, GEN]
        requests = [generator.submit(p, gen_length=n) for p, n in zip(PROMPTS, lengths)]
        for prompt, n, request in zip(PROMPTS, lengths, requests):
            if n == GEN + 2:
                with pytest.raises(PluginError, match="exits-on-one-block-test.*SystemExit"):
                    request.wait(timeout=60)
            else:
                assert request.wait(timeout=60).tokens.tolist() == decoder.decode(model, prompt, n).tokens.tolist()
        assert generator.running  # the decoding thread is alive
        again = generator.submit(PROMPTS[0])
        assert again.wait(timeout=60).tokens.tolist() == decoder.decode(model, PROMPTS[0], GEN).tokens.tolist()
    finally:
        generator.close()


@attrs.frozen
class RaisesOnLongPlans(SlotSelector):
    """A per-sequence selector (no batched ``choose``) that raises for plans of more than ``slots`` slots."""

    name = "raises-on-long-plans-test"
    slots: int = 3

    def select(self, plan):
        if len(plan) > self.slots:
            raise ValueError("too many slots")
        return [0]


def test_decoding_a_batch_directly_raises_the_failure_and_gives_every_page_back():
    model = tiny(vocab=24, seed=2)
    decoder = Decoder.from_names(selector=RaisesOnLongPlans(slots=3), slot_size=1, serial_num_blocks=1)
    from refusion.engines import open_engine

    engine = open_engine(model, decoder, None)
    with pytest.raises(PluginError, match="raises-on-long-plans-test.*too many slots"):
        decoder.decode_batch(model, PROMPTS, GEN, engine=engine)
    assert not engine.reserved and engine.kv.pool.used == len(engine.prefixes or ())
