"""The GPU tier: every test here is marked ``cuda`` and skips without a CUDA device.

On a GPU, with Triton compiled rather than interpreted (tests/conftest.py
turns the interpreter on unless told otherwise)::

    TRITON_INTERPRET=0 python -m pytest -m cuda tests/gpu

``benchmarks/gpu_session.py`` runs it that way and keeps the JUnit XML.
``REFUSION_GPU_TIER_DEVICE=cpu`` runs the tier on the CPU with small shapes
(Triton in its interpreter): a check of the tier's own code, not of a GPU.
Figures a test measures rather than asserts go to the JUnit XML as
properties and, when ``REFUSION_GPU_REPORT`` names a file, into it as JSON
lines (``{"test": ..., "name": ..., "value": ...}``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.cuda)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The tier's device: CUDA, or the CPU under ``REFUSION_GPU_TIER_DEVICE=cpu``."""
    return torch.device(os.environ.get("REFUSION_GPU_TIER_DEVICE") or "cuda")


@pytest.fixture(scope="session")
def on_gpu(device) -> bool:
    """Whether the tier runs on a GPU (full shapes) or checks itself on the CPU (small shapes)."""
    return device.type == "cuda"


@pytest.fixture
def record(request, record_property):
    """``record(name, value)``: keep a measured figure (JUnit property, and a JSON line in $REFUSION_GPU_REPORT)."""
    path = os.environ.get("REFUSION_GPU_REPORT")

    def keep(name: str, value) -> None:
        record_property(name, value)
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": request.node.nodeid, "name": name, "value": value}, default=str) + "\n")

    return keep


@pytest.fixture
def compiled_triton():
    """Skip where Triton would run in its interpreter (it must compile for the GPU here)."""
    if os.environ.get("TRITON_INTERPRET") == "1" and torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET=1 (tests/conftest.py's default): run the GPU tier with TRITON_INTERPRET=0")
