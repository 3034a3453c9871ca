"""CudaSyncs counts the warnings of torch's CUDA sync debug mode, per engine step and call site (GPU tier: on a
device); without CUDA it refuses to start, and its counting is checked here on the warnings themselves."""

import warnings

import pytest
import torch

from refusion.measure.syncs import CudaSyncs


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_it_refuses_to_start_without_cuda():
    with pytest.raises(RuntimeError, match="needs CUDA"):
        with CudaSyncs():
            pass


def test_sync_warnings_are_counted_per_step_and_site_and_other_warnings_pass_through():
    syncs, shown = CudaSyncs(), []
    syncs._show = lambda *a: shown.append(a[0])
    syncs._seen("called a synchronizing CUDA operation", UserWarning, "x.py", 1)
    syncs._in_step = True
    syncs._seen(UserWarning("called a synchronizing CUDA operation"), UserWarning, "x.py", 1)
    syncs._seen("something else", UserWarning, "x.py", 2)
    assert syncs.total == 2 and syncs._step == 1 and shown == ["something else"]
    assert sum(syncs.sites.values()) == 2 and all("test_cuda_syncs.py" in site for site in syncs.sites)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert syncs.summary()["total"] == 2
