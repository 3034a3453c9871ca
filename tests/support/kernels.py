"""The CPU kernel family that decides how half-precision matrix products round on this machine.

torch's CPU capability (``AVX2``, ``AVX512``, ...) picks its own kernels, and oneDNN, which runs bfloat16/float16
``F.linear``, uses AMX tiles where the CPU has them: an AVX512 CPU with AMX (Intel Sapphire Rapids and later) rounds
bf16 products otherwise than one without (AMD EPYC), so golden half-precision outputs made on one hold only on the
same family. Measured: the peers' bf16 goldens made on an AVX512 AMD EPYC hold on an AMX Xeon only with
``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``.
"""

from __future__ import annotations

import os

import torch


def cpu_kernel_family() -> str:
    """``torch.backends.cpu.get_cpu_capability()``, with ``+AMX`` where oneDNN may use AMX tiles (the CPU has them
    and ``ONEDNN_MAX_CPU_ISA`` does not cap oneDNN below them)."""
    family = torch.backends.cpu.get_cpu_capability()
    has_amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    if has_amx and (capped == "ALL" or "AMX" in capped):
        family += "+AMX"
    return family
