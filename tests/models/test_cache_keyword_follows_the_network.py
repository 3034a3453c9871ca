"""The cache goes to the network under the keyword its forward takes: ``cache`` (transformers >= 5.24) or
``past_key_values`` (earlier 5.x, e.g. 5.17 on the GPU image); both releases swallow an unknown keyword into
``**kwargs``, so the wrong one would silently decode without the cache."""

import torch

from refusion.decoding.decoder import Decoder
from refusion.models.hf import HFCausalLM, cache_keyword
from refusion.models.mdm import HFMaskedDiffusionLM
from refusion.models.tiny import tiny_qwen3


def with_old_keyword(network):
    """``network`` whose forward takes the cache as ``past_key_values`` and ignores ``cache``, as before 5.24."""
    forward = network.forward

    def old(input_ids=None, position_ids=None, attention_mask=None, past_key_values=None, use_cache=None,
            logits_to_keep=0, **ignored):
        return forward(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                       cache=past_key_values, use_cache=use_cache, logits_to_keep=logits_to_keep)

    network.forward = old
    return network


def test_the_keyword_is_read_from_the_forwards_signature():
    assert cache_keyword(tiny_qwen3().forward) == "cache"
    assert cache_keyword(with_old_keyword(tiny_qwen3()).forward) == "past_key_values"
    assert cache_keyword(lambda input_ids, **kwargs: None) is None


def test_a_network_that_takes_past_key_values_decodes_with_its_cache():
    new = HFCausalLM(tiny_qwen3(vocab_size=32, seed=4, logit_scale=6.0))
    old = HFCausalLM(with_old_keyword(tiny_qwen3(vocab_size=32, seed=4, logit_scale=6.0)))
    old._head = None  # its forward, not a separate backbone, computes the scores
    decoder = Decoder.from_names(slot_size=2, selector="leftmost", infiller="greedy-verify", engine="repeat")
    for prompt in ([1, 2, 3], [4, 5, 6, 7, 8, 9]):
        assert decoder.decode(old, prompt, 8).tokens.tolist() == decoder.decode(new, prompt, 8).tokens.tolist()
    mdm = HFMaskedDiffusionLM(with_old_keyword(tiny_qwen3()))
    assert mdm._inputs(None, None, "the cache")["past_key_values"] == "the cache"
