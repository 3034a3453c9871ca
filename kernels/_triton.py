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
