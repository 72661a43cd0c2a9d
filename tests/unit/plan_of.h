// The unit tests' plan of an IR text: parsed, verified, built by build_plan; with `compile` false its
// kernels carry their sources only (no compiler runs).
#pragma once

#include <memory>
#include <string>

#include "driver/build_plan.h"

namespace fusion_jit::test_support {

inline std::unique_ptr<ExecutablePlan> plan_of(const std::string& ir, bool compile = false) {
  auto g = parse_graph(ir);
  verify_graph(*g);
  PlanTarget target;
  target.compile = compile;
  return build_plan(std::move(g), target);
}

}  // namespace fusion_jit::test_support
