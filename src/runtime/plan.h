// ExecutablePlan: what runs at each call for one input signature.
//
// Built from a graph after the passes: fusion groups become generated kernels (one C++ source per plan,
// one host compiler call), the other nodes run through ATen. If the kernels fail to compile or load, their
// groups run through ATen with a warning that names them, and the plan counts the fallback. The plan
// also says when each value dies, so that the executor releases intermediates as soon as possible.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "codegen/kernel_spec.h"
#include "compile/host_compiler.h"
#include "fusion/fusion.h"
#include "runtime/cpu_launch.h"

namespace fusion_jit {

struct KernelLaunch {
  KernelSpec spec;
  CpuKernelFn fn = nullptr;
};

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
  std::string source;              // generated C++ (empty when no group)
  std::vector<std::string> fallback_groups;  // groups run through ATen because compiling failed
  std::map<std::string, int> aten_ops;       // schema -> count of nodes run through ATen per call
  int fused_ops = 0;               // nodes inside kernels
  double codegen_ms = 0, compile_ms = 0, fusion_ms = 0;

  std::string explain() const;
};

// Builds the plan from a verified graph. `enable_fusion` false gives one kernel per fusible node.
std::unique_ptr<ExecutablePlan> build_plan(std::unique_ptr<Graph> graph, bool enable_fusion);

}  // namespace fusion_jit
