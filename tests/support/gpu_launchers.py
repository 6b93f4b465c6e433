"""What the GPU test modules (test_kernel_gpu.py, test_moe_experts_gpu.py) share: the device, once a launcher can
run there. They run with --noconftest on the device (benchmarks/device/*.sh), so this is a module, not a fixture."""

import os

import pytest
import torch


def launcher_device() -> torch.device:
    """The current CUDA device with its context current; the test skips, saying why, where the launcher library
    is missing or there are neither AOT images ($ET_TRT_KERNEL_IMAGES) nor Triton to compile them."""
    from et_trt_backend.kernels import launcher, op

    try:
        launcher.library_path()
    except launcher.LauncherError as e:
        pytest.skip(str(e))
    if not os.environ.get(op.IMAGES_ENV):
        pytest.importorskip("triton", reason="no ET_TRT_KERNEL_IMAGES and no Triton to compile images")
    device = torch.device("cuda", torch.cuda.current_device())
    torch.empty(1, device=device)  # makes the CUDA context current
    return device
