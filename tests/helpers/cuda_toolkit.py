# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Where nvcc is: on PATH, under CUDA_HOME, or in the registry's nvcc packages (tests/requirements.txt).

The packages (nvidia-cuda-nvcc, nvidia-nvvm, nvidia-cuda-crt, nvidia-cuda-runtime, nvidia-cuda-cccl) put a
working toolkit under ``site-packages/nvidia/cu<major>/``: nvcc runs from there as it is, GPU or not.
"""

import os
import shutil
from pathlib import Path

import pytest


def find_nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for base in nvidia.__path__:
        for candidate in sorted(Path(base).glob("cu*/bin/nvcc"), reverse=True):
            return str(candidate)
    return None


def nvcc_or_skip():
    """nvcc's path; without one a skip, but in CI a failure (tests/requirements.txt installs it there)."""
    nvcc = find_nvcc()
    if nvcc is None:
        message = "nvcc not found (PATH, CUDA_HOME, or the nvidia-cuda-nvcc package of tests/requirements.txt)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must compile the CUDA kernel: {message}")
        pytest.skip(message)
    return nvcc
