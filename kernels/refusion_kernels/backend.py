"""Which implementation a kernel call uses."""

from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("auto", "torch", "triton")


@functools.cache
def triton_available() -> bool:
    """True when Triton imports and can run: a GPU driver, or the interpreter (``TRITON_INTERPRET=1``)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return torch.cuda.is_available()


def choose(tensor: torch.Tensor, backend: str | None = None) -> str:
    """``"triton"`` or ``"torch"`` for a call on ``tensor``.

    ``backend`` (or ``REFUSION_KERNELS``) ``"auto"`` takes Triton only for CUDA
    tensors (on the CPU the Triton interpreter is far slower than torch);
    ``"triton"`` forces it and raises if Triton cannot run.
    """
    wanted = backend or os.environ.get("REFUSION_KERNELS", "auto")
    if wanted not in BACKENDS:
        raise ValueError(f"`backend` must be one of {', '.join(BACKENDS)}; got {wanted!r}.")
    if wanted == "torch":
        return "torch"
    if wanted == "triton":
        if not triton_available():
            raise RuntimeError(
                "backend 'triton' was requested but Triton cannot run here (no GPU, TRITON_INTERPRET unset)"
            )
        return "triton"
    return "triton" if tensor.is_cuda and triton_available() else "torch"
