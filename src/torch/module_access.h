// What the ahead-of-time package builder (torch/package.cpp) takes from a CompiledModule: its capture and
// passes, under the module's options. Defined in api.cpp, where CompiledModule::Impl is.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fusion_jit/fusion_jit.h"
#include "support/options.h"
#include "torch/executor.h"

namespace fusion_jit {

struct ModuleAccess {
  // Captures the module on `inputs` and runs the passes (leaving out the module's disabled ones and
  // `skip`); the instance holds the optimized graph in `captured`, no plan. `*result`: eager's result.
  // `to_cuda`: the graph is moved to cuda:0 before the passes, as CompiledModule::compile_cuda moves it.
  static std::unique_ptr<PlanInstance> prepare(CompiledModule& m, const std::vector<c10::IValue>& inputs,
                                               const std::set<std::string>& skip, c10::IValue* result,
                                               bool to_cuda = false);
  static const std::string& name(const CompiledModule& m);
  static bool enable_fusion(const CompiledModule& m);
  static DynamicSizes dynamic(const CompiledModule& m);
  static bool in_place(const CompiledModule& m);  // the module's disable option does not name "in_place"
};

}  // namespace fusion_jit
