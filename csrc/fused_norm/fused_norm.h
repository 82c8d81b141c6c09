// SPDX-License-Identifier: Apache-2.0

// DeepSpeed Team

// Multi-tensor sum of squares (the squared L2 norm) over tensors of mixed dtype, without torch
// headers: the CPU and CUDA kernels are plain C++/CUDA so that they compile on their own
// (`nvcc -c` on a machine without a GPU); fused_norm_binding.cpp does the torch part.
//
// Accumulation: fp32 for short runs (at most 64 elements per SIMD lane on the CPU, 128 per thread
// on CUDA, then a pairwise combine), fp64 across them and across chunks of FUSED_NORM_CHUNK
// elements, in a fixed order (no atomics), so the result does not depend on thread count or
// scheduling. A run whose fp32 sum is not finite is summed again in fp64: that tells a square that
// overflowed fp32 (|x| > 1.8e19, finite) from an inf/nan element, which sets the non-finite flag.

#pragma once

#include <cstdint>

#define FUSED_NORM_CHUNK 65536

enum FusedNormDtype : int32_t {
    FUSED_NORM_FLOAT32 = 0,
    FUSED_NORM_FLOAT16 = 1,
    FUSED_NORM_BFLOAT16 = 2,
    FUSED_NORM_FLOAT64 = 3,
};

struct FusedNormTensor {
    const void* data;
    int64_t numel;
    int32_t dtype;  // FusedNormDtype
    int32_t pad;
};

// One chunk of one tensor: elements [start, start + length) of tensors[tensor].
struct FusedNormChunk {
    int64_t tensor;
    int64_t start;
    int64_t length;
};

// Number of chunks `tensors` splits into (what the caller allocates for).
int64_t fused_norm_count_chunks(const FusedNormTensor* tensors, int64_t n_tensors);

// Fills `chunks` (fused_norm_count_chunks entries), tensor by tensor, in order.
void fused_norm_plan_chunks(const FusedNormTensor* tensors, int64_t n_tensors, FusedNormChunk* chunks);

// CPU: writes the total sum of squares to *total, 1 to *nonfinite when an element is inf or nan
// (else 0), and, when per_tensor is not null, each tensor's own sum of squares.
void fused_norm_sumsq_cpu(const FusedNormTensor* tensors,
                          int64_t n_tensors,
                          double* total,
                          int32_t* nonfinite,
                          double* per_tensor);

// CUDA, asynchronous on `stream` (a cudaStream_t): `device_tensors` and `device_chunks` are the
// plan in device memory; `workspace` holds n_chunks doubles of device memory. Results are
// written to device memory: total (1 double), nonfinite (1 int32), per_tensor (n_tensors doubles,
// or null). Returns 0, or a cudaError_t value.
int fused_norm_sumsq_cuda(const FusedNormTensor* device_tensors,
                          int64_t n_tensors,
                          const FusedNormChunk* device_chunks,
                          int64_t n_chunks,
                          double* workspace,
                          double* total,
                          int32_t* nonfinite,
                          double* per_tensor,
                          void* stream);
