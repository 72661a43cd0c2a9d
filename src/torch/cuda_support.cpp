#include "torch/cuda_support.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "support/error.h"
#include "torch/executor.h"

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

struct CudaGraphReplay::Impl {
  at::cuda::CUDAGraph graph;
  std::vector<c10::IValue> static_inputs;
  c10::IValue static_outputs;
  int device = 0;
  // Recorded on the stream of the last replay once its outputs were copied out: the next replay, maybe
  // from another thread on another stream, waits for it before it overwrites the static inputs.
  at::cuda::CUDAEvent last_done;
  bool replayed = false;
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
    impl_->static_inputs.emplace_back(clone_same_layout(t));
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
  // The caller holds the plan's replay lock across this whole function: inputs copied in, graph
  // launched and outputs copied out are queued as one unit, ordered after the previous replay.
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(impl_->device));
  auto stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(impl_->device));
  if (impl_->replayed) impl_->last_done.block(stream);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].isTensor()) continue;
    const at::Tensor& in = inputs[i].toTensor();
    at::Tensor& s = impl_->static_inputs[i].toTensor();
    if (in.data_ptr() != s.data_ptr()) distinct_view(s).copy_(distinct_view(in), /*non_blocking=*/true);
  }
  impl_->graph.replay();
  // The static outputs copied out (on the current stream, after the replay): tensors of the caller's,
  // which the next replay does not overwrite.
  c10::IValue out = map_tensors(impl_->static_outputs, [](const at::Tensor& t) { return t.defined() ? clone_same_layout(t) : t; });
  impl_->last_done.record(stream);
  impl_->replayed = true;
  ++replays_;
  return out;
}

}  // namespace fusion_jit
