// The adapter's CUDA side: torch's current stream and CUDA Graph capture and replay of whole plans.
// This header includes no CUDA header; cuda_support.cpp is the one translation unit that does.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fusion_jit {

// CUDA devices torch sees (0 without a driver or a GPU; never throws).
int torch_cuda_device_count();
// torch's current stream on `device` (a cudaStream_t / CUstream).
void* current_cuda_stream(int device);
// Waits for all work on `device`.
void cuda_synchronize(int device);

// A plan captured as one CUDA Graph, replayed at each call.
//
// Capture: the inputs are copied into static buffers owned here; on a side stream the plan runs once
// (warm-up: modules load, the allocator settles), then once under stream capture, with intermediates
// and outputs allocated from the graph's private memory pool. Replay: each tensor input is copied into
// its static buffer unless it is that buffer (the same storage came back), then the graph is launched
// on the current stream and its static outputs are copied into new tensors, which are returned: a
// caller may keep outputs across calls (autograd's saved tensors, a second forward before backward).
// The caller serializes replays (PlanInstance::graph_mu); each replay's stream waits for the previous
// replay's outputs to be copied before it overwrites the static inputs, so threads on different
// streams cannot overwrite each other's inputs.
class CudaGraphReplay {
 public:
  using Run = std::function<c10::IValue(const std::vector<c10::IValue>&)>;
  // Captures `run`; throws fusion_jit::Error saying why when the plan cannot be captured.
  CudaGraphReplay(const std::vector<c10::IValue>& inputs, const Run& run, int device);
  ~CudaGraphReplay();
  c10::IValue replay(const std::vector<c10::IValue>& inputs);
  int64_t replays() const { return replays_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t replays_ = 0;
};

}  // namespace fusion_jit
