"""Triton kernels equal their torch references (run on the CPU with TRITON_INTERPRET=1)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from refusion_kernels import choose, confidence, confidence_reference, scatter_kv, scatter_kv_reference
from refusion_kernels.confidence import _confidence_triton


def run_triton_confidence(logits, temperature=1.0, exclude=None, block=None):
    return _confidence_triton(logits, temperature, exclude, block)


@given(
    rows=st.integers(1, 6),
    vocab=st.sampled_from([1, 7, 50, 257, 1000]),
    block=st.sampled_from([16, 64, 256]),
    temperature=st.sampled_from([1.0, 0.5, 2.0]),
    exclude=st.one_of(st.none(), st.integers(0, 6)),
    neg_inf=st.floats(0.0, 0.9),
    seed=st.integers(0, 1000),
)
def test_confidence_kernel_matches_reference(rows, vocab, block, temperature, exclude, neg_inf, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    logits[torch.rand(rows, vocab, generator=g) < neg_inf] = float("-inf")
    if exclude is not None and exclude >= vocab:
        exclude = None
    tokens, probs = run_triton_confidence(logits, temperature, exclude, block)
    ref_tokens, ref_probs = confidence_reference(logits, temperature, exclude)
    # ties between equal logits may resolve differently; compare the chosen values, then the indices
    picked = logits.gather(1, tokens[:, None]).squeeze(1)
    assert torch.equal(picked, logits.gather(1, ref_tokens[:, None]).squeeze(1))
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(probs, ref_probs, rtol=1e-5, atol=1e-6)


def test_confidence_handles_all_inf_rows_bf16_and_strides():
    logits = torch.randn(4, 300) * 2
    logits[1] = float("-inf")
    tokens, probs = run_triton_confidence(logits, block=128)
    assert tokens[1] == 0 and probs[1] == 0
    ref = confidence_reference(logits)
    assert torch.equal(tokens, ref[0]) and torch.allclose(probs, ref[1])
    wide = torch.randn(300, 6).t()  # non-contiguous rows
    assert torch.equal(run_triton_confidence(wide, block=64)[0], confidence_reference(wide)[0])
    half = (torch.randn(3, 100) * 4).to(torch.bfloat16)
    t, p = run_triton_confidence(half, block=64)
    rt, rp = confidence_reference(half)
    assert torch.equal(t, rt) and p.dtype == torch.bfloat16
    torch.testing.assert_close(p.float(), rp.float(), rtol=1e-2, atol=1e-3)


def test_reference_is_argmax_and_softmax_probability():
    logits = torch.randn(50, 40, dtype=torch.float64)
    logits[:, 3] += 10  # make the excluded id the plain argmax
    tokens, probs = confidence_reference(logits, exclude=3)
    second = logits.topk(2, dim=-1).indices[:, 1]
    assert torch.equal(tokens, second)
    torch.testing.assert_close(probs, torch.softmax(logits, -1).gather(1, second[:, None]).squeeze(1))
    t2, p2 = confidence_reference(logits, temperature=2.0)
    assert torch.equal(t2, logits.argmax(-1))
    torch.testing.assert_close(p2, torch.softmax(logits / 2, -1).max(-1).values)


@given(
    layers=st.integers(1, 3),
    heads=st.integers(1, 3),
    dim=st.sampled_from([4, 8, 12]),
    batch=st.integers(1, 3),
    capacity=st.integers(4, 20),
    tokens=st.integers(0, 4),
    seed=st.integers(0, 100),
)
def test_scatter_kernel_matches_reference(layers, heads, dim, batch, capacity, tokens, seed):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(layers, 2, batch, heads, capacity, dim, generator=g)
    src = torch.randn(layers, 2, heads, tokens, dim, generator=g)
    slots = torch.randperm(batch * capacity, generator=g)[:tokens]
    rows, cols = slots // capacity, slots % capacity
    expected = cache.clone()
    scatter_kv_reference(expected, src, rows, cols)
    scatter_kv(cache, src, rows, cols, backend="triton")
    assert torch.equal(cache, expected)


def test_scatter_writes_nothing_else():
    cache = torch.zeros(2, 2, 2, 1, 6, 4)
    src = torch.ones(2, 2, 1, 2, 4)
    scatter_kv(cache, src, torch.tensor([1, 1]), torch.tensor([2, 3]), backend="triton")
    assert cache.sum() == 2 * 2 * 2 * 4
    assert cache[:, :, 1, :, 2:4].eq(1).all() and cache[:, :, 0].eq(0).all()


def test_backend_choice():
    cpu = torch.zeros(1)
    assert choose(cpu) == "torch"  # the interpreter is never picked on its own
    assert choose(cpu, "triton") == "triton"
    with pytest.raises(ValueError, match="`backend` must be one of auto, torch, triton"):
        choose(cpu, "cuda")
    assert torch.equal(confidence(torch.eye(3))[0], torch.arange(3))


@settings(max_examples=6, deadline=None)
@given(
    heads=st.sampled_from([(2, 1), (4, 2), (2, 2)]),
    dim=st.sampled_from([8, 12]),
    page=st.sampled_from([1, 4, 16]),
    data=st.data(),
)
def test_paged_attention_kernel_matches_reference(heads, dim, page, data):
    from refusion_kernels.paged import paged_attention, paged_attention_reference

    seed = data.draw(st.integers(0, 1000))
    g = torch.Generator().manual_seed(seed)
    lengths = data.draw(st.lists(st.integers(1, 70), min_size=1, max_size=3))
    need = [-(-n // page) for n in lengths]
    order = torch.randperm(sum(need) + 3, generator=g).tolist()  # pages in no particular order, some unused
    tables, at = [], 0
    for count in need:
        tables.append(order[at : at + count])
        at += count
    width = max(need)
    pages = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    n_heads, kv_heads = heads
    keys = torch.randn((sum(need) + 3) * page, kv_heads, dim, generator=g)
    values = torch.randn((sum(need) + 3) * page, kv_heads, dim, generator=g)
    rows, spans = [], []
    for r, n in enumerate(lengths):
        context = data.draw(st.integers(0, n - 1))
        for column in range(context, n):  # a causal chain after the context, and one column seen alone
            low = data.draw(st.sampled_from([context, column]))
            rows.append(r)
            spans.append([[0, context], [low, column + 1], [0, 0]])
    q = torch.randn(len(rows), n_heads, dim, generator=g)
    args = (q, keys, values, pages, torch.tensor(rows), torch.tensor(spans), page, dim**-0.5)
    expected = paged_attention_reference(*args)
    got = paged_attention(*args, backend="triton")
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_paged_attention_reads_its_rows_columns_through_the_block_table_and_nothing_else():
    from refusion_kernels.paged import paged_attention

    keys = torch.zeros(8, 1, 4)
    values = torch.arange(8.0)[:, None, None].expand(8, 1, 4).contiguous()
    pages = torch.tensor([[1, 0]])  # page size 4: columns 0-3 are slots 4-7, columns 4-7 slots 0-3
    spans = torch.tensor([[[0, 2], [3, 4]]])  # columns 0, 1 and 3: slots 4, 5 and 7
    q = torch.zeros(1, 1, 4)  # equal scores: the mean of the visible values
    expected = torch.full((1, 1, 4), (4.0 + 5.0 + 7.0) / 3)
    for backend in ("torch", "triton"):
        out = paged_attention(q, keys, values, pages, torch.tensor([0]), spans, 4, 1.0, backend=backend)
        torch.testing.assert_close(out, expected)
    values[6] = values[0] = float("nan")  # columns no query sees: the kernel never reads them
    out = paged_attention(q, keys, values, pages, torch.tensor([0]), spans, 4, 1.0, backend="triton")
    torch.testing.assert_close(out, expected)
