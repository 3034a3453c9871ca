"""Whether a backend's matrix product gives a row other numbers depending on how many rows it multiplies: measured.

CPU BLAS libraries and GPU libraries pick their kernels by shape: on one AMD
EPYC with torch 2.13, a float32 row multiplied alone differs in its last bits
from the same row among 4 or more (bfloat16/float16 rows never do); on an
Intel Xeon with AMX float16 rows differ alone, and bfloat16 rows of 512
inputs or more differ below 64 rows; on an H200 float32 rows differ
below 17 rows. :func:`probe_rows` measures it once per process instead of
assuming it. Batch-invariant engines tile where it says rows depend
(:mod:`refusion.engines.invariant`); the LM head pads its projections to its
``min_rows`` (:mod:`refusion.models.head`). Knows nothing about decoding.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.nn.functional as F

#: the row counts :func:`probe_rows` compares with :data:`PROBE_REFERENCE_ROWS` rows
PROBE_ROWS = (1, 2, 3, 4, 5, 8, 17, 33)
PROBE_REFERENCE_ROWS = 70
#: the (inputs, outputs) of the probe's linear layers: small to model-sized (bfloat16 under AMX kernels depends on
#: the row count from 512 inputs up only)
PROBE_SHAPES = ((64, 128), (256, 768), (1024, 1024))
#: random inputs drawn per shape: a row's numbers can depend on the row count for some inputs only (float16 under
#: oneDNN's AMX kernels: the first draw of seed 0 shows nothing, the next ones do)
PROBE_DRAWS = 3


@attrs.frozen
class RowClasses:
    """What :func:`probe_rows` measured for one device and dtype.

    ``depends``: some row count gives a row other numbers than
    :data:`PROBE_REFERENCE_ROWS` rows do. ``min_rows``: the least row count
    from which every probed count gives the reference's numbers (1 when
    nothing depends on the count; ``None`` when no probed count does), so a
    projection padded to ``min_rows`` rows computes what a large one does.
    """

    depends: bool
    min_rows: int | None


_PROBED: dict[tuple, RowClasses] = {}


def probe_key(device: Any, dtype: torch.dtype) -> tuple:
    """The cache key of :func:`probe_rows`: device type and index, dtype, and the CPU's torch thread count."""
    device = torch.device(device)
    return device.type, device.index, dtype, torch.get_num_threads() if device.type == "cpu" else None


def probe_rows(device: Any, dtype: torch.dtype) -> RowClasses:
    """Whether a linear layer's result for a row changes with the number of rows multiplied with it, measured.

    Once per process for each :func:`probe_key`: a fixed random weight of
    each shape of :data:`PROBE_SHAPES` and :data:`PROBE_DRAWS` fixed random
    inputs of :data:`PROBE_REFERENCE_ROWS` rows (seeded) are multiplied whole and as its first rows for each
    count of :data:`PROBE_ROWS`, and the rows compared bit for bit. Tests
    may put a :class:`RowClasses` in the cache (``_PROBED[probe_key(...)]``)
    to force the answer. A device this process cannot reach is assumed to
    depend (nothing cached).
    """
    key = probe_key(device, dtype)
    known = _PROBED.get(key)
    if known is not None:
        return known
    kind = torch.device(device).type
    backend = getattr(torch, kind, None)
    if kind != "cpu" and not (backend is not None and backend.is_available()):  # nothing to measure: rows depend
        return RowClasses(True, None)
    generator = torch.Generator().manual_seed(0)
    same = dict.fromkeys(PROBE_ROWS, True)
    with torch.no_grad():
        for d, out in PROBE_SHAPES:
            weight = torch.randn(out, d, generator=generator).to(device=device, dtype=dtype)
            for _ in range(PROBE_DRAWS):
                x = torch.randn(PROBE_REFERENCE_ROWS, d, generator=generator).to(device=device, dtype=dtype)
                full = F.linear(x, weight)
                for rows in PROBE_ROWS:
                    same[rows] = same[rows] and bool(torch.equal(F.linear(x[:rows], weight), full[:rows]))
    stable = [m for m in PROBE_ROWS if all(same[n] for n in PROBE_ROWS if n >= m)]
    depends = not all(same.values())
    found = _PROBED[key] = RowClasses(depends, (min(stable) if stable else None) if depends else 1)
    return found
