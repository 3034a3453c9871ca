"""The Triton kernels themselves (imported only when Triton is used)."""

import triton
import triton.language as tl


@triton.jit
def confidence_kernel(
    logits_ptr, stride_row, stride_col, n_cols, inv_temp, exclude, tokens_ptr, probs_ptr, BLOCK: tl.constexpr
):
    """One program per row: online softmax statistics plus a running argmax over vocabulary blocks."""
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    neg_inf = float("-inf")
    run_max = tl.full((), neg_inf, tl.float32)
    run_sum = tl.full((), 0.0, tl.float32)
    best_val = tl.full((), neg_inf, tl.float32)
    best_idx = tl.full((), 0, tl.int64)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = cols < n_cols
        x = tl.load(base + cols.to(tl.int64) * stride_col, mask=valid, other=neg_inf).to(tl.float32) * inv_temp
        new_max = tl.maximum(run_max, tl.max(x, 0))
        shift = tl.where(new_max == neg_inf, 0.0, new_max)  # keeps exp() away from (-inf) - (-inf)
        alpha = tl.exp(run_max - shift)
        terms = tl.exp(x - shift)
        run_sum = run_sum * alpha + tl.sum(terms, 0)
        run_max = new_max
        ranked = tl.where(cols == exclude, neg_inf, x)
        block_best = tl.max(ranked, 0)
        block_idx = tl.argmax(ranked, 0).to(tl.int64) + start
        better = block_best > best_val
        best_idx = tl.where(better, block_idx, best_idx)
        best_val = tl.where(better, block_best, best_val)
    ok = (best_val != neg_inf) & (run_sum > 0)
    prob = tl.where(
        ok, tl.exp(tl.where(ok, best_val, 0.0) - tl.where(ok, run_max, 0.0)) / tl.where(ok, run_sum, 1.0), 0.0
    )
    tl.store(tokens_ptr + row, best_idx)
    tl.store(probs_ptr + row, prob)


@triton.jit
def scatter_kernel(
    src_ptr,
    dst_ptr,
    rows_ptr,
    cols_ptr,
    n_heads,
    head_dim,
    s_g,
    s_h,
    s_t,
    s_d,
    d_g,
    d_b,
    d_h,
    d_c,
    d_d,
    BLOCK_D: tl.constexpr,
):
    """Program (token, layer*2*head): copy one head_dim vector to its (row, slot) in the cache."""
    tok = tl.program_id(0)
    gh = tl.program_id(1)
    g = gh // n_heads
    h = gh % n_heads
    row = tl.load(rows_ptr + tok)
    col = tl.load(cols_ptr + tok)
    d = tl.arange(0, BLOCK_D)
    m = d < head_dim
    src = src_ptr + g.to(tl.int64) * s_g + h * s_h + tok.to(tl.int64) * s_t + d * s_d
    dst = dst_ptr + g.to(tl.int64) * d_g + row * d_b + h * d_h + col * d_c + d * d_d
    tl.store(dst, tl.load(src, mask=m), mask=m)


@triton.jit
def _round_to(x, dtype: tl.constexpr):
    """float32 ``x`` rounded to ``dtype`` (to nearest, ties to even), as float32.

    bfloat16 is rounded on the bits: Triton's interpreter truncates a float32
    to bfloat16 cast (the compiled cast rounds to nearest); float16 casts round
    to nearest in both; float32 is unchanged.
    """
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif dtype == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def lm_head_kernel(
    h_ptr,
    w_ptr,
    b_ptr,
    max_ptr,
    sum_ptr,
    best_ptr,
    idx_ptr,
    targets_ptr,
    picked_ptr,
    n_rows,
    vocab,
    dim,
    chunk,
    s_hm,
    s_hd,
    s_wv,
    s_wd,
    temperature,
    exclude,
    HAS_BIAS: tl.constexpr,
    HAS_TARGETS: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (block of rows, vocabulary split): logits of ``chunk`` tokens block by block (tl.dot), each rounded
    to the weight's dtype as the model's own head rounds it; partial max, sum-exp and argmax per row (and, with
    targets, the target's tempered logit where it lies in the split, else 0), written at ``[split, row]``
    (:func:`lm_head_combine` reduces the splits)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    neg_inf = float("-inf")
    run_max = tl.full((BLOCK_M,), neg_inf, tl.float32)
    run_sum = tl.full((BLOCK_M,), 0.0, tl.float32)
    best_val = tl.full((BLOCK_M,), neg_inf, tl.float32)
    first = split * chunk
    best_idx = tl.full((BLOCK_M,), 0, tl.int64) + first
    last = tl.minimum(first + chunk, vocab)
    picked = tl.full((BLOCK_M,), 0.0, tl.float32)
    if HAS_TARGETS:
        target = tl.load(targets_ptr + rows, mask=row_ok, other=-1)
    for v0 in range(first, last, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < last
        acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
        for d0 in range(0, dim, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            d_ok = ds < dim
            h = tl.load(
                h_ptr + rows[:, None].to(tl.int64) * s_hm + ds[None, :] * s_hd,
                mask=row_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            w = tl.load(
                w_ptr + cols[None, :].to(tl.int64) * s_wv + ds[:, None] * s_wd,
                mask=col_ok[None, :] & d_ok[:, None],
                other=0.0,
            )
            if IEEE:  # float32 weights: full-precision products, as torch's float32 matmul (no TF32)
                acc += tl.dot(h.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            else:  # bfloat16 / float16 values are exact in TF32: exact products, float32 sums
                acc += tl.dot(h.to(tl.float32), w.to(tl.float32), input_precision="tf32")
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        logits = _round_to(acc, w_ptr.dtype.element_ty)  # the head's own logits, in its dtype
        x = tl.where(col_ok[None, :], logits / temperature, neg_inf)
        if HAS_TARGETS:
            picked += tl.sum(tl.where((cols[None, :] == target[:, None]) & col_ok[None, :], x, 0.0), 1)
        new_max = tl.maximum(run_max, tl.max(x, 1))
        shift = tl.where(new_max == neg_inf, 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(x - shift[:, None]), 1)
        run_max = new_max
        ranked = tl.where(cols[None, :] == exclude, neg_inf, x)
        block_best = tl.max(ranked, 1)
        block_idx = tl.argmax(ranked, 1).to(tl.int64) + v0
        better = block_best > best_val
        best_idx = tl.where(better, block_idx, best_idx)
        best_val = tl.where(better, block_best, best_val)
    out = split * n_rows + rows
    tl.store(max_ptr + out, run_max, mask=row_ok)
    tl.store(sum_ptr + out, run_sum, mask=row_ok)
    tl.store(best_ptr + out, best_val, mask=row_ok)
    tl.store(idx_ptr + out, best_idx, mask=row_ok)
    if HAS_TARGETS:
        tl.store(picked_ptr + out, picked, mask=row_ok)


@triton.jit
def lm_head_combine(
    max_ptr,
    sum_ptr,
    best_ptr,
    idx_ptr,
    picked_ptr,
    tokens_ptr,
    out_best_ptr,
    lse_ptr,
    out_picked_ptr,
    n_rows,
    splits,
    HAS_TARGETS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program per block of rows: the splits' partial statistics reduced in split order (lowest id on ties); the
    target's logit is the one split's that holds it (the others add exact zeros)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < n_rows
    neg_inf = float("-inf")
    run_max = tl.full((BLOCK,), neg_inf, tl.float32)
    run_sum = tl.full((BLOCK,), 0.0, tl.float32)
    best_val = tl.full((BLOCK,), neg_inf, tl.float32)
    best_idx = tl.full((BLOCK,), 0, tl.int64)
    picked = tl.full((BLOCK,), 0.0, tl.float32)
    for split in range(0, splits):
        at = split * n_rows + rows
        part_max = tl.load(max_ptr + at, mask=row_ok, other=neg_inf)
        part_sum = tl.load(sum_ptr + at, mask=row_ok, other=0.0)
        part_best = tl.load(best_ptr + at, mask=row_ok, other=neg_inf)
        part_idx = tl.load(idx_ptr + at, mask=row_ok, other=0)
        new_max = tl.maximum(run_max, part_max)
        shift = tl.where(new_max == neg_inf, 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - shift) + part_sum * tl.exp(part_max - shift)
        run_max = new_max
        better = (part_best > best_val) | (split == 0)
        best_idx = tl.where(better, part_idx, best_idx)
        best_val = tl.where(better, part_best, best_val)
        if HAS_TARGETS:
            picked += tl.load(picked_ptr + at, mask=row_ok, other=0.0)
    lse = tl.where(run_sum > 0, run_max + tl.log(tl.where(run_sum > 0, run_sum, 1.0)), neg_inf)
    tl.store(tokens_ptr + rows, best_idx, mask=row_ok)
    tl.store(out_best_ptr + rows, best_val, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    if HAS_TARGETS:
        tl.store(out_picked_ptr + rows, picked, mask=row_ok)


@triton.jit
def paged_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    pages_ptr,
    rows_ptr,
    spans_ptr,
    scale,
    s_qt,
    s_qh,
    s_ks,
    s_kh,
    s_vs,
    s_vh,
    s_ot,
    s_oh,
    s_pr,
    dim,
    GROUP: tl.constexpr,
    SPANS: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program per (query token, head): online softmax over the key columns of the token's row that its spans
    make visible, each column's key and value read from its page (no gathered copy of the row)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    kv_head = h // GROUP
    row = tl.load(rows_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < dim
    q = tl.load(q_ptr + t.to(tl.int64) * s_qt + h * s_qh + d, mask=d_ok, other=0.0).to(tl.float32)
    end = tl.load(spans_ptr + t.to(tl.int64) * SPANS * 2 + 1)
    for i in tl.static_range(1, SPANS):
        end = tl.maximum(end, tl.load(spans_ptr + t.to(tl.int64) * SPANS * 2 + 2 * i + 1))
    neg_inf = float("-inf")
    run_max = tl.full((), neg_inf, tl.float32)
    run_sum = tl.full((), 0.0, tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        visible = cols < 0
        for i in tl.static_range(SPANS):
            lo = tl.load(spans_ptr + t.to(tl.int64) * SPANS * 2 + 2 * i)
            hi = tl.load(spans_ptr + t.to(tl.int64) * SPANS * 2 + 2 * i + 1)
            visible = visible | ((cols >= lo) & (cols < hi))
        page = tl.load(pages_ptr + row * s_pr + cols // PAGE, mask=visible, other=0).to(tl.int64)
        slot = page * PAGE + cols % PAGE
        both = visible[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + slot[:, None] * s_ks + kv_head * s_kh + d[None, :], mask=both, other=0.0).to(tl.float32)
        scores = tl.where(visible, tl.sum(k * q[None, :], 1) * scale, neg_inf)
        new_max = tl.maximum(run_max, tl.max(scores, 0))
        shift = tl.where(new_max == neg_inf, 0.0, new_max)
        alpha = tl.exp(run_max - shift)
        p = tl.exp(scores - shift)
        v = tl.load(v_ptr + slot[:, None] * s_vs + kv_head * s_vh + d[None, :], mask=both, other=0.0).to(tl.float32)
        run_sum = run_sum * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        run_max = new_max
    out = acc / tl.where(run_sum > 0, run_sum, 1.0)
    tl.store(out_ptr + t.to(tl.int64) * s_ot + h * s_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)
