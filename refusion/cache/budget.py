"""How much memory keys/values may take when the caller does not say (``kv_memory`` / ``--kv-memory``).

On a CUDA device, 90% of the memory free when the engine first needs pages (the model is loaded by then), as
vLLM's ``gpu_memory_utilization`` leaves a margin; on the CPU, half the memory the operating system reports
available (``MemAvailable``), since the host also holds the model, the process and everything else running. The
pool behind it grows by a quarter at a time as pages are taken, so a large budget costs nothing until it is used.
"""

from __future__ import annotations

import os

import torch

#: share of the free device memory keys/values may take on a GPU
CUDA_SHARE = 0.9
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
