"""How much memory keys/values may take when the caller does not say (``kv_memory`` / ``--kv-memory``).

On a CUDA device, 40% of the memory free when the engine opens (the model is loaded by then); on the CPU, half the
memory the operating system reports available (``MemAvailable``), since the host also holds the model, the process
and everything else running. The pool behind the budget grows by a quarter at a time as pages are taken, so a large
budget costs nothing until it is used; growing holds the old and the new tensor at once (2.25x the pool at the
peak), which is why the GPU share is not vLLM's 90% (vLLM allocates its whole budget up front): at 40% the last
growth still fits beside the activations. A growth that fails anyway shrinks the budget to what exists
(:meth:`PagePool.allocate <refusion.cache.pages.PagePool.allocate>`).
"""

from __future__ import annotations

import os

import torch

#: share of the free device memory keys/values may take on a GPU
CUDA_SHARE = 0.4
#: share of the host's available memory keys/values may take on the CPU
HOST_SHARE = 0.5
#: the budget when the host does not say how much memory it has
FALLBACK_BYTES = 4 << 30


def available_host_memory() -> int | None:
    """Bytes of memory the host reports available (``MemAvailable``; free pages elsewhere), or ``None``."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def default_kv_memory(device: torch.device | str) -> int:
    """The default key/value budget in bytes on ``device`` (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * CUDA_SHARE)
    available = available_host_memory()
    return int(available * HOST_SHARE) if available else FALLBACK_BYTES
