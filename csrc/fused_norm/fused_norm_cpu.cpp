// SPDX-License-Identifier: Apache-2.0

// DeepSpeed Team

// CPU kernel of fused_norm.h: OpenMP over chunks, and within a chunk LANES independent fp32
// accumulators that the compiler maps onto SIMD registers (no -ffast-math needed: the lanes make
// the reassociation explicit).

#include <cmath>
#include <cstring>
#include <vector>

#include "fused_norm.h"

namespace {

constexpr int LANES = 32;

inline float bits_to_float(uint32_t bits)
{
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
}

struct LoadFloat {
    using type = float;
    static inline float magnitude(float x) { return x; }
};

struct LoadBFloat16 {
    using type = uint16_t;
    static inline float magnitude(uint16_t x) { return bits_to_float(static_cast<uint32_t>(x) << 16); }
};

struct LoadHalf {
    using type = uint16_t;
    // |x| as float (a square needs no sign): exponent and mantissa moved into float position and
    // rebiased by 2^112, which is exact for normal and subnormal halfs alike; inf and nan keep an
    // all-ones exponent.
    static inline float magnitude(uint16_t x)
    {
        const uint32_t shifted = static_cast<uint32_t>(x & 0x7fff) << 13;
        const float finite = bits_to_float(shifted) * 0x1p112f;
        return (x & 0x7c00) == 0x7c00 ? bits_to_float(shifted | 0x7f800000u) : finite;
    }
};

// fp32 lanes for at most BLOCK elements, then into fp64: the rounding of long fp32 sums of
// squares is biased for 16-bit inputs (ties), -3.9e-6 over 2048 elements per lane for bf16.
constexpr int64_t BLOCK = LANES * 64;

template <typename Load>
float sumsq_fp32(const typename Load::type* data, int64_t n)
{
    float lanes[LANES] = {0.0f};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
#pragma omp simd
        for (int j = 0; j < LANES; ++j) {
            const float v = Load::magnitude(data[i + j]);
            lanes[j] += v * v;
        }
    }
    for (int j = 0; i < n; ++i, ++j) {
        const float v = Load::magnitude(data[i]);
        lanes[j] += v * v;
    }
    // Pairwise, so the combine adds no error growth of its own.
    for (int width = LANES / 2; width > 0; width /= 2) {
        for (int j = 0; j < width; ++j) { lanes[j] += lanes[j + width]; }
    }
    return lanes[0];
}

template <typename Load>
double sumsq_fp64(const typename Load::type* data, int64_t n)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double v = Load::magnitude(data[i]);
        sum += v * v;
    }
    return sum;
}

double sumsq_doubles(const double* data, int64_t n)
{
    double lanes[LANES / 2] = {0.0};
    int64_t i = 0;
    for (; i + LANES / 2 <= n; i += LANES / 2) {
#pragma omp simd
        for (int j = 0; j < LANES / 2; ++j) { lanes[j] += data[i + j] * data[i + j]; }
    }
    for (int j = 0; i < n; ++i, ++j) { lanes[j] += data[i] * data[i]; }
    double sum = 0.0;
    for (int j = 0; j < LANES / 2; ++j) { sum += lanes[j]; }
    return sum;
}

template <typename Load>
double chunk_sumsq(const void* base, int64_t start, int64_t length)
{
    const auto* data = static_cast<const typename Load::type*>(base) + start;
    double sum = 0.0;
    for (int64_t offset = 0; offset < length; offset += BLOCK) {
        const int64_t n = length - offset < BLOCK ? length - offset : BLOCK;
        const float fast = sumsq_fp32<Load>(data + offset, n);
        // Not finite: an inf/nan element, or a finite square beyond fp32. fp64 tells which.
        sum += std::isfinite(fast) ? static_cast<double>(fast) : sumsq_fp64<Load>(data + offset, n);
    }
    return sum;
}

double chunk_sumsq(const FusedNormTensor& tensor, const FusedNormChunk& chunk)
{
    switch (tensor.dtype) {
        case FUSED_NORM_FLOAT16: return chunk_sumsq<LoadHalf>(tensor.data, chunk.start, chunk.length);
        case FUSED_NORM_BFLOAT16:
            return chunk_sumsq<LoadBFloat16>(tensor.data, chunk.start, chunk.length);
        case FUSED_NORM_FLOAT64:
            return sumsq_doubles(static_cast<const double*>(tensor.data) + chunk.start, chunk.length);
        default: return chunk_sumsq<LoadFloat>(tensor.data, chunk.start, chunk.length);
    }
}

}  // namespace

void fused_norm_sumsq_cpu(const FusedNormTensor* tensors,
                          int64_t n_tensors,
                          double* total,
                          int32_t* nonfinite,
                          double* per_tensor)
{
    std::vector<FusedNormChunk> chunks(fused_norm_count_chunks(tensors, n_tensors));
    fused_norm_plan_chunks(tensors, n_tensors, chunks.data());
    const int64_t n_chunks = static_cast<int64_t>(chunks.size());
    std::vector<double> sums(n_chunks);

#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n_chunks; ++c) { sums[c] = chunk_sumsq(tensors[chunks[c].tensor], chunks[c]); }

    // Fixed order, fp64: the same bits whatever the number of threads.
    if (per_tensor != nullptr) {
        for (int64_t t = 0; t < n_tensors; ++t) { per_tensor[t] = 0.0; }
    }
    double sum = 0.0;
    for (int64_t c = 0; c < n_chunks; ++c) {
        sum += sums[c];
        if (per_tensor != nullptr) { per_tensor[chunks[c].tensor] += sums[c]; }
    }
    *total = sum;
    *nonfinite = std::isfinite(sum) ? 0 : 1;
}
