"""Regression tests for edge cases found in review."""

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

import refusion
from refusion.decoder import Decoder
from refusion.errors import ConfigError
from refusion.models.mdm import HFMaskedDiffusionLM, tiny_bidirectional
from tests.helpers import tiny


class NoCacheNetwork(torch.nn.Module):
    """A bidirectional network whose forward takes no cache (like LLaDA's original code)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids, attention_mask=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


class PastKeyValuesNetwork(NoCacheNetwork):
    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          cache=past_key_values, use_cache=use_cache)


def test_fast_dllm_caches_need_a_network_that_takes_a_cache():
    from refusion.models.tiny import tiny_qwen3

    inner = tiny_qwen3(vocab_size=16)
    inner.config.is_causal = False
    plain = HFMaskedDiffusionLM(NoCacheNetwork(inner))
    assert not plain.capabilities.kv_cache
    decoder = Decoder.from_names(partitioner="semi-ar", infiller="draft", reorderer="prefix-cache", block_length=4)
    with pytest.raises(ConfigError, match="reorderer 'prefix-cache' needs a model with `kv_cache=True`"):
        decoder.decode(plain, [1, 2], 8)
    legacy = HFMaskedDiffusionLM(PastKeyValuesNetwork(inner))
    assert legacy.capabilities.kv_cache
    assert len(decoder.decode(legacy, [1, 2], 8).tokens) == 8
    no_cache = Decoder.from_names(partitioner="semi-ar", infiller="draft", block_length=4)
    assert len(no_cache.decode(plain, [1, 2], 8).tokens) == 8


def test_attention_without_custom_masks_falls_back_to_the_repeat_engine():
    from refusion.decoder import _takes_custom_masks

    model = tiny()
    assert _takes_custom_masks(model)
    model.model.config._attn_implementation = "flash_attention_2"
    with pytest.warns(UserWarning, match="using the 'repeat' engine"):
        assert not _takes_custom_masks(model)


def test_per_prompt_seeds_give_identical_prompts_different_samples():
    model = tiny(vocab=16, seed=9, scale=1.0)
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1, temperature=1.5)
    same = decoder.decode_batch(model, [[1, 2]] * 4, 8)
    assert len({str(r.tokens.tolist()) for r in same}) == 1
    varied = decoder.decode_batch(model, [[1, 2]] * 4, 8, seeds=[0, 1, 2, 3])
    assert len({str(r.tokens.tolist()) for r in varied}) > 1
    assert varied[2].tokens.tolist() == Decoder.from_names(slot_size=2, serial_num_blocks=1, temperature=1.5, seed=2).decode(
        model, [1, 2], 8).tokens.tolist()
    with pytest.raises(ConfigError, match="`seeds` must hold one integer >= 0 per prompt"):
        decoder.decode_batch(model, [[1, 2]] * 2, 8, seeds=[1])


def test_fit_length_rounds_to_what_the_partitioner_accepts():
    decoder = Decoder.from_names(slot_size=8, serial_num_blocks=2)
    assert decoder.fit_length(100) == 112
    assert decoder.fit_length(1) == 16


def test_eval_adapter_rounds_task_lengths_and_batches():
    pytest.importorskip("lm_eval")
    from refusion.evaluation import RefusionLM

    lm = RefusionLM(preset="paper", batch_size=2)  # slot 8 x 2 blocks: 100 tokens is no valid length
    requests = [SimpleNamespace(args=(p, {"until": ["\n"], "max_gen_toks": 100}))
                for p in ("copy abc=", "rev abcd=", "copy xyzw=")]
    assert lm.generate_until(requests) == ["abc", "dcba", "xyzw"]


def test_a_finished_rows_store_keeps_its_length_after_compaction():
    from refusion.cache.kv import KVSegment
    from refusion.cache.stores import PreallocatedKV

    buffer = PreallocatedKV(1, 2, 1, 16, 2, dtype=torch.float32, device="cpu")
    first, second = buffer.row(0), buffer.row(1)
    first.append(KVSegment(torch.ones(1, 2, 1, 3, 2)))
    second.append(KVSegment(torch.ones(1, 2, 1, 5, 2)))
    first.detach()
    buffer.lengths[0] = 99  # the row is reused by another sequence
    assert len(first) == 3
    with pytest.raises(RuntimeError, match="given up"):
        first.append(KVSegment(torch.ones(1, 2, 1, 1, 2)))


def test_cli_parameters_may_name_parts_and_lengths(capsys):
    from refusion.cli import main

    assert main(["generate", "copy abcd=", "-p", "selector=topk", "-p", "k=2", "-p", "gen_length=16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["steps"][0]["selected"]) == 2
    assert main(["generate", "copy ab=", "--selector", "topk", "-p", "selector=leftmost"]) == 2
    assert "`selector` is given twice" in capsys.readouterr().err


def test_a_dream_style_checkpoint_loads_with_its_shift(tmp_path):
    model = tiny_bidirectional(logit_shift=1, vocab_size=16)
    model.model.save_pretrained(tmp_path)
    loaded = refusion.load_model(str(tmp_path), adapter="hf-mdm", logit_shift=1)
    assert loaded.capabilities.logit_shift == 1 and not loaded.capabilities.causal
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(refusion.generate([1, 2], loaded, preset="llada", gen_length=32).tokens) == 32
