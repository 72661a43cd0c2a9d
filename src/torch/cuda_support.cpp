#include "torch/cuda_support.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "support/error.h"

namespace fusion_jit {

int torch_cuda_device_count() {
  try {
    return static_cast<int>(c10::cuda::device_count());
  } catch (const std::exception&) {
    return 0;
  }
}

void* current_cuda_stream(int device) {
  return static_cast<void*>(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
}

void cuda_synchronize(int device) {
  c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device));
  c10::cuda::device_synchronize();
}

namespace {

// The tensor without its stride-0 dims (narrowed to one element): the distinct elements, with no two
// indices at one address, so that copy_ can write it.
at::Tensor distinct_view(at::Tensor t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.stride(d) == 0 && t.size(d) > 1) t = t.narrow(d, 0, 1);
  return t;
}

}  // namespace

struct CudaGraphReplay::Impl {
  at::cuda::CUDAGraph graph;
  std::vector<c10::IValue> static_inputs;
  c10::IValue static_outputs;
  int device = 0;
};

CudaGraphReplay::CudaGraphReplay(const std::vector<c10::IValue>& inputs, const Run& run, int device)
    : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    if (!v.isTensor()) {
      impl_->static_inputs.push_back(v);
      continue;
    }
    const at::Tensor& t = v.toTensor();
    FJ_CHECK(t.is_cuda() && t.get_device() == device, "CUDA Graphs: input {} is on {}, not cuda:{}", i,
             t.device().str(), device);
    // The same strides as the input (the plan was compiled for them), expanded dims included.
    at::Tensor s = at::empty_strided(t.sizes(), t.strides(), t.options());
    distinct_view(s).copy_(distinct_view(t));
    impl_->static_inputs.emplace_back(s);
  }
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device));
  auto current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  auto side = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
  at::cuda::CUDAEvent ready;
  ready.record(current);
  ready.block(side);
  try {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    run(impl_->static_inputs);  // warm-up
    impl_->graph.capture_begin();
    try {
      impl_->static_outputs = run(impl_->static_inputs);
    } catch (...) {
      try {
        impl_->graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    impl_->graph.capture_end();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    FJ_CHECK(false, "CUDA Graph capture failed: {}", e.what());
  }
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(current);
}

CudaGraphReplay::~CudaGraphReplay() = default;

c10::IValue CudaGraphReplay::replay(const std::vector<c10::IValue>& inputs) {
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(impl_->device));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].isTensor()) continue;
    const at::Tensor& in = inputs[i].toTensor();
    at::Tensor& s = impl_->static_inputs[i].toTensor();
    if (in.data_ptr() != s.data_ptr()) distinct_view(s).copy_(distinct_view(in), /*non_blocking=*/true);
  }
  impl_->graph.replay();
  ++replays_;
  return impl_->static_outputs;
}

}  // namespace fusion_jit
