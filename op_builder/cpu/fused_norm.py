# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team

from .builder import CPUOpBuilder


class FusedNormBuilder(CPUOpBuilder):
    """Multi-tensor sum of squares (global L2 grad norm) on the CPU: SIMD lanes + OpenMP."""
    BUILD_VAR = "DS_BUILD_FUSED_NORM"
    NAME = "fused_norm"

    def __init__(self):
        super().__init__(name=self.NAME)

    def absolute_name(self):
        return f'deepspeed.ops.fused_norm.{self.NAME}_op'

    def sources(self):
        return [
            'csrc/fused_norm/fused_norm_binding.cpp', 'csrc/fused_norm/fused_norm_plan.cpp',
            'csrc/fused_norm/fused_norm_cpu.cpp'
        ]

    def include_paths(self):
        return ['csrc/fused_norm']

    def simd_width(self):
        # No SIMD define (-D__AVX512__ ...): only the CPU optimizers' simd.h reads one, so it would only change the
        # flags, and with them the op's JIT build, for nothing. '' is dropped from the flags as an empty entry.
        return ''

    def cxx_args(self):
        # No fused multiply-add: -march=native would contract a lane's square-and-add into one, so this
        # build's fp32 sums would differ in their last bits from the CUDA build's CPU kernel.
        return super().cxx_args() + ['-ffp-contract=off']

    def extra_ldflags(self):
        return ['-fopenmp']
