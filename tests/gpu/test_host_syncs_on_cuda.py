"""Host synchronisations per engine step on a real device, counted by torch's CUDA sync debug mode.

docs/benchmarks.md: on the ``branch`` engine the LM-head statistics of all sequences come to the host in one
copy per pass, so the waits per step do not grow with the number of sequences. Here that is checked with
the device's own count (:class:`refusion.measure.syncs.CudaSyncs`, uploads of host data included), with
:class:`~refusion.measure.host_reads.HostReads`' count of reads of device tensors recorded beside it.
"""

from __future__ import annotations

import random

import pytest
import torch

from refusion.config.presets import preset
from refusion.decoding.decoder import Decoder
from refusion.measure.host_reads import HostReads
from refusion.models.hf import HFCausalLM
from refusion.models.tiny import tiny_qwen3

pytestmark = pytest.mark.usefixtures("compiled_triton")


def counted(model, decoder, prompts, gen_length, on_gpu):
    from refusion.measure.syncs import CudaSyncs

    with HostReads(model) as reads:
        decoder.decode_batch(model, prompts, gen_length)
    if not on_gpu:
        return None, reads.summary(sites=5)
    decoder.decode_batch(model, prompts, gen_length)  # warm: nothing is loaded or compiled during the count
    with CudaSyncs() as syncs:
        decoder.decode_batch(model, prompts, gen_length)
    return syncs.summary(), reads.summary(sites=5)


@pytest.mark.parametrize("name", ["paper", "ar"])
def test_synchronisations_per_step_do_not_grow_with_the_batch_on_branch(device, on_gpu, name, record):
    model = HFCausalLM(
        tiny_qwen3(
            vocab_size=512,
            hidden_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            logit_scale=4.0,
            seed=11,
            dtype=torch.bfloat16,
        )
    )
    model.model.to(device)
    decoder = Decoder.from_spec(preset(name))
    rng = random.Random(11)
    per_step = {}
    for batch in (1, 8):
        prompts = [[rng.randrange(500) for _ in range(rng.randint(4, 16))] for _ in range(batch)]
        syncs, reads = counted(model, decoder, prompts, 32, on_gpu)
        record(f"{name}_batch_{batch}_host_reads", {k: reads[k] for k in ("per_step", "steps", "total", "by_kind")})
        if syncs is not None:
            record(f"{name}_batch_{batch}_cuda_syncs", syncs)
            per_step[batch] = syncs["per_step"]
            assert syncs["steps"] > 0 and syncs["total"] > 0
    if on_gpu:
        assert per_step[8] <= 2 * per_step[1] + 4, per_step
