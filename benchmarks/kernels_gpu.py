"""GPU benchmark of refusion_kernels against their torch references (needs CUDA and Triton).

Run:  python benchmarks/kernels_gpu.py

Times (CUDA events, median of 50 after warm-up) the fused confidence kernel
(argmax + softmax probability per row, Qwen3 vocabulary 151936) against the
torch reference (which materialises the softmax), and the KV scatter against
advanced-index assignment, and checks that both agree.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cuda_milliseconds


def timed(fn, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        times.append(cuda_milliseconds(fn))
    return statistics.median(times)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs a GPU (the kernels are tested on the CPU with TRITON_INTERPRET=1)")
        return 0
    from refusion_kernels import confidence, confidence_reference, scatter_kv, scatter_kv_reference

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'op':<34} {'shape':<28} {'triton ms':>10} {'torch ms':>10} {'speed-up':>9} {'agree':>6}")
    for rows, vocab, dtype in (
        (128, 151936, torch.bfloat16),
        (512, 151936, torch.bfloat16),
        (2048, 151936, torch.float32),
    ):
        logits = torch.randn(rows, vocab, device="cuda", dtype=dtype) * 4
        tri = timed(lambda logits=logits: confidence(logits, exclude=151670, backend="triton"))
        ref = timed(lambda logits=logits: confidence_reference(logits, exclude=151670))
        agree = torch.equal(
            confidence(logits, exclude=151670, backend="triton")[0], confidence_reference(logits, exclude=151670)[0]
        )
        print(
            f"{'confidence (argmax + prob)':<34} {f'{rows}x{vocab} {str(dtype)[6:]}':<28} {tri:>10.3f} {ref:>10.3f} "
            f"{ref / tri:>8.2f}x {str(agree):>6}"
        )
    for layers, heads, dim, context, tokens in ((36, 8, 128, 4096, 32), (36, 8, 128, 4096, 256)):
        cache = torch.zeros(layers, 2, 8, heads, context, dim, device="cuda", dtype=torch.bfloat16)
        src = torch.randn(layers, 2, heads, tokens, dim, device="cuda", dtype=torch.bfloat16)
        rows_idx = torch.randint(0, 8, (tokens,), device="cuda")
        cols = torch.randperm(context, device="cuda")[:tokens]
        tri = timed(lambda c=cache, s=src, r=rows_idx, k=cols: scatter_kv(c, s, r, k, backend="triton"))
        ref = timed(lambda c=cache, s=src, r=rows_idx, k=cols: scatter_kv_reference(c, s, r, k))
        a = cache.clone()
        scatter_kv(a, src, rows_idx, cols, backend="triton")
        b = cache.clone()
        scatter_kv_reference(b, src, rows_idx, cols)
        shape = f"{tokens} tok into {layers}L x 8 x {context}"
        agree = str(torch.equal(a, b))
        print(f"{'scatter committed KV':<34} {shape:<28} {tri:>10.3f} {ref:>10.3f} {ref / tri:>8.2f}x {agree:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
