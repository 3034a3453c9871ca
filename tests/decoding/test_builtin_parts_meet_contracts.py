"""refusion's own parts meet the contracts the decoder checks plugins against, so it may skip those checks for them.

By default the decoder checks every answer of a part from outside refusion
(selections, model calls, infill results, cache updates) and trusts the
built-ins. Here every combination drawn from the registry runs with the
built-ins checked too (``check_builtins``): no answer is refused, and the
tokens are those of the unchecked, default run.
"""

from __future__ import annotations

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from refusion.config import PART_KINDS
from refusion.decoding.checks import check_builtins, checks_answers
from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError
from refusion.models.mdm import tiny_bidirectional
from refusion.plugins.registry import registry
from tests.support.helpers import tiny

_MODELS: dict = {}


def _model(causal: bool):
    if causal not in _MODELS:
        _MODELS[causal] = (
            tiny(vocab=16, eos=2, scale=6.0) if causal else tiny_bidirectional(vocab_size=16, eos_token_id=2)
        )
    return _MODELS[causal]


def test_builtins_are_trusted_and_others_checked():
    for kind in PART_KINDS:
        for entry in registry().entries(kind):
            assert entry.cls.__module__.startswith("refusion.strategies.")
            assert not checks_answers(object.__new__(entry.cls)), entry.name

    class Outside(type(Decoder.from_names().selector)):
        pass

    assert checks_answers(Outside())
    previous = check_builtins(True)
    try:
        assert checks_answers(Decoder.from_names().selector)
    finally:
        check_builtins(previous)


@settings(max_examples=60)
@given(data=st.data())
def test_every_builtin_combination_passes_the_plugin_checks(data):
    causal = data.draw(st.booleans(), label="causal")
    names = {
        kind: data.draw(st.sampled_from([e.name for e in registry().entries(kind)]), label=kind) for kind in PART_KINDS
    }
    params = data.draw(
        st.fixed_dictionaries({}, optional={"slot_size": st.integers(1, 4), "serial_num_blocks": st.integers(1, 2)})
    )
    model = _model(causal)
    previous = check_builtins(True)
    try:
        decoder = Decoder.from_names(**names, **params)
        decoder.check_model(model)
        prompt = [3, 4, 5, 6][: data.draw(st.integers(1, 4), label="prompt length")]
        gen_length = decoder.fit_length(data.draw(st.integers(1, 12), label="gen_length"))
        checked = decoder.decode(model, prompt, gen_length)
    except ConfigError:  # parts that do not fit each other or the model are refused up front
        event("refused up front")
        return
    finally:
        check_builtins(previous)
    trusted = decoder.decode(model, prompt, gen_length)
    assert torch.equal(checked.tokens, trusted.tokens)
    assert checked.forwards == trusted.forwards
    event("decoded")
