"""A Fast-dLLM v2 checkpoint loads into transformers' ``Qwen2ForCausalLM`` (no remote code) and the ``fast-dllm-v2``
preset gives its authors' own tokens (the checkpoint's ``Fast_dLLM_QwenForCausalLM.generate``, the model card's
call), call for call, on a tiny checkpoint built by the authors' class, in float32 and bfloat16 (the goldens:
``tests/fixtures/peers/fast_dllm_v2``, made by ``tools/peer_fixtures/fast_dllm_v2.py``)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import refusion
from refusion.errors import ConfigError
from tests.support.kernels import cpu_kernel_family

FDV2 = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "fast_dllm_v2"
GOLDEN = json.loads((FDV2 / "golden.json").read_text())
MADE_ON = json.loads((FDV2 / "cpu.json").read_text())["made_on"]
CALLS = GOLDEN["calls"]
EOT = 2  # <|im_end|>, the calls' stop_token


@functools.cache
def model(dtype: str):
    return refusion.load_model(str(FDV2), dtype=getattr(torch, dtype))


def decode(call: dict, prompts=None, **overrides):
    prompt = GOLDEN["prompts"][call["prompt"]] if prompts is None else prompts
    args = {k: v for k, v in {**call["args"], **overrides}.items() if v is not None}
    return refusion.generate(prompt, model(call["dtype"]), preset="fast-dllm-v2", **args)


def their_length(call: dict) -> dict:
    """The call with ``gen_length`` the authors' answer's length (their answer ends on their block grid, plus the
    token the last block's forward predicts) instead of ``max_new_tokens``."""
    return {"max_new_tokens": None, "gen_length": len(call["tokens"])}


def prefills(call: dict) -> int:
    """The authors' forwards refusion does not run: their prompt prefill, a forward of its own when the prompt is
    longer than a block and does not end on one (refusion feeds it with the first block: the same keys/values)."""
    n, block = len(GOLDEN["prompts"][call["prompt"]]), call["args"]["block_size"]
    return int(n > block and n % block != 0)


def test_the_checkpoint_loads_as_a_stock_qwen2_with_block_causal_attention_and_a_token_shift():
    m = model("float32")
    assert type(m.model).__name__ == "Qwen2ForCausalLM" and m.family == "fast-dllm-v2"
    assert (m.capabilities.block_length, m.capabilities.logit_shift, m.capabilities.causal) == (8, 1, False)
    assert m.mask_token_id == GOLDEN["mask_token_id"] == m.tokenizer.convert_tokens_to_ids("|<MASK>|")
    assert EOT in m.eos_token_ids


FLOAT32 = [i for i, c in enumerate(CALLS) if c["dtype"] == "float32"]


#: one float32 call per setting, decoded as written (``max_new_tokens``); every call is decoded to the authors'
#: length below, the same decoder with another answer length
AS_WRITTEN = sorted({CALLS[i]["note"]: i for i in FLOAT32}.values())


@pytest.mark.parametrize("index", AS_WRITTEN, ids=lambda i: f"float32-{CALLS[i]['note'][:3]}-{i}")
def test_a_call_as_written_gives_the_authors_tokens_over_the_common_length(index):
    call = CALLS[index]
    ours = decode(call).tokens.tolist()
    theirs = call["tokens"]
    n = min(len(ours), len(theirs))
    assert ours[:n] == theirs[:n]
    assert len(ours) == call["args"]["max_new_tokens"] or ours[-1] == EOT


@pytest.mark.parametrize("index", FLOAT32, ids=lambda i: f"float32-{CALLS[i]['note'][:3]}-{i}")
def test_each_float32_call_to_their_length_gives_their_tokens_in_their_forwards_less_the_prefill(index):
    call = CALLS[index]
    result = decode(call, **their_length(call))
    assert result.tokens.tolist() == call["tokens"]
    assert result.forwards == call["forwards"] - prefills(call)


#: bfloat16 calls whose tokens differ (a named exception, docs/models.md): with blocks of 4 on the 8-block
#: checkpoint, refusion computes the prompt's last block with the first generation block in one forward where the
#: authors prefill it alone, and torch's CPU kernels round bfloat16 products of different row counts otherwise
BF16_AGREEMENT = 54


def test_bfloat16_calls_give_the_authors_tokens_but_one():
    if cpu_kernel_family() != MADE_ON:
        pytest.skip(f"the bfloat16 goldens were made on a {MADE_ON} CPU (other kernels round bf16 otherwise)")
    calls = [c for c in CALLS if c["dtype"] == "bfloat16"]
    same = 0
    for call in calls:
        result = decode(call, **their_length(call))
        same += result.tokens.tolist() == call["tokens"]
    assert same >= BF16_AGREEMENT, f"{same} of {len(calls)}"


def test_the_goldens_exercise_sub_blocks_parallel_steps_a_stop_and_prompts_across_blocks():
    assert {c["dtype"] for c in CALLS} == {"float32", "bfloat16"} and not GOLDEN["skipped"]
    assert any(EOT in c["tokens"] for c in CALLS)
    assert any(c["forwards"] < len(c["tokens"]) / 2 for c in CALLS)  # several tokens a forward
    lengths = {len(GOLDEN["prompts"][c["prompt"]]) % c["args"]["block_size"] for c in CALLS}
    assert 0 in lengths and len(lengths) > 2  # prompts ending on a block and inside one
    assert {c["args"]["small_block_size"] for c in CALLS} >= {2, 4, 8}
    cached = [c for c in CALLS if c["args"].get("use_block_cache")]
    assert sum(f == c["args"]["small_block_size"] for c in cached for f in c["fed_per_forward"]) > 20  # sub-blocks


CACHED = [i for i in FLOAT32 if CALLS[i]["args"].get("use_block_cache")]


@pytest.mark.parametrize("index", CACHED, ids=lambda i: f"float32-{CALLS[i]['note'][:3]}-{i}")
def test_the_sub_block_cache_feeds_a_sub_block_alone_where_the_authors_do(index):
    call = CALLS[index]
    small = call["args"]["small_block_size"]
    result = decode(call, record=True, **their_length(call))
    fed = [n for r in result.iterations for n in r.fed_tokens]
    assert [n == small for n in fed] == [n == small for n in call["fed_per_forward"][prefills(call) :]]


def test_switching_the_sub_block_cache_off_feeds_whole_blocks_and_loses_a_call():
    calls = [CALLS[i] for i in CACHED]
    fed, differ = 0, 0
    for call in calls:
        result = decode(call, record=True, use_block_cache=False, **their_length(call))
        fed += sum(n == call["args"]["small_block_size"] for r in result.iterations for n in r.fed_tokens)
        differ += result.tokens.tolist() != call["tokens"]
    assert fed == 0 and differ >= 1


def test_decoding_whole_blocks_instead_of_sub_blocks_loses_the_authors_tokens():
    calls = [c for c in CALLS if c["dtype"] == "float32" and c["args"]["small_block_size"] < c["args"]["block_size"]]
    differ = sum(decode(c, small_block_size=c["args"]["block_size"]).tokens.tolist() != c["tokens"] for c in calls)
    assert differ >= len(calls) // 3, f"only {differ} of {len(calls)} calls changed"


def test_ignoring_the_token_shift_loses_the_authors_tokens():
    from refusion.models.block import HFBlockDiffusionLM

    m = model("float32")
    unshifted = HFBlockDiffusionLM(
        m.model, m.tokenizer, block_length=8, layout="absolute", mask_token_id=m.mask_token_id, eos_token_id=[EOT]
    )
    calls = [c for c in CALLS if c["dtype"] == "float32" and c["args"]["block_size"] == 8]
    differ = 0
    for c in calls:
        args = {k: v for k, v in c["args"].items() if k in ("threshold", "small_block_size")}
        out = refusion.generate(
            GOLDEN["prompts"][c["prompt"]],
            unshifted,
            partitioner="semi-ar",
            selector="fast-dllm-v2",
            infiller="draft",
            gen_length=len(c["tokens"]),
            block_length=8,
            slot_size=1,
            align="absolute",
            stop_at_eos="block",
            **args,
        )
        differ += out.tokens.tolist()[: len(c["tokens"])] != c["tokens"]
    assert differ >= len(calls) * 3 // 4, f"only {differ} of {len(calls)} calls changed"


def test_a_batch_of_prompts_gives_each_its_own_tokens():
    for note in sorted({c["note"] for c in CALLS}):
        alone = sorted((c for c in CALLS if c["dtype"] == "float32" and c["note"] == note), key=lambda c: c["prompt"])
        batch = decode(alone[0], prompts=[GOLDEN["prompts"][c["prompt"]] for c in alone])
        for result, call in zip(batch, alone):
            n = min(len(result.tokens), len(call["tokens"]))
            assert result.tokens.tolist()[:n] == call["tokens"][:n]


def test_the_authors_arguments_are_taken_by_name_and_the_unported_refused():
    from refusion.peers import translate

    m = model("float32")
    call = translate("fast_dllm_v2.generate", {"max_new_tokens": 16, "threshold": 0.9, "small_block_size": 4}, m)
    assert call.gen_length == 16 and call.params == {"block_length": 8, "threshold": 0.9, "small_block_size": 4}
    cached = translate("fast_dllm_v2.generate", {"use_block_cache": True, "small_block_size": 4}, m)
    assert cached.parts == {"reorderer": "sub-block-cache"} and cached.params["small_block_size"] == 4
    refused = (
        {"temperature": 0.7},
        {"steps": 10},
        {"stopping_criteria": []},
        {"mask_id": 9},
        {"small_block_size": 0},
    )
    for bad in refused:
        with pytest.raises(ConfigError, match=next(iter(bad))):
            translate("fast_dllm_v2.generate", bad, m)


def test_a_sub_block_that_does_not_divide_the_block_is_refused_in_the_authors_call():
    with pytest.raises(ConfigError, match="small_block_size") as err:
        refusion.generate("ab", model("float32"), preset="fast-dllm-v2", small_block_size=3, max_new_tokens=8)
    assert err.value.param == "small_block_size"
