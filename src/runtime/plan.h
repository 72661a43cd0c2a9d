// ExecutablePlan: what runs at each call for one input signature.
//
// Built from a graph after the passes: fusion groups become generated kernels (per target one source per
// plan and one compiler call: C++ by the host compiler for CPU groups, CUDA C++ by NVRTC for GPU
// groups), the other nodes run through ATen. If the kernels fail to compile or load, their
// groups run through ATen with a warning that names them, and the plan counts the fallback. The plan
// also says when each value dies, so that the executor releases intermediates as soon as possible.
// The compiler driver builds plans (driver/build_plan.h); the runtime holds and runs them and calls no
// compiler. A plan still holds types of the layers above it (KernelSpec, FusionPlan, CompiledLibrary,
// CudaBinary).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codegen/kernel_spec.h"
#include "compile/host_compiler.h"
#include "compile/nvrtc.h"
#include "fusion/fusion.h"
#include "runtime/cpu_launch.h"

namespace fusion_jit {

struct KernelLaunch {
  KernelSpec spec;
  CpuKernelFn fn = nullptr;   // CPU kernels
  int64_t cuda_work = 0;      // CUDA kernels: threads with work (cuda_work_items)
  int cuda_vector = 1;        // CUDA kernels: elements per thread on the vector path
};

class CudaModule;

struct ExecStep {
  int kernel = -1;               // index into kernels, or -1
  const Node* node = nullptr;    // an ATen step
  std::vector<int> release;      // value ids dead after this step
};

struct ExecutablePlan {
  std::unique_ptr<Graph> graph;
  FusionPlan fusion;
  std::vector<KernelLaunch> kernels;
  std::vector<ExecStep> steps;
  std::shared_ptr<CompiledLibrary> library;
  std::string source;              // generated C++ (empty when no CPU group)
  std::string cuda_source;         // generated CUDA C++ (empty when no GPU group)
  std::string cuda_arch;           // what it was compiled for
  std::shared_ptr<const CudaBinary> cuda_binary;
  std::vector<std::string> fallback_groups;  // groups run through ATen because compiling failed
  std::map<std::string, int> aten_ops;       // schema -> count of nodes run through ATen per call
  int fused_ops = 0;               // nodes inside kernels
  int num_groups = 0;              // fusion groups
  std::vector<int> group_ops;      // nodes per kernel, by kernel index
  std::string fusion_text;         // explain_plan of the fusion plan
  bool from_plan_cache = false;    // fusion and code generation were skipped (the plan cache had it)
  double codegen_ms = 0, compile_ms = 0, fusion_ms = 0;

  std::string explain() const;
  // The CUDA kernels' handles, by kernel index (nullptr for CPU kernels), loading the binary into the
  // device's context at the first call.
  const std::vector<void*>& cuda_functions(int device) const;
  ExecutablePlan();  // out of line: CudaModule is incomplete here
  ~ExecutablePlan();

 private:
  mutable std::mutex cuda_mu_;
  mutable std::unique_ptr<CudaModule> cuda_module_;
  mutable std::vector<void*> cuda_functions_;
};

}  // namespace fusion_jit
