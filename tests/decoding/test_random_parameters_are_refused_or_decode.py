"""Any value for any parameter of any registered part: a quick ConfigError or a valid decode, nothing else.

Values include NaN, infinities, negatives, huge integers and wrong types. A
refusal must come within 100 ms of CPU time (before any real work); an
accepted value must give a well-formed answer on a tiny model.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from refusion.config import PART_KINDS
from refusion.decoding.decoder import Decoder
from refusion.decoding.types import DecodeResult
from refusion.errors import ConfigError
from refusion.models.mdm import tiny_bidirectional
from refusion.plugins.registry import registry
from tests.support.helpers import tiny

GEN_LENGTH = 16  # two 8-token slots for the default fixed partitioner (2 blocks)
PROMPT = [3, 4, 5]

bad_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -1, 0, 1e300, 2**64, 10**30, None, "1", [1]]),
    st.integers(-(2**70), 2**70),
    st.text(max_size=3),
)
#: values many parameters accept, so that decodes happen as well as refusals
plausible_values = st.one_of(st.integers(1, 8), st.floats(0, 1), st.booleans(), st.sampled_from([10**9, 2**63]))
values = st.one_of(bad_values, plausible_values, plausible_values, plausible_values)

#: the decoder's own options and the sampling shorthands, taken by every decoder
DECODER_PARAMS = ("seed", "calls_per_token", "stop_at_eos", "engine", "temperature", "top_k", "top_p")


def _targets() -> list[tuple[str, str, str]]:
    """(kind, part name, parameter) for every parameter of every registered part, plus the decoder's options."""
    out = [
        (kind, entry.name, param)
        for kind in PART_KINDS
        for entry in registry().entries(kind)
        for param in entry.parameters()
    ]
    out += [
        (kind, entry.name, "") for kind in PART_KINDS for entry in registry().entries(kind) if not entry.parameters()
    ]  # parts without parameters still decode with the others' random values
    return out + [("decoder", "", p) for p in DECODER_PARAMS]


_MODELS: dict = {}


def _model(causal: bool):
    if causal not in _MODELS:
        _MODELS[causal] = tiny(vocab=16, eos=2) if causal else tiny_bidirectional(vocab_size=16, eos_token_id=2)
    return _MODELS[causal]


def _parts_for(kind: str, name: str) -> tuple[dict, bool]:
    """Part specs that run ``name`` with compatible companions, and whether the model must be causal."""
    if kind == "decoder" or not name:
        return {}, True
    cls = registry().get(kind, name)
    causal = cls.requires.get("causal", True)
    specs = {} if causal else {"infiller": "draft"}  # the default infiller needs a causal model
    specs[kind] = name
    return specs, causal


@settings(max_examples=45)
@given(
    target=st.sampled_from(_targets()),
    value=values,
    extra=st.sampled_from((None,) * 6 + DECODER_PARAMS),
    extra_value=values,
)
def test_any_parameter_value_is_refused_quickly_or_decodes(target, value, extra, extra_value):
    kind, name, param = target
    specs, causal = _parts_for(kind, name)
    params = {} if not param else {(f"{kind}.{param}" if kind != "decoder" else param): value}
    if extra is not None and extra not in params:
        params[extra] = extra_value
    model = _model(causal)
    started = time.process_time()
    try:
        decoder = Decoder.from_names(**specs, **params)
        prepared = decoder.prepare(model, PROMPT, GEN_LENGTH)
    except ConfigError:
        assert time.process_time() - started < 0.1
        event("refused")  # (see --hypothesis-show-statistics)
        return
    event("decoded")
    result = decoder.decode(model, PROMPT, GEN_LENGTH)
    assert prepared.partition.gen_length == GEN_LENGTH
    assert isinstance(result, DecodeResult) and 1 <= len(result.tokens) <= GEN_LENGTH
    tokens = result.tokens.tolist()
    assert all(0 <= t < model.vocab_size and t != model.mask_token_id for t in tokens)
    assert time.process_time() - started < 10  # ended: at most one iteration per slot


@pytest.mark.parametrize("kind, name, param", [t for t in _targets() if t[2]])
def test_nan_is_refused_for_every_parameter(kind, name, param):
    specs, _ = _parts_for(kind, name)
    key = f"{kind}.{param}" if kind != "decoder" else param
    with pytest.raises(ConfigError, match=f"`{'.*' if kind != 'decoder' else ''}{param}`"):
        Decoder.from_names(**specs, **{key: float("nan")})
