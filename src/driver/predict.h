// Each step of a plan with its predicted time (Note [Kernel times], cost/kernel_time.h): the facts the
// time model reads, taken from a kernel's IR (KernelSpec) or an ATen step's node, and the names under
// which `fusion-jit explain --json` and `fusion-jit run --profile N` report a step.
#pragma once

#include <string>
#include <vector>

#include "cost/kernel_time.h"
#include "runtime/plan.h"

namespace fusion_jit {

// A kernel's calls by op class (the pointwise body per element, a piece's body per element of its slice
// as a share of the elements, a reduction's prologue and after-statements per row and its passes' bodies
// and accumulators per element) and each pass's loads; build_plan keeps them with the kernel.
KernelCalls kernel_calls(const KernelSpec& k);
// What the model reads of a kernel: its launch range and row length, each buffer's distinct bytes (the
// elements its strides reach over the iteration space, a gathered table's at one row per element), its
// calls at its sizes, and the rows its later passes read again.
KernelFacts kernel_facts(const KernelSpec& k, const KernelCalls& calls);
// What the model reads of an ATen step: whether it is a view (the op table's views, list ops, a
// contiguous or to.dtype whose result has its input's type), a compute op's flops (GEMMs, convolutions,
// attention) and otherwise its tensor bytes (work.h's node_work).
StepFacts aten_step_facts(const Node& n);

struct StepPrediction {
  size_t step = 0;    // index in ExecutablePlan::steps
  std::string name;   // a kernel's name (fj_kernel_3), or "%ID" of an ATen step's first output
  std::string kind;   // "kernel" or "aten"
  std::string op;     // a kernel's group ("group 3: 8 ops"), an ATen step's schema
  TimePrediction time;
  bool measured = false;  // an ATen step priced by its stored measurement (Note [Measured step times])
};

// The name a plan's step is reported under.
std::string step_name(const ExecutablePlan& p, size_t step);
// Every step that runs at a call (constants excluded), in order, priced on `f`; an ATen step whose
// signature has a stored measurement (driver/step_times.h) by that.
std::vector<StepPrediction> predict_plan(const ExecutablePlan& p, const TimeFigures& f);

}  // namespace fusion_jit
