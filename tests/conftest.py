import os

# The Triton kernels are tested on the CPU through Triton's interpreter; it must be on before triton loads.
os.environ.setdefault("TRITON_INTERPRET", "1")
# The tests' models are tiny: extra torch threads only add synchronisation (CI has 2 cores). Subprocesses inherit this.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from hypothesis import HealthCheck, settings

from refusion.plugins.manager import make_plugin_manager
from refusion.plugins.registry import Registry, reset_registry

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=int(os.environ.get("REFUSION_HYPOTHESIS_EXAMPLES", "25")),
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_runtest_setup(item):
    """Tests marked ``cuda`` (the GPU tier) skip without a CUDA device, unless ``REFUSION_GPU_TIER_DEVICE=cpu``
    runs the tier on the CPU (small shapes: it checks the tier's own code, not a GPU)."""
    if (
        item.get_closest_marker("cuda")
        and not torch.cuda.is_available()
        and os.environ.get("REFUSION_GPU_TIER_DEVICE") != "cpu"
    ):
        pytest.skip("needs a CUDA device (the GPU tier: TRITON_INTERPRET=0 python -m pytest -m cuda)")


@pytest.fixture(autouse=True)
def builtin_registry():
    """Every test starts from a fresh registry of the built-ins; entry points are off."""
    reset_registry(Registry(make_plugin_manager(entry_points=False)))
    yield
    reset_registry(None)


@pytest.fixture(scope="session")
def serve_process():
    """One ``refusion serve`` of the shipped model on a free loopback port, shared by the serving tests."""
    from tests.support.serving import ServerProcess

    process = ServerProcess("--max-rows", "16").start()
    yield process
    process.stop()
