// The compiler driver: the layer between the runtime and the torch adapter that turns a graph after the
// passes into an ExecutablePlan. This folder owns build_plan (fusion, code generation and compiling
// through each group's target, the per-group fallback to ATen, steps and liveness), the plan cache
// (plan_cache.h) and the plan's JSON form (plan_io.h). The runtime (runtime/) only holds and runs the
// plans built here.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "ir/graph.h"
#include "runtime/plan.h"

namespace fusion_jit {

struct PlanTarget {
  bool enable_fusion = true;  // false: one kernel per fusible node
  // >= 0: that fusion decision made the other way (Note [Decisions measured both ways], fusion.h).
  int refuse_decision = -1;
  // What a target's groups are compiled for, by target name ({"cuda", "sm_90"}); a target not named
  // compiles for its device's architecture, asked of the device (Target::device_arch).
  std::map<std::string, std::string> arch;
  // false: generate the sources only; the plan's kernels carry no binary and cannot run (for tests and
  // tools that compile many plans' kernels together).
  bool compile = true;
  // Print sizes as kernel arguments where the target can (Note [Sizes as kernel arguments]), so that
  // signatures differing only in sizes share compiled kernels.
  bool size_args = false;
  // With size_args false: still print sizes as arguments where every target finds that code compiled
  // already (a restarted process whose first signature is a new size of a class an earlier process
  // compiled), so that no compiler runs.
  bool size_args_if_compiled = false;
  // Null: every plan is built. Else asked, once the plan's code is printed (or read from the plan cache),
  // whether a plan of that code_class may be: when it says no, build_plan throws PlanRefused before
  // any compiler runs (how a model past its specialization limit still serves signatures whose kernels
  // it has compiled, torch/graph_function.h).
  std::function<bool(const std::string& code_class)> admit;
};

// What build_plan throws when PlanTarget::admit refuses the plan's code.
class PlanRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds the plan from a verified graph. Plans of the JIT path (compile, no given arch) are kept in the
// on-disk kernel cache too, keyed by the printed graph, the options that shape the plan, the target and
// the library's build: a warm start with the same graph skips fusion and code generation
// (`from_plan_cache`). `fusion` is empty for such plans; `fusion_text`, `num_groups` and `group_ops` hold
// what is shown of it.
std::unique_ptr<ExecutablePlan> build_plan(std::unique_ptr<Graph> graph, const PlanTarget& target = {});

}  // namespace fusion_jit
