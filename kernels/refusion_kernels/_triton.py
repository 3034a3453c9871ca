"""The Triton kernels themselves (imported only when Triton is used)."""

import triton
import triton.language as tl


@triton.jit
def confidence_kernel(logits_ptr, stride_row, stride_col, n_cols, inv_temp, exclude, tokens_ptr, probs_ptr,
                      BLOCK: tl.constexpr):
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
    prob = tl.where(ok, tl.exp(tl.where(ok, best_val, 0.0) - tl.where(ok, run_max, 0.0)) / tl.where(ok, run_sum, 1.0), 0.0)
    tl.store(tokens_ptr + row, best_idx)
    tl.store(probs_ptr + row, prob)


@triton.jit
def scatter_kernel(src_ptr, dst_ptr, rows_ptr, cols_ptr, n_heads, head_dim,
                   s_g, s_h, s_t, s_d, d_g, d_b, d_h, d_c, d_d, BLOCK_D: tl.constexpr):
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
def lm_head_kernel(h_ptr, w_ptr, b_ptr, tokens_ptr, best_ptr, lse_ptr, targets_ptr, picked_ptr, n_rows, vocab, dim,
                   s_hm, s_hd, s_wv, s_wd, temperature, exclude, HAS_BIAS: tl.constexpr, HAS_TARGETS: tl.constexpr,
                   FLOAT32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per block of rows: logits block by block (tl.dot), rounded to the weight's dtype as the model's
    head returns them, divided by the temperature; online max / sum-exp / argmax (ties: lowest id) and, with
    targets, each row's target logit."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    neg_inf = float("-inf")
    run_max = tl.full((BLOCK_M,), neg_inf, tl.float32)
    run_sum = tl.full((BLOCK_M,), 0.0, tl.float32)
    best_val = tl.full((BLOCK_M,), neg_inf, tl.float32)
    best_idx = tl.full((BLOCK_M,), 0, tl.int64)
    picked = tl.full((BLOCK_M,), 0.0, tl.float32)
    if HAS_TARGETS:
        target = tl.load(targets_ptr + rows, mask=row_ok, other=-1)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < vocab
        acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
        for d0 in range(0, dim, BLOCK_D):
            ds = d0 + tl.arange(0, BLOCK_D)
            d_ok = ds < dim
            h = tl.load(h_ptr + rows[:, None].to(tl.int64) * s_hm + ds[None, :] * s_hd,
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            w = tl.load(w_ptr + cols[None, :].to(tl.int64) * s_wv + ds[:, None] * s_wd,
                        mask=col_ok[None, :] & d_ok[:, None], other=0.0)
            if FLOAT32:  # full float32 products, as the plain path's matmul (Triton's default is TF32)
                acc += tl.dot(h, w, input_precision="ieee")
            else:  # bfloat16/float16 values are exact in TF32: the products are too
                acc += tl.dot(h.to(tl.float32), w.to(tl.float32))
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if not FLOAT32:  # the plain path's logits are in the weight's dtype
            acc = acc.to(w_ptr.dtype.element_ty).to(tl.float32)
        x = tl.where(col_ok[None, :], acc / temperature, neg_inf)
        if HAS_TARGETS:
            picked += tl.sum(tl.where(cols[None, :] == target[:, None], x, 0.0), 1)
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
    lse = tl.where(run_sum > 0, run_max + tl.log(tl.where(run_sum > 0, run_sum, 1.0)), neg_inf)
    tl.store(tokens_ptr + rows, best_idx, mask=row_ok)
    tl.store(best_ptr + rows, best_val, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    if HAS_TARGETS:
        tl.store(picked_ptr + rows, picked, mask=row_ok)
