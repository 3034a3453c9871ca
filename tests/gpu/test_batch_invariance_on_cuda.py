"""``batch_invariant=True`` on the GPU: a prompt decodes in bf16 exactly as alone, in any batch, every engine.

The same property as tests/engines/test_batch_invariant.py, with the models on the device: GPU linear
layers pick kernels by shape, so they are tiled there (``rows_depend_on_count``), and the LM head runs the
Triton kernel. How often the default (``batch_invariant=False``) differs in bf16 is recorded.
"""

from __future__ import annotations

import random

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.api import build_decoder, load_model
from refusion.decoding.decoder import Decoder
from refusion.models.hf import HFCausalLM
from refusion.models.tiny import tiny_qwen3
from tests.engines.test_batch_invariant import ENGINES, batches, check_batch_equals_alone, setups
from tests.models.test_peer_checkpoints import FIXTURES

pytestmark = pytest.mark.usefixtures("compiled_triton")


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=2)
@given(data=st.data())
def test_bf16_tokens_and_numbers_are_the_same_alone_and_in_any_batch(device, engine, data):
    model, decoder, gen_length, options = data.draw(setups(engine, torch.bfloat16))
    model.model.to(device)
    check_batch_equals_alone(model, decoder, gen_length, options, data.draw(batches(sizes=(12, 5, 3))))


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "refusion"])
def test_the_peer_families_checkpoints_in_bf16(device, family):
    model = load_model(str(FIXTURES / family), dtype=torch.bfloat16, device=str(device))
    assert model.device.type == device.type
    preset = "paper" if family == "refusion" else family
    decoder = attrs.evolve(build_decoder(model, preset=preset)[0], batch_invariant=True)
    rng = random.Random(family)
    pool = [[rng.randrange(10, 100) for _ in range(rng.randint(1, 12))] for _ in range(3)]
    check_batch_equals_alone(
        model, decoder, 16 if family == "refusion" else 8, {}, [rng.choice(pool) for _ in range(9)]
    )


def test_how_often_the_default_differs_from_alone_in_bf16(device, on_gpu, record):
    """Recorded, not asserted: docs/batching.md says the default may flip close calls in bf16."""
    model = HFCausalLM(
        tiny_qwen3(
            vocab_size=512,
            hidden_size=256,
            num_layers=4,
            num_heads=8,
            num_kv_heads=4,
            logit_scale=2.0,
            seed=7,
            dtype=torch.bfloat16,
        )
    )
    model.model.to(device)
    rng = random.Random(7)
    prompts = [[rng.randrange(500) for _ in range(rng.randint(2, 24))] for _ in range(16 if on_gpu else 4)]
    for invariant in (False, True):
        decoder = Decoder.from_names(slot_size=4, serial_num_blocks=2, batch_invariant=invariant)
        batched = [r.tokens.tolist() for r in decoder.decode_batch(model, prompts, 32)]
        alone = [decoder.decode(model, p, 32).tokens.tolist() for p in prompts]
        differing = sum(a != b for a, b in zip(batched, alone))
        record(f"{'invariant' if invariant else 'default'}_prompts_differing_from_alone", f"{differing}/{len(prompts)}")
        if invariant:
            assert differing == 0


def test_at_an_8b_models_width_on_the_packed_engine(device, on_gpu):
    """Hidden 4096 (Qwen3-8B's width): wide rows are where GPU reductions change with the row count."""
    hidden = 4096 if on_gpu else 256
    model = HFCausalLM(
        tiny_qwen3(
            vocab_size=1024,
            hidden_size=hidden,
            num_layers=2,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=2 * hidden,
            logit_scale=2.0,
            seed=5,
            dtype=torch.bfloat16,
        )
    )
    model.model.to(device)
    decoder = Decoder.from_names(slot_size=4, serial_num_blocks=2, engine="branch", batch_invariant=True)
    rng = random.Random(5)
    pool = [[rng.randrange(1000) for _ in range(rng.randint(1, 20))] for _ in range(3)]
    check_batch_equals_alone(model, decoder, 16, {}, [rng.choice(pool) for _ in range(7)])


def test_why_means_are_tiled_on_the_gpu(device, record):
    """Recorded: for which row counts a row's mean over 4096 values differs from the same row's in a batch of 300
    (the reason ``Invariance.reductions`` tiles them); tiled, none differs."""
    from refusion.engines.invariant import tiled_mean

    x = torch.randn(300, 4096, device=device, generator=torch.Generator(device=device).manual_seed(0))
    full, tiled = x.mean(-1), tiled_mean(x, False, 8)
    counts = (1, 2, 3, 8, 17, 64, 299)
    record("row_counts_whose_plain_mean_differs", [n for n in counts if not torch.equal(x[:n].mean(-1), full[:n])])
    assert all(torch.equal(tiled_mean(x[:n], False, 8), tiled[:n]) for n in counts)
