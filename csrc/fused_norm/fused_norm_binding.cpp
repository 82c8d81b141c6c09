// SPDX-License-Identifier: Apache-2.0

// DeepSpeed Team

// The torch side of fused_norm.h: checks and describes the tensors, runs the CPU kernel, or the
// CUDA kernel on the current stream (built with FUSED_NORM_WITH_CUDA), returns torch tensors.

// The headers this file uses, not <torch/extension.h> (all of libtorch's C++ API): the op is JIT-built on first use,
// and those headers were most of its compile time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "fused_norm.h"

#ifdef FUSED_NORM_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
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


// The description of `tensors` the kernels take, or false where the op cannot take them as they are
// (more than one device, an unsupported dtype, a non-contiguous tensor): describing a contiguous copy
// is then the caller's choice.
bool describe(const std::vector<at::Tensor>& tensors, std::vector<FusedNormTensor>& described)
{
    described.clear();
    described.reserve(tensors.size());
    const at::Device device = tensors[0].device();
    for (const auto& t : tensors) {
        const auto type = t.scalar_type();
        if (t.device() != device || !t.is_contiguous() ||
            (type != at::kFloat && type != at::kHalf && type != at::kBFloat16 && type != at::kDouble)) {
            return false;
        }
        described.push_back(FusedNormTensor{t.data_ptr(), t.numel(), dtype_code(t), 0});
    }
    return true;
}

#ifdef FUSED_NORM_WITH_CUDA
// The plan in device memory: the tensors' description, then their chunks. It travels in one pinned
// buffer, copied asynchronously on the current stream (no host sync).
at::Tensor device_plan(const std::vector<FusedNormTensor>& described, int64_t n_chunks, const at::Device& device)
{
    const int64_t n_tensors = static_cast<int64_t>(described.size());
    const int64_t tensor_bytes = n_tensors * static_cast<int64_t>(sizeof(FusedNormTensor));
    const int64_t chunk_bytes = n_chunks * static_cast<int64_t>(sizeof(FusedNormChunk));
    at::Tensor plan =
        at::empty({tensor_bytes + chunk_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    std::memcpy(plan.data_ptr(), described.data(), tensor_bytes);
    fused_norm_plan_chunks(
        described.data(), n_tensors, reinterpret_cast<FusedNormChunk*>(plan.data_ptr<uint8_t>() + tensor_bytes));
    return plan.to(device, /*non_blocking=*/true);
}
#endif

// Runs the kernel of `device` over `described`; on CUDA, `plan` is its device plan (device_plan()).
// Returns [total, non-finite flag, per-tensor sums or an empty tensor], on `device`.
std::vector<at::Tensor> run(const std::vector<FusedNormTensor>& described,
                            const at::Device& device,
                            const at::Tensor& plan,
                            int64_t n_chunks,
                            bool per_tensor)
{
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
    at::Tensor workspace = at::empty({std::max<int64_t>(n_chunks, 1)}, doubles);
    at::Tensor flag = at::empty({}, at::TensorOptions().dtype(at::kInt).device(device));
    const uint8_t* base = plan.data_ptr<uint8_t>();
    const int64_t tensor_bytes = n_tensors * static_cast<int64_t>(sizeof(FusedNormTensor));
    const int err = fused_norm_sumsq_cuda(reinterpret_cast<const FusedNormTensor*>(base),
                                          n_tensors,
                                          reinterpret_cast<const FusedNormChunk*>(base + tensor_bytes),
                                          n_chunks,
                                          workspace.data_ptr<double>(),
                                          total.data_ptr<double>(),
                                          flag.data_ptr<int32_t>(),
                                          per_tensor ? per.data_ptr<double>() : nullptr,
                                          c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == 0, "fused_norm: CUDA kernel launch failed with error ", err);
    return {total, flag.ne(0), per};
#else
    (void)plan;
    (void)n_chunks;
    TORCH_CHECK(false, "fused_norm: this build of the op has no CUDA kernel; device ", device);
    return {};
#endif
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
    for (const auto& tensor : tensors) {
        TORCH_CHECK(tensor.device() == device,
                    "fused_norm: all tensors must be on one device, got ",
                    device,
                    " and ",
                    tensor.device());
        dtype_code(tensor);  // refuses an unsupported dtype with its name
        contiguous.push_back(tensor.contiguous());
    }
    std::vector<FusedNormTensor> described;
    describe(contiguous, described);
    const int64_t n_chunks = fused_norm_count_chunks(described.data(), static_cast<int64_t>(described.size()));
#ifdef FUSED_NORM_WITH_CUDA
    const at::Tensor plan = device.is_cuda() ? device_plan(described, n_chunks, device) : at::Tensor();
#else
    const at::Tensor plan;
#endif
    return run(described, device, plan, n_chunks, per_tensor);
}

// multi_tensor_sumsq for a set of tensors that recurs call after call (a step's gradients). Two
// parts are kept: the layout (each tensor's element count and dtype, the device, the chunks and,
// on CUDA, the chunk table in device memory and the stream it was copied on), built again only
// when one of those changes; and the tensors' data pointers, compared on every call (here, a few
// compares per tensor instead of a walk in Python). Gradients that moved to new storage (freed and
// allocated again each step on most paths) cost one small copy of the pointer table on CUDA, a
// copy on the same stream as every kernel that read the old one, so ordered after them. Tensors
// the kernels cannot take as they are (non-contiguous, mixed devices, unsupported dtypes) give an
// empty result: the caller takes the general path.
class SumOfSquaresPlan {
public:
    std::vector<at::Tensor> run_planned(const std::vector<at::Tensor>& tensors, bool per_tensor)
    {
        if (tensors.empty() || !describe(tensors, scratch_)) { return {}; }
        const at::Device device = tensors[0].device();
        if (!same_layout(device)) {
            rebuild(device);
        } else if (!same_pointers()) {
            update_pointers();
        }
        return run(described_, device, plan_, n_chunks_, per_tensor);
    }

    int64_t builds() const { return builds_; }
    int64_t pointer_updates() const { return pointer_updates_; }

private:
    bool same_layout(const at::Device& device) const
    {
        if (builds_ == 0 || device != device_ || scratch_.size() != described_.size()) { return false; }
#ifdef FUSED_NORM_WITH_CUDA
        // The plan was copied on stream_: on another stream that copy is not ordered before the kernel.
        if (device.is_cuda() && c10::cuda::getCurrentCUDAStream(device.index()).id() != stream_) { return false; }
#endif
        for (size_t i = 0; i < scratch_.size(); ++i) {
            if (scratch_[i].numel != described_[i].numel || scratch_[i].dtype != described_[i].dtype) {
                return false;
            }
        }
        return true;
    }

    bool same_pointers() const
    {
        for (size_t i = 0; i < scratch_.size(); ++i) {
            if (scratch_[i].data != described_[i].data) { return false; }
        }
        return true;
    }

    void rebuild(const at::Device& device)
    {
        described_.swap(scratch_);
        device_ = device;
        n_chunks_ = fused_norm_count_chunks(described_.data(), static_cast<int64_t>(described_.size()));
        plan_ = at::Tensor();
#ifdef FUSED_NORM_WITH_CUDA
        if (device.is_cuda()) {
            plan_ = device_plan(described_, n_chunks_, device);
            stream_ = c10::cuda::getCurrentCUDAStream(device.index()).id();
        }
#endif
        ++builds_;
    }

    void update_pointers()
    {
        described_.swap(scratch_);
#ifdef FUSED_NORM_WITH_CUDA
        if (device_.is_cuda()) {
            const int64_t tensor_bytes = static_cast<int64_t>(described_.size() * sizeof(FusedNormTensor));
            at::Tensor table = at::empty({tensor_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
            std::memcpy(table.data_ptr(), described_.data(), tensor_bytes);
            plan_.narrow(0, 0, tensor_bytes).copy_(table, /*non_blocking=*/true);
        }
#endif
        ++pointer_updates_;
    }

    std::vector<FusedNormTensor> described_;
    std::vector<FusedNormTensor> scratch_;  // this call's description, compared with described_
    at::Device device_{at::kCPU};
    int64_t n_chunks_ = 0;
    at::Tensor plan_;  // CUDA: the pointer table then the chunk table, in device memory
    int64_t stream_ = 0;
    int64_t builds_ = 0;
    int64_t pointer_updates_ = 0;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.def("multi_tensor_sumsq",
          &multi_tensor_sumsq,
          "Sum of squares over a list of tensors (fp32 within chunks, fp64 across), non-finite flag, "
          "optional per-tensor sums");
    py::class_<SumOfSquaresPlan>(m, "SumOfSquaresPlan")
        .def(py::init<>())
        .def("run",
             &SumOfSquaresPlan::run_planned,
             "multi_tensor_sumsq with the plan kept across calls; [] when the tensors need the general path")
        .def_property_readonly("builds", &SumOfSquaresPlan::builds, "how many times the layout was built")
        .def_property_readonly("pointer_updates",
                               &SumOfSquaresPlan::pointer_updates,
                               "how many times only the tensors' data pointers changed");
}
