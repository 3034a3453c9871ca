"""The field's strategies on hand-made logits: which positions are unmasked at which step."""

import pytest
import torch

from refusion.decoding.decoder import Decoder
from refusion.errors import ConfigError
from refusion.models.mdm import tiny_bidirectional
from refusion.testing import ScriptedModel, check_result, one_hot_logits

V, MASK, EOS = 12, 11, 2
TOKEN = {p: 3 + p % 7 for p in range(20)}  # the draft at each position
CONF = {1: 0.5, 2: 0.9, 3: 0.7, 4: 0.6, 5: 0.95, 6: 0.4, 7: 0.8, 8: 0.3}


def bidirectional(conf=CONF, token=TOKEN, shift=0, predicts_next=None):
    """A bidirectional scripted model; its output at position p is about p + 1 when ``predicts_next``."""
    ahead = shift if predicts_next is None else int(predicts_next)

    def rule(seen, position, tok):
        target = position + ahead
        return one_hot_logits(V, token[target], conf.get(target, 0.5))

    return ScriptedModel(rule, vocab_size=V, mask_token_id=MASK, eos_token_id=EOS, causal=False, logit_shift=shift)


def steps(result):
    return [sorted(s for s, _ in step.committed) for step in result.iterations]


def mdm(selector, **params):
    return Decoder.from_names(partitioner="semi-ar", selector=selector, infiller="draft", block_length=4, **params)


def test_llada_low_confidence_unmasks_the_k_most_confident_per_step_block_by_block():
    result = mdm("topk", k=2).decode(bidirectional(), [0], 8, record=True)
    # slot index = position - 1; block 0 = positions 1-4, block 1 = positions 5-8
    assert steps(result) == [[1, 2], [0, 3], [4, 6], [5, 7]]
    assert result.tokens.tolist() == [TOKEN[p] for p in range(1, 9)]
    assert result.forwards == 4  # one full-canvas forward per step


def test_llada_random_remasking_is_seeded_and_respects_blocks():
    runs = [steps(mdm("random", k=2, seed=s).decode(bidirectional(), [0], 8, record=True)) for s in (0, 0, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len({str(r) for r in runs[1:]}) > 1
    for run in runs:
        assert [len(s) for s in run] == [2, 2, 2, 2]
        assert set(run[0] + run[1]) == {0, 1, 2, 3} and set(run[2] + run[3]) == {4, 5, 6, 7}


def test_fast_dllm_threshold_unmasks_everything_above_it_else_the_best():
    result = mdm("threshold", slot_threshold=0.75).decode(bidirectional(), [0], 8, record=True)
    assert steps(result) == [[1], [2], [3], [0], [4, 6], [5], [7]]


def test_fast_dllm_factor_rule():
    # block 0 confidences .9 .7 .6 .5: (n+1)(1-c_n) = .2, .9, 1.6, 2.5 < 1 for n <= 2
    result = mdm("factor", factor=1.0).decode(bidirectional(), [0], 8, record=True)
    assert steps(result) == [[1, 2], [3], [0], [4, 6], [5], [7]]


def test_margin_and_entropy_on_a_full_decode():
    expected_first = max((p for p in range(1, 5)), key=lambda p: CONF[p]) - 1
    for selector in ("margin", "entropy"):
        result = mdm(selector, k=1).decode(bidirectional(), [0], 8, record=True)
        assert steps(result)[0] == [expected_first]  # with one-hot-like rows both rank like confidence
        assert result.num_iterations == 8


def test_early_stop_at_eos_and_without_it():
    conf = {p: 0.5 for p in range(1, 9)} | {3: 0.99}
    token = dict(TOKEN) | {3: EOS}
    stop = mdm("topk", k=1).decode(bidirectional(conf, token), [0], 8, record=True)
    assert stop.tokens.tolist() == [TOKEN[1], TOKEN[2], EOS] and stop.stopped_at_eos
    assert stop.num_iterations == 3  # positions 4-8 were dropped, not decoded
    import attrs

    full = attrs.evolve(mdm("topk", k=1), stop_at_eos=False).decode(bidirectional(conf, token), [0], 8, record=True)
    assert full.tokens.tolist() == stop.tokens.tolist()
    assert full.num_iterations == 8


def test_dream_style_shift_reads_the_previous_positions_logits():
    # the model's output at position p predicts p + 1 (shift 1): tokens must land where they were predicted
    result = mdm("topk", k=4).decode(bidirectional(shift=1), [0], 8, record=True)
    assert result.tokens.tolist() == [TOKEN[p] for p in range(1, 9)]
    misread = mdm("topk", k=4).decode(bidirectional(shift=0, predicts_next=True), [0], 8, record=True)
    assert misread.tokens.tolist() == [TOKEN[p + 1] for p in range(1, 9)]  # what ignoring the shift would give


@pytest.mark.parametrize("reorderer", ["commit-order", "prefix-cache", "dual-cache"])
def test_fast_dllm_caches_feed_less_after_each_block_start(reorderer):
    model = tiny_bidirectional(vocab_size=16, seed=2, logit_scale=4.0)
    lengths = []
    scores = model.scores

    def recording(input_ids, *args, **kwargs):
        lengths.append(input_ids.shape[1])
        return scores(input_ids, *args, **kwargs)

    model.scores = recording
    decoder = Decoder.from_names(
        partitioner="semi-ar", selector="topk", infiller="draft", reorderer=reorderer, block_length=4
    )
    result = decoder.decode(model, [1, 3, 5], 12, record=True)
    check_result(result, model)
    # canvas of 3 + 12 = 15 positions; blocks start at 3, 7, 11
    expected = {
        "commit-order": [15] * 12,
        "prefix-cache": [15, 12, 12, 12, 15, 8, 8, 8, 15, 4, 4, 4],
        "dual-cache": [15, 4, 4, 4] * 3,
    }[reorderer]
    assert lengths == expected


def test_causal_only_and_bidirectional_only_parts_are_refused_with_a_reason():
    with pytest.raises(ConfigError, match="infiller 'parallel-ar' needs a model with `causal=True`"):
        Decoder.from_names().decode(tiny_bidirectional(vocab_size=16), [1], 16, record=True)
    from tests.support.helpers import tiny

    with pytest.raises(ConfigError, match="reorderer 'dual-cache' needs a model with `causal=False`"):
        Decoder.from_names(reorderer="dual-cache").decode(tiny(), [1], 16, record=True)


def test_mdm_strategies_also_run_on_the_causal_refusion_model():
    from tests.support.helpers import tiny

    model = tiny(vocab=16, seed=4, scale=6.0, eos=2)
    for selector in ("topk", "threshold", "factor", "random"):
        result = mdm(selector).decode(model, [1, 2], 8, record=True)
        check_result(result, model)


class NoCacheNetwork(torch.nn.Module):
    """A bidirectional network whose forward takes no cache (like LLaDA's original code)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids, attention_mask=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


class PastKeyValuesNetwork(NoCacheNetwork):
    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None):
        return self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=past_key_values,
            use_cache=use_cache,
        )


def test_fast_dllm_caches_need_a_network_that_takes_a_cache():
    from refusion.models.mdm import HFMaskedDiffusionLM
    from refusion.models.tiny import tiny_qwen3

    inner = tiny_qwen3(vocab_size=16)
    inner.config.is_causal = False
    plain = HFMaskedDiffusionLM(NoCacheNetwork(inner))
    assert not plain.capabilities.kv_cache
    decoder = Decoder.from_names(partitioner="semi-ar", infiller="draft", reorderer="prefix-cache", block_length=4)
    with pytest.raises(ConfigError, match="reorderer 'prefix-cache' needs a model with `kv_cache=True`"):
        decoder.decode(plain, [1, 2], 8, record=True)
    legacy = HFMaskedDiffusionLM(PastKeyValuesNetwork(inner))
    assert legacy.capabilities.kv_cache
    assert len(decoder.decode(legacy, [1, 2], 8, record=True).tokens) == 8
    no_cache = Decoder.from_names(partitioner="semi-ar", infiller="draft", block_length=4)
    assert len(no_cache.decode(plain, [1, 2], 8, record=True).tokens) == 8


def test_a_dream_style_checkpoint_loads_with_its_shift(tmp_path):
    import warnings

    import refusion

    model = tiny_bidirectional(logit_shift=1, vocab_size=16)
    model.model.save_pretrained(tmp_path)
    loaded = refusion.load_model(str(tmp_path), adapter="hf-mdm", logit_shift=1)
    assert loaded.capabilities.logit_shift == 1 and not loaded.capabilities.causal
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(refusion.generate([1, 2], loaded, preset="llada", gen_length=32, record=True).tokens) == 32
