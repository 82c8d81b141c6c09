# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""TORCH_CUDA_ARCH_LIST entries with arch- or family-specific suffixes (``9.0a``, ``12.0f``) and
``+PTX``, read by the op builders as PyTorch reads them. Regression test for deepspeed 0.19.8 (it
fails there): ``int('0a')`` raised ValueError in every CUDA op build, JIT and prebuild alike, on
images that set ``TORCH_CUDA_ARCH_LIST=9.0a`` (common for H100), and the canonicalisation dropped
the suffix. Runs on the CPU: only the flags are computed, nothing is compiled.
"""

import os

import pytest
from torch.utils.cpp_extension import _get_cuda_arch_flags

# The CUDA builders themselves (deepspeed.ops.op_builder gives the CPU accelerator's here).
from deepspeed.ops.op_builder.evoformer_attn import EvoformerAttnBuilder
from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder


def gencode(num, ptx=False):
    flags = [f"-gencode=arch=compute_{num},code=sm_{num}"]
    return flags + [f"-gencode=arch=compute_{num},code=compute_{num}"] if ptx else flags


def prebuild_flags(builder, arch_list, monkeypatch):
    """compute_capability_args() of a prebuild (setup.py), and the list it leaves for PyTorch."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    builder.jit_mode = False
    return builder.compute_capability_args(), os.environ["TORCH_CUDA_ARCH_LIST"]


@pytest.mark.parametrize(
    "arch_list, flags, left",
    [
        ("8.0;9.0a;10.0a+PTX", gencode(80) + gencode("90a") + gencode("100a", ptx=True), "8.0;9.0a;10.0a+PTX"),
        ("12.0f", gencode("120f"), "12.0f"),
        # spaces as separators, an arch and its arch-specific variant side by side, unsorted
        ("9.0a  8.6 9.0", gencode(86) + gencode(90) + gencode("90a"), "8.6;9.0;9.0a"),
        # +PTX on any variant of an arch carries through the dedupe, suffix kept apart
        ("9.0a;9.0a+PTX;9.0", gencode(90) + gencode("90a", ptx=True), "9.0;9.0a+PTX"),
    ])
def test_prebuild_flags_keep_the_suffix(arch_list, flags, left, monkeypatch):
    assert prebuild_flags(FusedAdamBuilder(), arch_list, monkeypatch) == (flags, left)


@pytest.mark.parametrize("arch_list", ["9.0a", "8.0;9.0a;10.0a+PTX", "8.6 9.0 9.0a+PTX", "7.0;12.0a"])
def test_prebuild_flags_match_pytorch(arch_list, monkeypatch):
    """The same -gencode set as PyTorch's own parser gives for the list (torch 2.13 knows 'a', not 'f')."""
    flags, _ = prebuild_flags(FusedAdamBuilder(), arch_list, monkeypatch)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    assert sorted(flags) == _get_cuda_arch_flags()


def test_jit_build_hands_pytorch_the_suffix(monkeypatch):
    """JIT: the highest entry gets +PTX and PyTorch's parser turns the list into sm_90a code."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    builder = FusedAdamBuilder()
    builder.jit_mode = True
    assert builder.compute_capability_args() == []
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "9.0a+PTX"
    assert _get_cuda_arch_flags() == sorted(gencode("90a", ptx=True))


def test_jit_sort_takes_suffixed_entries(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "10.0a;8.0;9.0a")
    builder = FusedAdamBuilder()
    builder.jit_mode = True
    builder.compute_capability_args()
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0a;10.0a+PTX"


def test_builders_that_filter_archs_keep_working(monkeypatch):
    """EvoformerAttnBuilder keeps Tensor Core targets (>= 7.0) with its own filter_ccs."""
    flags, left = prebuild_flags(EvoformerAttnBuilder(), "6.1;7.5;9.0a+PTX", monkeypatch)
    assert (flags, left) == (gencode(75) + gencode("90a", ptx=True), "7.5;9.0a+PTX")


@pytest.mark.parametrize("entry", ["9.x", "9.0b", "sm_90", "9.0a+ptx"])
def test_invalid_entries_are_refused_with_the_variable_named(entry, monkeypatch):
    with pytest.raises(ValueError, match="TORCH_CUDA_ARCH_LIST"):
        prebuild_flags(FusedAdamBuilder(), f"8.0;{entry}", monkeypatch)
