# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The fused_norm op (deepspeed.ops.fused_norm): sum of squares of many tensors vs an fp64 reference.

CPU tests build the op with the CPU accelerator's builder (JIT, about a minute once per run, in the
run's private extensions directory); CUDA tests skip without a GPU; the CUDA kernel is
compile-checked with nvcc where nvcc exists, GPU or not. All fork_only: upstream has no such op.
"""

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.cuda_toolkit import nvcc_or_skip

pytestmark = pytest.mark.fork_only

CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def fused_norm(extensions_dir):
    """The module, with its op built (or loaded) in the run's extensions directory."""
    os.environ["TORCH_EXTENSIONS_DIR"] = str(extensions_dir)
    from deepspeed.ops import fused_norm
    assert fused_norm.load_op() is not None, "the fused_norm op did not build on this machine"
    return fused_norm


def reference(tensors):
    """Sum of squares in fp64, tensor by tensor (the values as stored, so bf16/fp16 exactly)."""
    return [float(t.double().pow(2).sum()) for t in tensors]


def mixed_tensors(seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    sizes = [0, 1, 7, 65535, 65536, 65537, 2**20 + 3] + [int(n) for n in torch.randint(1, 300, (200, ), generator=gen)]
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
    return [(torch.randn(n, generator=gen) * 3).to(dtypes[i % 4]).to(device) for i, n in enumerate(sizes)]


@pytest.mark.parametrize("implementation", ["op", "torch"])
def test_matches_fp64_reference(fused_norm, implementation):
    tensors = mixed_tensors(0)
    result = fused_norm.sum_of_squares(tensors, per_tensor=True, implementation=implementation)
    want = reference(tensors)
    assert result.total.dtype == torch.float64 and not bool(result.nonfinite)
    assert math.isclose(float(result.total), sum(want), rel_tol=1e-6)
    for index, (got, expected) in enumerate(zip(result.per_tensor.tolist(), want)):
        assert math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-30), f"tensor {index}: {got} vs {expected}"
    assert math.isclose(float(fused_norm.l2_norm(tensors, implementation=implementation)),
                        math.sqrt(sum(want)),
                        rel_tol=1e-6)


def test_empty_list_and_empty_tensors(fused_norm):
    assert float(fused_norm.sum_of_squares([]).total) == 0.0
    result = fused_norm.sum_of_squares([torch.empty(0), torch.empty(0, dtype=torch.bfloat16)], per_tensor=True)
    assert float(result.total) == 0.0 and not bool(result.nonfinite) and result.per_tensor.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_inf_and_nan_are_flagged(fused_norm, dtype, bad):
    tensors = mixed_tensors(1)
    target = tensors[6].to(dtype)  # 2**20 + 3 elements: the bad value sits in a middle chunk
    target[700000] = bad
    tensors[6] = target
    for implementation in ("op", "torch"):
        result = fused_norm.sum_of_squares(tensors, implementation=implementation)
        assert bool(result.nonfinite), f"{implementation}: {bad} in {dtype} not flagged"
        assert not math.isfinite(float(result.total))


def test_large_finite_values_are_not_an_overflow(fused_norm):
    """3e19 squared overflows fp32 but is a finite gradient: summed in fp64 instead, not flagged."""
    result = fused_norm.sum_of_squares([torch.full((1000, ), 3e19), torch.ones(10, dtype=torch.bfloat16)])
    assert not bool(result.nonfinite)
    assert math.isclose(float(result.total), 1000 * 9e38 + 10, rel_tol=1e-6)


def test_fp16_subnormals_and_extremes(fused_norm):
    values = torch.tensor([6e-8, 1e-5, 65504.0, -65504.0, -3e-6, 0.0], dtype=torch.float16)
    assert math.isclose(float(fused_norm.sum_of_squares([values]).total), reference([values])[0], rel_tol=1e-6)


def test_non_contiguous_tensors(fused_norm):
    base = torch.randn(300, 200)
    views = [base.t(), base[:, ::3], base[::2].to(torch.bfloat16)]
    assert math.isclose(float(fused_norm.sum_of_squares(views).total), sum(reference(views)), rel_tol=1e-6)


def test_deterministic(fused_norm):
    tensors = mixed_tensors(2)
    first = fused_norm.sum_of_squares(tensors, per_tensor=True)
    for _ in range(3):
        again = fused_norm.sum_of_squares(tensors, per_tensor=True)
        assert float(again.total) == float(first.total)
        assert torch.equal(again.per_tensor, first.per_tensor)


def test_unsupported_dtype_is_refused(fused_norm):
    with pytest.raises(TypeError, match="tensor 1 has dtype torch.int64"):
        fused_norm.sum_of_squares([torch.ones(3), torch.ones(3, dtype=torch.int64)])
    with pytest.raises(ValueError, match="implementation"):
        fused_norm.sum_of_squares([torch.ones(3)], implementation="fast")


def test_plan_gives_the_same_numbers_and_is_built_once(fused_norm):
    tensors = mixed_tensors(6)
    plan = fused_norm.SumOfSquaresPlan()
    assert plan.builds == 0
    plain = fused_norm.sum_of_squares(tensors, per_tensor=True)
    for _ in range(3):
        planned = fused_norm.sum_of_squares(tensors, per_tensor=True, plan=plan)
        assert float(planned.total) == float(plain.total) and torch.equal(planned.per_tensor, plain.per_tensor)
        assert not bool(planned.nonfinite) and planned.nonfinite.dtype == torch.bool
        assert fused_norm.sum_of_squares(tensors, plan=plan).per_tensor is None
    assert plan.builds == 1
    tensors[6][5] = float("nan")  # values change every step: the plan holds no values
    assert bool(fused_norm.sum_of_squares(tensors, plan=plan).nonfinite) and plan.builds == 1


def test_plan_follows_the_set_as_it_changes(fused_norm):
    """A gradient moved to new storage updates the pointers; resized, re-typed, a tensor added or
    dropped, the list reordered: each rebuilds the layout. The numbers are always the new set's."""
    grads = [torch.randn(70000), torch.randn(300, dtype=torch.bfloat16), torch.randn(5)]
    plan = fused_norm.SumOfSquaresPlan()

    def check(builds, pointer_updates):
        got = fused_norm.sum_of_squares(grads, per_tensor=True, plan=plan)
        assert math.isclose(float(got.total), sum(reference(grads)), rel_tol=1e-6)
        assert torch.allclose(got.per_tensor, torch.tensor(reference(grads), dtype=torch.float64), rtol=1e-6)
        assert (plan.builds, plan.pointer_updates) == (builds, pointer_updates)

    check(1, 0)
    grads[0] = grads[0].clone() * 2  # new storage (what set_to_none=True then a backward gives)
    check(1, 1)
    check(1, 1)
    grads[2].set_(torch.randn(5))  # same tensor object, its storage replaced in place
    check(1, 2)
    grads[0].set_(torch.randn(100))  # ... and resized
    check(2, 2)
    grads[1] = grads[1].float()  # same shape, another dtype
    check(3, 2)
    grads.append(torch.randn(9))
    check(4, 2)
    grads.pop(0)
    check(5, 2)
    grads.reverse()
    check(6, 2)
    grads[1] = grads[1].view(-1)  # a view of the same storage: nothing to do
    check(6, 2)


def test_plan_leaves_sets_it_cannot_take_to_the_general_path(fused_norm):
    base = torch.randn(300, 200)
    plan = fused_norm.SumOfSquaresPlan()
    views = [base.t(), base[:, ::3]]  # non-contiguous: the general path copies them
    assert math.isclose(float(fused_norm.sum_of_squares(views, plan=plan).total), sum(reference(views)), rel_tol=1e-6)
    assert plan.builds == 0
    assert float(fused_norm.sum_of_squares([], plan=plan).total) == 0.0
    with pytest.raises(TypeError, match="tensor 1 has dtype torch.int64"):
        fused_norm.sum_of_squares([torch.ones(3), torch.ones(3, dtype=torch.int64)], plan=plan)
    assert float(fused_norm.sum_of_squares([torch.ones(4)], plan=plan, implementation="torch").total) == 4.0
    assert plan.builds == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_accuracy_on_100m_elements(fused_norm, dtype):
    """<= 1e-6 relative to fp64 on 100M+ elements, in a gradient-like set of tensors."""
    gen = torch.Generator().manual_seed(3)
    sizes = [50_331_648, 33_554_432, 16_777_216, 1_048_576, 300_003]  # 102,011,875 elements
    tensors = [(torch.randn(n, generator=gen) * 1e-3).to(dtype) for n in sizes]
    want = sum(reference(tensors))
    got = float(fused_norm.sum_of_squares(tensors).total)
    assert abs(got - want) / want <= 1e-6


def test_torch_fp32_vector_norm_drifts_at_100m():
    """Why the op accumulates in fp64 across chunks: torch's own fp32 CPU norm of one 100M-element
    tensor is off by far more than 1e-6 (seen: ~1e-3 on the squared norm with torch 2.13)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(100_000_000, generator=gen)
    want = float(x.double().pow(2).sum())
    got = float(torch.linalg.vector_norm(x))**2
    assert abs(got - want) / want > 1e-5


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_matches_fp64_reference_and_cpu(fused_norm):
    tensors = mixed_tensors(5, device="cuda")
    result = fused_norm.sum_of_squares(tensors, per_tensor=True, implementation="op")
    assert result.total.device.type == "cuda"
    want = reference([t.cpu() for t in tensors])
    assert math.isclose(float(result.total), sum(want), rel_tol=1e-6)
    assert torch.allclose(result.per_tensor.cpu(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-30)
    tensors[6][123] = float("nan")
    assert bool(fused_norm.sum_of_squares(tensors, implementation="op").nonfinite)


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_over_2_to_31_elements(fused_norm):
    """64-bit indexing: one bf16 tensor of 2^31 + 5 elements (4 GiB)."""
    x = torch.full((2**31 + 5, ), 0.5, dtype=torch.bfloat16, device="cuda")
    assert float(fused_norm.sum_of_squares([x], implementation="op").total) == (2**31 + 5) * 0.25


def installed_csrc():
    import deepspeed
    return Path(deepspeed.__file__).parent / "ops" / "csrc" / "fused_norm"


# The architectures GPU users run: A100 (8.0), H100 (9.0, and 9.0a for its own instructions), B200 (10.0a),
# RTX 50xx / RTX PRO (12.0), with PTX for newer ones.
ARCH_LIST = "8.0;9.0;9.0a;10.0a;12.0+PTX"


def test_cuda_kernel_compiles_with_nvcc(tmp_path, monkeypatch):
    """The .cu file includes no torch header: nvcc compiles it on a machine without a GPU, warnings as errors,
    with the -gencode flags the fork's builder gives a prebuild for ARCH_LIST (in CI: nvcc from the registry)."""
    nvcc = nvcc_or_skip()
    from deepspeed.ops.op_builder.fused_norm import FusedNormBuilder
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", ARCH_LIST)
    builder = FusedNormBuilder()
    builder.jit_mode = False
    gencode = builder.compute_capability_args()
    for wanted in ("code=sm_80", "code=sm_90", "code=sm_90a", "code=sm_100a", "code=sm_120", "code=compute_120"):
        assert any(flag.endswith(wanted) for flag in gencode), (wanted, gencode)
    source = installed_csrc() / "fused_norm_cuda.cu"
    proc = subprocess.run([
        nvcc, "-c", "-O3", "-std=c++17", "-Werror", "all-warnings", *gencode, f"-I{source.parent}",
        str(source), "-o",
        str(tmp_path / "fused_norm_cuda.o")
    ],
                          capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    includes = [line for line in source.read_text().splitlines() if line.startswith("#include")]
    assert not [line for line in includes if "torch" in line or "ATen" in line or "c10" in line], includes


def test_ds_report_lists_the_op():
    # Beside the interpreter in a venv; on PATH for a --target or --user install.
    report = Path(sys.executable).with_name("ds_report")
    report = report if report.exists() else shutil.which("ds_report")
    assert report, "ds_report not found beside the interpreter or on PATH"
    out = subprocess.run([str(report)], capture_output=True, text=True, timeout=300).stdout
    assert any(line.startswith("fused_norm") for line in out.splitlines()), out[-2000:]


def test_cpu_build_probes_the_cpu_once(monkeypatch):
    """Loading the op computes its compiler flags, built or not. The CPU builder's base flags ran py-cpuinfo's
    probe (a Python subprocess, about 1.5 s) twice, for -march and for a SIMD define the kernel never reads: each
    rank's first norm paid both. One probe, for -march, and the flags that keep the CPU kernel's sums exact."""
    import cpuinfo
    from deepspeed.ops.op_builder import builder
    from deepspeed.ops.op_builder.cpu.fused_norm import FusedNormBuilder
    probes = []
    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: probes.append(1) or {"arch": "X86_64", "flags": ["avx2"]})
    # The process's probe (kept once asked, patch "Probe the CPU with py-cpuinfo once per process") is asked anew.
    builder.probed_cpu_info.cache_clear()
    try:
        flags = FusedNormBuilder().cxx_args()
    finally:
        builder.probed_cpu_info.cache_clear()  # the stand-in's answer serves no later test
    assert len(probes) == 1, flags
    assert "-march=native" in flags and "-ffp-contract=off" in flags and "-fopenmp" in flags, flags
    assert not [flag for flag in flags if flag.startswith("-D__")], flags
