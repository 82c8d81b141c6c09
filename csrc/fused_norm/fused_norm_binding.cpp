// SPDX-License-Identifier: Apache-2.0

// DeepSpeed Team

// The torch side of fused_norm.h: checks and describes the tensors, runs the CPU kernel, or the
// CUDA kernel on the current stream (built with FUSED_NORM_WITH_CUDA), returns torch tensors.

#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fused_norm.h"

#ifdef FUSED_NORM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace {

int32_t dtype_code(const at::Tensor& tensor)
{
    switch (tensor.scalar_type()) {
        case at::kFloat: return FUSED_NORM_FLOAT32;
        case at::kHalf: return FUSED_NORM_FLOAT16;
        case at::kBFloat16: return FUSED_NORM_BFLOAT16;
        case at::kDouble: return FUSED_NORM_FLOAT64;
        default:
            TORCH_CHECK(false,
                        "fused_norm: tensors must be float32, float16, bfloat16 or float64, got ",
                        tensor.scalar_type());
    }
    return FUSED_NORM_FLOAT32;
}

}  // namespace

// Returns [total sum of squares (float64, 0-dim), non-finite flag (bool, 0-dim), per-tensor sums of
// squares (float64, [n]) or an empty tensor], on the tensors' device.
std::vector<at::Tensor> multi_tensor_sumsq(const std::vector<at::Tensor>& tensors, bool per_tensor)
{
    TORCH_CHECK(!tensors.empty(), "fused_norm: no tensors (the Python API handles an empty list)");
    const at::Device device = tensors[0].device();
    std::vector<at::Tensor> contiguous;  // keeps copies of non-contiguous inputs alive
    contiguous.reserve(tensors.size());
    std::vector<FusedNormTensor> described;
    described.reserve(tensors.size());
    for (const auto& tensor : tensors) {
        TORCH_CHECK(tensor.device() == device,
                    "fused_norm: all tensors must be on one device, got ",
                    device,
                    " and ",
                    tensor.device());
        contiguous.push_back(tensor.contiguous());
        const auto& t = contiguous.back();
        described.push_back(FusedNormTensor{t.data_ptr(), t.numel(), dtype_code(t), 0});
    }
    const int64_t n_tensors = static_cast<int64_t>(described.size());
    auto doubles = at::TensorOptions().dtype(at::kDouble).device(device);
    at::Tensor total = at::empty({}, doubles);
    at::Tensor per = per_tensor ? at::empty({n_tensors}, doubles) : at::empty({0}, doubles);

    if (device.is_cpu()) {
        int32_t nonfinite = 0;
        fused_norm_sumsq_cpu(described.data(),
                             n_tensors,
                             total.data_ptr<double>(),
                             &nonfinite,
                             per_tensor ? per.data_ptr<double>() : nullptr);
        return {total, at::scalar_tensor(nonfinite != 0, at::TensorOptions().dtype(at::kBool)), per};
    }

#ifdef FUSED_NORM_WITH_CUDA
    TORCH_CHECK(device.is_cuda(), "fused_norm: unsupported device ", device);
    const int64_t n_chunks = fused_norm_count_chunks(described.data(), n_tensors);
    // The plan travels in one pinned buffer, copied asynchronously (no host sync).
    const int64_t tensor_bytes = n_tensors * static_cast<int64_t>(sizeof(FusedNormTensor));
    const int64_t chunk_bytes = n_chunks * static_cast<int64_t>(sizeof(FusedNormChunk));
    at::Tensor plan =
        at::empty({tensor_bytes + chunk_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    std::memcpy(plan.data_ptr(), described.data(), tensor_bytes);
    fused_norm_plan_chunks(described.data(),
                           n_tensors,
                           reinterpret_cast<FusedNormChunk*>(plan.data_ptr<uint8_t>() + tensor_bytes));
    at::Tensor device_plan = plan.to(device, /*non_blocking=*/true);
    at::Tensor workspace = at::empty({std::max<int64_t>(n_chunks, 1)}, doubles);
    at::Tensor flag = at::empty({}, at::TensorOptions().dtype(at::kInt).device(device));
    const uint8_t* base = device_plan.data_ptr<uint8_t>();
    const int err = fused_norm_sumsq_cuda(reinterpret_cast<const FusedNormTensor*>(base),
                                          n_tensors,
                                          reinterpret_cast<const FusedNormChunk*>(base + tensor_bytes),
                                          n_chunks,
                                          workspace.data_ptr<double>(),
                                          total.data_ptr<double>(),
                                          flag.data_ptr<int32_t>(),
                                          per_tensor ? per.data_ptr<double>() : nullptr,
                                          at::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == 0, "fused_norm: CUDA kernel launch failed with error ", err);
    return {total, flag.ne(0), per};
#else
    TORCH_CHECK(false, "fused_norm: this build of the op has no CUDA kernel; device ", device);
    return {};
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("multi_tensor_sumsq",
          &multi_tensor_sumsq,
          "Sum of squares over a list of tensors (fp32 within chunks, fp64 across), non-finite flag, "
          "optional per-tensor sums");
}
