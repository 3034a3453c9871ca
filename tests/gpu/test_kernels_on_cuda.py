"""refusion_kernels' Triton kernels, compiled for the GPU, against their torch references on CUDA tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from refusion_kernels import (
    choose,
    confidence,
    confidence_reference,
    lm_head_stats,
    lm_head_stats_reference,
    scatter_kv,
    scatter_kv_reference,
)

pytestmark = pytest.mark.usefixtures("compiled_triton")


def sizes(on_gpu: bool) -> tuple[int, int, tuple[int, ...]]:
    """(vocab, hidden, row counts): Qwen3-8B's head on a GPU, a small one on the CPU."""
    return (151936, 4096, (1, 16, 100)) if on_gpu else (3000, 64, (1, 5, 17))


def test_the_automatic_backend_is_triton_for_device_tensors(device, on_gpu):
    assert choose(torch.zeros(1, device=device)) == ("triton" if on_gpu else "torch")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("temperature, exclude", [(1.0, None), (1.0, 7), (0.7, 0)])
def test_confidence_kernel_equals_the_reference(device, on_gpu, dtype, temperature, exclude, record):
    vocab, _, rows = sizes(on_gpu)
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(max(rows), vocab, device=device, generator=g) * 4).to(dtype)
    tokens, probs = confidence(logits, temperature, exclude, backend="triton")
    want_tokens, want_probs = confidence_reference(logits, temperature, exclude)
    ranked = (
        logits.float()
        if exclude is None
        else logits.float().index_fill(1, torch.tensor([exclude], device=device), float("-inf"))
    )
    assert torch.equal(ranked.gather(1, tokens[:, None]), ranked.gather(1, want_tokens[:, None]))  # the same maxima
    assert torch.equal(tokens, want_tokens)  # and the lowest id among equal ones (bf16 logits tie often)
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(probs.float(), want_probs.float(), rtol=tolerance, atol=1e-6)
    if exclude is not None:
        assert not bool((tokens == exclude).any())


@pytest.fixture
def full_precision_sums():
    """cuBLAS sums half-precision products in float32 throughout (no reduced-precision split-K reductions)."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    yield
    matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = saved


@pytest.mark.usefixtures("full_precision_sums")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_lm_head_kernel_ranks_the_heads_own_logits(device, on_gpu, dtype):
    """Integer-valued weights: every sum is exact whatever its order, so the kernel's logits, rounded to the
    weight's dtype, are the model head's (``F.linear``) bit for bit, and so are its tokens, ties included."""
    vocab, hidden, rows = sizes(on_gpu)
    g = torch.Generator(device=device).manual_seed(1)
    scale = 0.25 if dtype == torch.float16 else 1.0  # keep fp16 logits finite
    weight = (torch.randint(-8, 9, (vocab, hidden), device=device, generator=g) * scale).to(dtype)
    h = torch.randint(-8, 9, (max(rows), hidden), device=device, generator=g).to(dtype)
    logits = F.linear(h, weight).float()
    for exclude in (None, 5):
        ranked = (
            logits if exclude is None else logits.index_fill(1, torch.tensor([exclude], device=device), float("-inf"))
        )
        tokens, best, lse = lm_head_stats(h, weight, None, exclude, backend="triton")
        assert torch.equal(tokens, ranked.argmax(1))
        assert torch.equal(best, ranked.max(1).values)
        torch.testing.assert_close(lse, torch.logsumexp(logits, 1), rtol=1e-5, atol=1e-4)
        ref = lm_head_stats_reference(h, weight, None, exclude)
        assert torch.equal(tokens, ref[0]) and torch.equal(best, ref[1].float())


def test_lm_head_kernel_on_random_bf16_weights_agrees_with_the_reference(device, on_gpu, record):
    """Random bf16 weights: sums in another order can round a logit to the neighbouring bf16 value, so a near tie
    may flip; the agreement is recorded, and must be near total."""
    vocab, hidden, rows = sizes(on_gpu)
    g = torch.Generator(device=device).manual_seed(2)
    weight = (torch.randn(vocab, hidden, device=device, generator=g) * 0.02).to(torch.bfloat16)
    h = torch.randn(256 if on_gpu else 32, hidden, device=device, generator=g).to(torch.bfloat16)
    tokens, best, lse = lm_head_stats(h, weight, None, 3, backend="triton")
    ref_tokens, ref_best, ref_lse = lm_head_stats_reference(h, weight, None, 3)
    agree = float((tokens == ref_tokens).float().mean())
    record("lm_head_random_bf16_token_agreement", agree)
    record("lm_head_random_bf16_max_lse_diff", float((lse - ref_lse).abs().max()))
    assert agree >= 0.98
    torch.testing.assert_close(lse, ref_lse, rtol=1e-4, atol=1e-3)


def test_lm_head_kernel_rows_do_not_depend_on_the_row_count(device, on_gpu):
    """What lets batch-invariant decoding use the kernel: a row's statistics are the same in any batch."""
    vocab, hidden, rows = sizes(on_gpu)
    g = torch.Generator(device=device).manual_seed(3)
    weight = (torch.randn(vocab, hidden, device=device, generator=g) * 0.02).to(torch.bfloat16)
    h = torch.randn(max(rows), hidden, device=device, generator=g).to(torch.bfloat16)
    full = lm_head_stats(h, weight, None, 3, backend="triton")
    for n in rows:
        part = lm_head_stats(h[:n], weight, None, 3, backend="triton")
        assert all(torch.equal(a, b[:n]) for a, b in zip(part, full)), n


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_scatter_kernel_equals_the_reference(device, on_gpu, dtype):
    layers, heads, dim, batch, capacity = (36, 8, 128, 16, 320) if on_gpu else (2, 2, 8, 3, 12)
    g = torch.Generator(device=device).manual_seed(4)
    cache = torch.randn(layers, 2, batch, heads, capacity, dim, device=device, generator=g).to(dtype)
    for t in (1, batch, 5 * batch):
        src = torch.randn(layers, 2, heads, t, dim, device=device, generator=g).to(dtype)
        slots = torch.randperm(batch * capacity, device=device, generator=g)[:t]
        rows, cols = slots // capacity, slots % capacity
        want = cache.clone()
        scatter_kv_reference(want, src, rows, cols)
        got = cache.clone()
        scatter_kv(got, src, rows.cpu(), cols.cpu(), backend="triton")  # host indices, as the engine passes them
        assert torch.equal(got, want), t
