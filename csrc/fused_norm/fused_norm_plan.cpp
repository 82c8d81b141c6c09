// SPDX-License-Identifier: Apache-2.0

// DeepSpeed Team

#include "fused_norm.h"

int64_t fused_norm_count_chunks(const FusedNormTensor* tensors, int64_t n_tensors)
{
    int64_t chunks = 0;
    for (int64_t t = 0; t < n_tensors; ++t) {
        chunks += (tensors[t].numel + FUSED_NORM_CHUNK - 1) / FUSED_NORM_CHUNK;
    }
    return chunks;
}

void fused_norm_plan_chunks(const FusedNormTensor* tensors, int64_t n_tensors, FusedNormChunk* chunks)
{
    int64_t c = 0;
    for (int64_t t = 0; t < n_tensors; ++t) {
        for (int64_t start = 0; start < tensors[t].numel; start += FUSED_NORM_CHUNK) {
            const int64_t left = tensors[t].numel - start;
            chunks[c++] = FusedNormChunk{t, start, left < FUSED_NORM_CHUNK ? left : FUSED_NORM_CHUNK};
        }
    }
}
