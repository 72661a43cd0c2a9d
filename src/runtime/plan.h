// ExecutablePlan: what runs at each call for one input signature.
//
// Built from a graph after the passes: fusion groups become generated kernels (per target one source per
// plan and one compiler call, held in the plan's TargetCode), the other nodes run through ATen. If a
// target's kernels fail to compile or load, their groups run through ATen with a warning that names
// them, and the plan counts the fallback. The plan also says when each value dies, so that the executor
// releases intermediates as soon as possible. The compiler driver builds plans (driver/build_plan.h); the
// runtime holds and runs them, through the Target interface (codegen/target.h), and calls no compiler.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codegen/kernel_spec.h"
#include "codegen/target.h"
#include "fusion/fusion.h"

namespace fusion_jit {

// One target's part of a plan: the source of its kernels and what its compiler made of it.
struct TargetCode {
  const Target* target = nullptr;
  std::string arch;                          // what the source is compiled for ("sm_90"; "" for the host)
  std::string source;                        // the generated source of the target's kernels
  std::shared_ptr<const Artifact> artifact;  // null when not compiled (tools) or when compiling failed
  std::vector<int> kernels;                  // the plan's kernels in this code, in load order

  // The kernels loaded for one device at their first call (ExecutablePlan::launch).
  struct Loaded {
    std::mutex mu;
    std::atomic<const LoadedKernels*> ready{nullptr};
    std::unique_ptr<LoadedKernels> owner;
    int device = -1;
  };
  std::shared_ptr<Loaded> loaded = std::make_shared<Loaded>();
};

// What the time model reads of a kernel's code (driver/predict.h, Note [Kernel times]), kept with the plan
// because a plan read from the plan cache has its kernels' source but not their IR: calls by op class per
// element of the iteration space and per row, and the buffers each pass of a reduction loads.
struct KernelCalls {
  std::map<std::string, double> per_element, per_row;
  std::vector<std::vector<int>> pass_loads;
};

struct KernelLaunch {
  KernelSpec spec;
  int code = -1;  // index into ExecutablePlan::code
  int slot = -1;  // position in that code's kernels
  KernelCalls calls;
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
  std::vector<TargetCode> code;    // one per target that has kernels
  std::vector<std::string> fallback_groups;  // groups run through ATen because compiling failed
  std::map<std::string, int> aten_ops;       // schema -> count of nodes run through ATen per call
  int fused_ops = 0;               // nodes inside kernels
  int num_groups = 0;              // fusion groups
  std::vector<int> group_ops;      // nodes per kernel, by kernel index
  std::string fusion_text;         // explain_plan of the fusion plan
  bool from_plan_cache = false;    // fusion and code generation were skipped (the plan cache had it)
  // Names the plan's generated code (its targets' sources): plans with the same share their compiled
  // kernels (Note [Sizes as kernel arguments]); "" when it has none.
  std::string code_class;
  double codegen_ms = 0, compile_ms = 0, fusion_ms = 0;
  // Note [Plans of a shape class]: the conditions on the symbols under which a plan built from a class's
  // graph is valid (none for a plan of numbers), and, for a plan instantiated from one, its symbols' values.
  ShapeGuards guards;
  SymBindings bindings;
  double instance_ms = 0;  // an instance: the time instantiate_plan took

  std::string explain() const;
  // The code of the target of `device`, or nullptr when the plan has no kernel there.
  const TargetCode* code_for(Device device) const;
  // Runs kernel `kernel` over `buffers` (its spec's, in order) on device `index`, loading its target's
  // kernels for that device at the first call. Throws fusion_jit::Error when loading fails or when the
  // kernels were loaded for another device.
  void launch(int kernel, int index, void* const* buffers, const LaunchContext& ctx) const {
    const KernelLaunch& k = kernels[kernel];
    TargetCode::Loaded& l = *code[k.code].loaded;
    const LoadedKernels* ready = l.ready.load(std::memory_order_acquire);
    if (!ready || l.device != index) ready = &load(code[k.code], index);
    ready->launch(static_cast<size_t>(k.slot), buffers, ctx);
  }

 private:
  const LoadedKernels& load(const TargetCode& c, int index) const;
};

// Note [Plans of a shape class]
// A graph of a shape class (Note [Symbolic sizes]) goes through the passes, fusion and code generation
// once, with its kernels reading their sizes as arguments (Note [Sizes as kernel arguments]): the class's
// plan, valid wherever its guards hold. Each size of the class gets its plan from it by evaluation alone:
// the graph's types and literals, each kernel's iteration space, buffers and arguments, at the size's
// bindings. The instance shares the class's compiled code (nothing is printed, compiled or fused again);
// only its kernels are looked up in the loaded code once more, since a loaded kernel holds its arguments.
// What runs per call is then a plan of numbers, as fast as one built for that size, and what the
// instance computes is what the class's plan computes there, which the guards make what a plan built for
// that size would compute.
//
// `cls` must be a class's plan whose guards hold at `bindings` (an InternalError otherwise), and `bindings`
// must give every symbol of its graph.
// An instance of a class's plan read from the plan cache (from_plan_cache) has its numbers checked
// (check_plan_numbers) at its bindings: an Error where they reach outside a tensor.
std::unique_ptr<ExecutablePlan> instantiate_plan(const ExecutablePlan& cls, const SymBindings& bindings);

// Why a plan of numbers could read or write outside a tensor, or "" where it cannot: each kernel's sizes
// and each buffer's strides and offset non-negative and below 2^48, every element a buffer reaches (its
// gathered rows included) inside its tensor's extent, pieces inside their dims and their parents. A plan
// read from disk is checked so before it runs (Note [Symbolic sizes in the plan cache], plan_io.cpp).
std::string check_plan_numbers(const ExecutablePlan& p);

}  // namespace fusion_jit
