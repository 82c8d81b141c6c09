# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team

import sys

from .builder import CUDAOpBuilder


class FusedNormBuilder(CUDAOpBuilder):
    """Multi-tensor sum of squares (global L2 grad norm) for CUDA tensors, and CPU tensors (offload).

    Without a CUDA toolkit it builds the CPU kernel alone, as the CPU builder does.
    """
    BUILD_VAR = "DS_BUILD_FUSED_NORM"
    NAME = "fused_norm"

    def __init__(self):
        super().__init__(name=self.NAME)

    def absolute_name(self):
        return f'deepspeed.ops.fused_norm.{self.NAME}_op'

    def _with_cuda(self):
        return not getattr(self, "build_for_cpu", False) and not self.is_rocm_pytorch()

    def sources(self):
        sources = [
            'csrc/fused_norm/fused_norm_binding.cpp', 'csrc/fused_norm/fused_norm_plan.cpp',
            'csrc/fused_norm/fused_norm_cpu.cpp'
        ]
        if self._with_cuda():
            sources.append('csrc/fused_norm/fused_norm_cuda.cu')
        return sources

    def include_paths(self):
        return ['csrc/fused_norm']

    def cxx_args(self):
        args = super().cxx_args()
        if sys.platform != "win32":
            # No fused multiply-add in the CPU kernel: with it (the CPU builder's -march=native) a lane's
            # rounding differs from this build's, and the two builds' fp32 sums differ in their last bits.
            args += ['-fopenmp', '-ffp-contract=off']
        if self._with_cuda():
            args.append('-DFUSED_NORM_WITH_CUDA')
        return args

    def extra_ldflags(self):
        return [] if sys.platform == "win32" else ['-fopenmp']

    def nvcc_args(self):
        # No --use_fast_math: it flushes subnormals (fp16 subnormal gradients) and the kernel
        # relies on isfinite() to tell inf/nan from an fp32 overflow.
        nvcc_flags = ['-O3'] + self.version_dependent_macros()
        if not self.is_rocm_pytorch():
            nvcc_flags.extend(['-lineinfo'] + self.compute_capability_args())
        return nvcc_flags
