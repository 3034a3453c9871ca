"""No built-in decode mixes devices: on a GPU, CUDA would refuse a call that combines device and host tensors.

CI has no GPU, so :class:`tests.support.device_mixing.DeviceMixing` follows on the CPU where every tensor
would live (network outputs and tensors placed on the model's device versus host tensors) and records each
call CUDA would refuse. Every engine runs its presets through it, greedy and sampled, plain and
batch-invariant, on a batch of prompts of different lengths.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from refusion.config.presets import preset
from refusion.decoding.decoder import Decoder
from refusion.models.block import tiny_block_diffusion
from refusion.models.hf import HFCausalLM
from refusion.models.mdm import tiny_bidirectional
from refusion.models.tiny import tiny_qwen3
from tests.support.device_mixing import DeviceMixing

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17]]


def models():
    kw = {"vocab_size": 48, "logit_scale": 4.0, "seed": 1, "dtype": torch.float32}
    return {
        "causal": HFCausalLM(tiny_qwen3(eos_token_id=2, **kw)),
        "llada": tiny_bidirectional(**kw),
        "dream": tiny_bidirectional(logit_shift=1, **kw),
        "sdar": tiny_block_diffusion(block_length=4, layout="absolute", **kw),
    }


#: (model, preset, engine, gen_length, extra parameters)
CASES = [
    ("causal", "paper", "branch", 16, {}),
    ("causal", "paper", "repeat", 16, {}),
    ("causal", "ar", "branch", 16, {}),
    ("causal", "paper", "branch", 16, {"temperature": 0.7}),
    ("causal", "paper", "branch", 16, {"batch_invariant": True}),
    ("causal", "ar", "repeat", 16, {"batch_invariant": True}),
    ("llada", "llada", "canvas", 32, {"temperature": 0.5}),
    ("llada", "fast-dllm-dual", "canvas", 32, {}),
    ("llada", "fast-dllm", "canvas", 32, {"batch_invariant": True}),
    ("dream", "dream", "canvas", 16, {}),
    ("sdar", "sdar", "block", 16, {"temperature": 0.8}),
    ("sdar", "sdar", "block", 16, {"batch_invariant": True}),
]


@pytest.fixture(scope="module")
def tiny_models():
    return models()


@pytest.mark.parametrize(
    "kind, name, engine, gen_length, extra", CASES, ids=[f"{c[1]}-{c[2]}-{'-'.join(c[4]) or 'greedy'}" for c in CASES]
)
def test_no_call_of_the_decode_mixes_device_and_host_tensors(tiny_models, kind, name, engine, gen_length, extra):
    model = tiny_models[kind]
    spec = preset(name)
    options = {k: v for k, v in extra.items() if k == "batch_invariant"}
    params = {k: v for k, v in extra.items() if k != "batch_invariant"}
    decoder = attrs.evolve(
        Decoder.from_spec(spec.merged(params=params, model=model) if params else spec), engine=engine, **options
    )
    with DeviceMixing(model) as found:
        results = decoder.decode_batch(model, PROMPTS, gen_length)
    assert found.forwards > 0 and all(len(r.tokens) for r in results)
    assert not found.mixes, dict(found.mixes)


def test_the_check_sees_calls_that_cuda_refuses_and_allows_what_cuda_allows():
    model = HFCausalLM(tiny_qwen3(vocab_size=16, dtype=torch.float32))
    with DeviceMixing(model) as found:
        logits = model.model(input_ids=torch.tensor([[1, 2, 3]], device=model.device)).logits[0]  # device data
        torch.cat([logits, torch.zeros(1, 16)])  # refused: host rows
        logits + torch.ones(16)  # refused
        torch.arange(16)[logits[:, 0].long().clamp(0, 15)]  # refused: a host tensor indexed by device indices
        logits[1:, :] = torch.zeros(2, 16)  # allowed: a slice assignment is a copy
        logits[torch.tensor([0, 1])] = torch.zeros(2, 16)  # refused: advanced-index assignment of host values
        logits[torch.tensor([0, 1])]  # allowed: host indices into a device tensor
        logits * torch.tensor(2.0)  # allowed: a 0-dim host tensor is a scalar
        logits.new_zeros(3) + logits[0, :3]  # allowed: made on the device
        logits.cpu() + torch.ones(16)  # allowed: copied to the host first
    assert sorted(name for name, _ in found.mixes) == ["__getitem__", "__setitem__", "add", "cat"], found.mixes
