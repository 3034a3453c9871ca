"""The cache goes to the network under the keyword its forward takes: ``cache`` (transformers >= 5.24) or
``past_key_values`` (earlier 5.x, e.g. 5.17 on the GPU image); both releases swallow an unknown keyword into
``**kwargs``, so the wrong one would silently decode without the cache. Checked with a network renamed to the
other spelling than the installed release's."""

import inspect

from refusion.decoding.decoder import Decoder
from refusion.models.hf import HFCausalLM, cache_keyword
from refusion.models.mdm import HFMaskedDiffusionLM
from refusion.models.tiny import tiny_qwen3

#: the installed release's spelling, and the other one
NATIVE = cache_keyword(tiny_qwen3().forward)
OTHER = {"cache": "past_key_values", "past_key_values": "cache"}[NATIVE]


def with_keyword(network, name: str):
    """``network`` whose forward takes the cache as ``name`` only (any other spelling is ignored, as releases do)."""
    forward = network.forward

    def renamed(input_ids=None, position_ids=None, attention_mask=None, use_cache=None, logits_to_keep=0, **kwargs):
        return forward(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            **{NATIVE: kwargs.get(name)},
        )

    params = list(inspect.signature(renamed).parameters.values())
    params.insert(-1, inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None))
    renamed.__signature__ = inspect.Signature(params)
    network.forward = renamed
    return network


def test_the_keyword_is_read_from_the_forwards_signature():
    assert NATIVE in ("cache", "past_key_values")
    assert cache_keyword(with_keyword(tiny_qwen3(), OTHER).forward) == OTHER
    assert cache_keyword(lambda input_ids, **kwargs: None) is None


def test_a_network_that_spells_the_cache_otherwise_decodes_with_its_cache():
    native = HFCausalLM(tiny_qwen3(vocab_size=32, seed=4, logit_scale=6.0))
    other = HFCausalLM(with_keyword(tiny_qwen3(vocab_size=32, seed=4, logit_scale=6.0), OTHER))
    other._head = None  # its forward, not a separate backbone, computes the scores
    decoder = Decoder.from_names(slot_size=2, selector="leftmost", infiller="greedy-verify", engine="repeat")
    for prompt in ([1, 2, 3], [4, 5, 6, 7, 8, 9]):
        assert decoder.decode(other, prompt, 8).tokens.tolist() == decoder.decode(native, prompt, 8).tokens.tolist()
    mdm = HFMaskedDiffusionLM(with_keyword(tiny_qwen3(), OTHER))
    assert mdm._inputs(None, None, "the cache")[OTHER] == "the cache"
