// SPDX-License-Identifier: Apache-2.0

// DeepSpeed Team

// CUDA kernel of fused_norm.h, no torch headers (`nvcc -c` checks it without a GPU).
// Pass 1: one block per chunk, fp32 per thread (16-byte vector loads where aligned), block tree
//         reduction; a non-finite chunk is summed again in fp64. Writes one double per chunk.
// Pass 2: one block sums the chunk results in fp64 in a fixed order -> total and the flag;
//         optionally one block per tensor for the per-tensor sums.
// No atomics anywhere: the result is bitwise reproducible run to run.

#include <cuda_runtime.h>
#include <cstdint>

#include "fused_norm.h"

namespace {

constexpr int CHUNK_THREADS = 512;
constexpr int TOTAL_THREADS = 1024;
constexpr int PER_TENSOR_THREADS = 256;

__device__ __forceinline__ float bf16_magnitude(uint16_t x)
{
    return __uint_as_float(static_cast<uint32_t>(x) << 16);
}

// |x| of an IEEE half: exponent and mantissa rebiased by 2^112 (exact for normals and
// subnormals); inf and nan keep an all-ones exponent.
__device__ __forceinline__ float half_magnitude(uint16_t x)
{
    const uint32_t shifted = static_cast<uint32_t>(x & 0x7fff) << 13;
    return (x & 0x7c00) == 0x7c00 ? __uint_as_float(shifted | 0x7f800000u)
                                  : __uint_as_float(shifted) * 0x1p112f;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T value)
{
    for (int offset = 16; offset > 0; offset /= 2) {
        value += __shfl_down_sync(0xffffffffu, value, offset);
    }
    return value;
}

// Sum over the block, in a fixed order; the result is valid in thread 0.
template <typename T>
__device__ T block_sum(T value)
{
    __shared__ T partial[32];
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    value = warp_sum(value);
    __syncthreads();  // partial[] may still be read by a previous call
    if (lane == 0) { partial[warp] = value; }
    __syncthreads();
    const int warps = (blockDim.x + 31) / 32;
    value = (threadIdx.x < warps) ? partial[threadIdx.x] : T(0);
    if (warp == 0) { value = warp_sum(value); }
    return value;
}

template <typename Acc>
__device__ Acc chunk_sumsq_f32(const float* data, int64_t n)
{
    Acc sum = 0;
    int64_t i0 = 0;
    if ((reinterpret_cast<uintptr_t>(data) % 16) == 0) {
        const int64_t vectors = n / 4;
        const float4* vec = reinterpret_cast<const float4*>(data);
        for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
            const float4 x = vec[v];
            sum += Acc(x.x) * Acc(x.x) + Acc(x.y) * Acc(x.y) + Acc(x.z) * Acc(x.z) + Acc(x.w) * Acc(x.w);
        }
        i0 = vectors * 4;
    }
    for (int64_t i = i0 + threadIdx.x; i < n; i += blockDim.x) {
        const Acc x = data[i];
        sum += x * x;
    }
    return sum;
}

template <typename Acc, bool IsHalf>
__device__ Acc chunk_sumsq_16(const uint16_t* data, int64_t n)
{
    Acc sum = 0;
    int64_t i0 = 0;
    if ((reinterpret_cast<uintptr_t>(data) % 16) == 0) {
        const int64_t vectors = n / 8;
        const uint4* vec = reinterpret_cast<const uint4*>(data);
        for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
            const uint4 packed = vec[v];
            const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const uint16_t lo = static_cast<uint16_t>(words[w] & 0xffffu);
                const uint16_t hi = static_cast<uint16_t>(words[w] >> 16);
                const Acc a = IsHalf ? half_magnitude(lo) : bf16_magnitude(lo);
                const Acc b = IsHalf ? half_magnitude(hi) : bf16_magnitude(hi);
                sum += a * a + b * b;
            }
        }
        i0 = vectors * 8;
    }
    for (int64_t i = i0 + threadIdx.x; i < n; i += blockDim.x) {
        const Acc x = IsHalf ? half_magnitude(data[i]) : bf16_magnitude(data[i]);
        sum += x * x;
    }
    return sum;
}

template <typename Acc>
__device__ Acc chunk_sumsq(const FusedNormTensor& tensor, const FusedNormChunk& chunk)
{
    switch (tensor.dtype) {
        case FUSED_NORM_FLOAT16:
            return chunk_sumsq_16<Acc, true>(static_cast<const uint16_t*>(tensor.data) + chunk.start,
                                             chunk.length);
        case FUSED_NORM_BFLOAT16:
            return chunk_sumsq_16<Acc, false>(static_cast<const uint16_t*>(tensor.data) + chunk.start,
                                              chunk.length);
        case FUSED_NORM_FLOAT64: {
            const double* data = static_cast<const double*>(tensor.data) + chunk.start;
            Acc sum = 0;
            for (int64_t i = threadIdx.x; i < chunk.length; i += blockDim.x) {
                sum += Acc(data[i]) * Acc(data[i]);
            }
            return sum;
        }
        default:
            return chunk_sumsq_f32<Acc>(static_cast<const float*>(tensor.data) + chunk.start, chunk.length);
    }
}

__global__ void chunk_kernel(const FusedNormTensor* tensors, const FusedNormChunk* chunks, double* chunk_sums)
{
    const FusedNormChunk chunk = chunks[blockIdx.x];
    const FusedNormTensor tensor = tensors[chunk.tensor];
    __shared__ int redo;
    double result;
    if (tensor.dtype == FUSED_NORM_FLOAT64) {
        result = block_sum(chunk_sumsq<double>(tensor, chunk));
        if (threadIdx.x == 0) { chunk_sums[blockIdx.x] = result; }
        return;
    }
    const float fast = block_sum(chunk_sumsq<float>(tensor, chunk));
    if (threadIdx.x == 0) { redo = isfinite(fast) ? 0 : 1; }
    __syncthreads();
    // Not finite: an inf/nan element, or a finite square beyond fp32. fp64 tells which.
    result = redo ? block_sum(chunk_sumsq<double>(tensor, chunk)) : double(fast);
    if (threadIdx.x == 0) { chunk_sums[blockIdx.x] = result; }
}

__global__ void total_kernel(const double* chunk_sums, int64_t n_chunks, double* total, int32_t* nonfinite)
{
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < n_chunks; c += blockDim.x) { sum += chunk_sums[c]; }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        *total = sum;
        *nonfinite = isfinite(sum) ? 0 : 1;
    }
}

__device__ int64_t first_chunk_of(const FusedNormChunk* chunks, int64_t n_chunks, int64_t tensor)
{
    int64_t lo = 0, hi = n_chunks;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (chunks[mid].tensor < tensor) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

__global__ void per_tensor_kernel(const FusedNormChunk* chunks,
                                  int64_t n_chunks,
                                  const double* chunk_sums,
                                  double* per_tensor)
{
    const int64_t tensor = blockIdx.x;
    const int64_t begin = first_chunk_of(chunks, n_chunks, tensor);
    const int64_t end = first_chunk_of(chunks, n_chunks, tensor + 1);
    double sum = 0.0;
    for (int64_t c = begin + threadIdx.x; c < end; c += blockDim.x) { sum += chunk_sums[c]; }
    sum = block_sum(sum);
    if (threadIdx.x == 0) { per_tensor[tensor] = sum; }
}

}  // namespace

int fused_norm_sumsq_cuda(const FusedNormTensor* device_tensors,
                          int64_t n_tensors,
                          const FusedNormChunk* device_chunks,
                          int64_t n_chunks,
                          double* workspace,
                          double* total,
                          int32_t* nonfinite,
                          double* per_tensor,
                          void* stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (n_chunks > 0) {
        chunk_kernel<<<static_cast<unsigned int>(n_chunks), CHUNK_THREADS, 0, s>>>(
            device_tensors, device_chunks, workspace);
    }
    total_kernel<<<1, TOTAL_THREADS, 0, s>>>(workspace, n_chunks, total, nonfinite);
    if (per_tensor != nullptr && n_tensors > 0) {
        per_tensor_kernel<<<static_cast<unsigned int>(n_tensors), PER_TENSOR_THREADS, 0, s>>>(
            device_chunks, n_chunks, workspace, per_tensor);
    }
    return static_cast<int>(cudaGetLastError());
}
