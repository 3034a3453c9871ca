"""Compile every Triton kernel of refusion_kernels for a Hopper GPU (sm_90) without one; prints one line per kernel.

Run as a script (``python tests/kernels/hopper_compile.py``) with ``TRITON_INTERPRET`` unset: under the
interpreter ``@triton.jit`` gives interpreted functions, which cannot be compiled. Exits 0 when every kernel
compiled, 1 when one failed, 77 when this Triton cannot compile for CUDA here (no CUDA backend or no ptxas).
"""

from __future__ import annotations

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)


def kernels() -> list[tuple[str, object, dict, dict]]:
    """``(label, kernel, signature, constexprs)`` of each variant refusion launches."""
    import refusion_kernels._triton as K

    out = []
    for dtype in ("bf16", "fp16", "fp32"):
        out.append(
            (
                f"confidence_kernel {dtype}",
                K.confidence_kernel,
                {
                    "logits_ptr": f"*{dtype}",
                    "stride_row": "i32",
                    "stride_col": "i32",
                    "n_cols": "i32",
                    "inv_temp": "fp32",
                    "exclude": "i32",
                    "tokens_ptr": "*i64",
                    "probs_ptr": "*fp32",
                    "BLOCK": "constexpr",
                },
                {"BLOCK": 4096},
            )
        )
        for bias in (False, True):
            out.append(
                (
                    f"lm_head_kernel {dtype}{' bias' if bias else ''}",
                    K.lm_head_kernel,
                    {
                        "h_ptr": f"*{dtype}",
                        "w_ptr": f"*{dtype}",
                        "b_ptr": f"*{dtype}",
                        "max_ptr": "*fp32",
                        "sum_ptr": "*fp32",
                        "best_ptr": "*fp32",
                        "idx_ptr": "*i64",
                        "targets_ptr": "*i64",
                        "picked_ptr": "*fp32",
                        "n_rows": "i32",
                        "vocab": "i32",
                        "dim": "i32",
                        "chunk": "i32",
                        "s_hm": "i32",
                        "s_hd": "i32",
                        "s_wv": "i32",
                        "s_wd": "i32",
                        "temperature": "fp32",
                        "exclude": "i32",
                        "HAS_BIAS": "constexpr",
                        "HAS_TARGETS": "constexpr",
                        "IEEE": "constexpr",
                        "BLOCK_M": "constexpr",
                        "BLOCK_V": "constexpr",
                        "BLOCK_D": "constexpr",
                    },
                    {
                        "HAS_BIAS": bias,
                        "HAS_TARGETS": bias,
                        "IEEE": dtype == "fp32",
                        "BLOCK_M": 16,
                        "BLOCK_V": 64,
                        "BLOCK_D": 64,
                    },
                )
            )  # with a bias, with targets too: both branches compiled
        out.append(
            (
                f"scatter_kernel {dtype}",
                K.scatter_kernel,
                {
                    "src_ptr": f"*{dtype}",
                    "dst_ptr": f"*{dtype}",
                    "rows_ptr": "*i64",
                    "cols_ptr": "*i64",
                    "n_heads": "i32",
                    "head_dim": "i32",
                    "s_g": "i32",
                    "s_h": "i32",
                    "s_t": "i32",
                    "s_d": "i32",
                    "d_g": "i32",
                    "d_b": "i32",
                    "d_h": "i32",
                    "d_c": "i32",
                    "d_d": "i32",
                    "BLOCK_D": "constexpr",
                },
                {"BLOCK_D": 128},
            )
        )
        out.append(
            (
                f"paged_attention_kernel {dtype}",
                K.paged_attention_kernel,
                {
                    "q_ptr": f"*{dtype}",
                    "k_ptr": f"*{dtype}",
                    "v_ptr": f"*{dtype}",
                    "out_ptr": f"*{dtype}",
                    "pages_ptr": "*i32",
                    "rows_ptr": "*i32",
                    "spans_ptr": "*i32",
                    "scale": "fp32",
                    "s_qt": "i32",
                    "s_qh": "i32",
                    "s_ks": "i32",
                    "s_kh": "i32",
                    "s_vs": "i32",
                    "s_vh": "i32",
                    "s_ot": "i32",
                    "s_oh": "i32",
                    "s_pr": "i32",
                    "dim": "i32",
                    "GROUP": "constexpr",
                    "SPANS": "constexpr",
                    "PAGE": "constexpr",
                    "BLOCK_N": "constexpr",
                    "BLOCK_D": "constexpr",
                },
                {"GROUP": 2, "SPANS": 4, "PAGE": 16, "BLOCK_N": 64, "BLOCK_D": 128},
            )
        )
    out.append(
        (
            "lm_head_combine",
            K.lm_head_combine,
            {
                "max_ptr": "*fp32",
                "sum_ptr": "*fp32",
                "best_ptr": "*fp32",
                "idx_ptr": "*i64",
                "picked_ptr": "*fp32",
                "tokens_ptr": "*i64",
                "out_best_ptr": "*fp32",
                "lse_ptr": "*fp32",
                "out_picked_ptr": "*fp32",
                "n_rows": "i32",
                "splits": "i32",
                "HAS_TARGETS": "constexpr",
                "BLOCK": "constexpr",
            },
            {"HAS_TARGETS": True, "BLOCK": 64},
        )
    )
    return out


def main() -> int:
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except Exception as exc:  # pragma: no cover - depends on the installed Triton
        print(f"cannot compile here: {type(exc).__name__}: {exc}")
        return 77
    target = GPUTarget("cuda", 90, 32)
    failed = 0
    for label, kernel, signature, constexprs in kernels():
        try:
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=target)
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if "ptxas" in text and ("not found" in text.lower() or "No such file" in text):
                print(f"cannot compile here: {text}")
                return 77
            print(f"FAILED {label}: {text}")
            failed += 1
            continue
        print(f"ok {label}: {len(compiled.asm['cubin'])} bytes of sm_90 code")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
