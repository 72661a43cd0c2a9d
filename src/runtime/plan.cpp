#include "runtime/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "support/error.h"

namespace fusion_jit {

std::string ExecutablePlan::explain() const {
  std::string s;
  if (graph)
    for (const auto& note : graph->notes()) s += note + "\n";
  s += fusion_text;
  if (from_plan_cache) s += "(plan from the plan cache: fusion and code generation skipped)\n";
  for (const auto& f : fallback_groups) s += "fallback: " + f + " failed to compile and runs through ATen\n";
  for (const auto& k : kernels) {
    const TargetCode& c = code.at(k.code);
    std::string line = c.target->explain_kernel(k.spec, c.artifact.get(), c.arch);
    if (!line.empty()) s += line + "\n";
  }
  // Note [Sizes as kernel arguments]: which kernels read their sizes, and the values this signature passes.
  int with_args = 0;
  for (const auto& k : kernels) with_args += !k.spec.args.empty();
  if (with_args > 0) {
    s += fmt::format("sizes as arguments ({} of {} kernels; code class {}):", with_args, kernels.size(), code_class);
    for (const auto& k : kernels)
      if (!k.spec.args.empty()) s += fmt::format(" {} [{}]", k.spec.name, fmt::join(k.spec.args, ","));
    s += "\n";
  }
  s += fmt::format("{} kernel{}, {} fused op{}, {} ATen step{}; ", kernels.size(), kernels.size() == 1 ? "" : "s",
                   fused_ops, fused_ops == 1 ? "" : "s", steps.size() - kernels.size(),
                   steps.size() - kernels.size() == 1 ? "" : "s");
  if (from_plan_cache)
    s += fmt::format("plan cache {:.2f} ms (lookup and kernels loaded)\n", fusion_ms);
  else
    s += fmt::format("fusion {:.2f} ms, codegen {:.2f} ms, compile {:.1f} ms\n", fusion_ms, codegen_ms, compile_ms);
  return s;
}

const TargetCode* ExecutablePlan::code_for(Device device) const {
  for (const auto& c : code)
    if (c.target->device() == device) return &c;
  return nullptr;
}

const LoadedKernels& ExecutablePlan::load(const TargetCode& c, int index) const {
  TargetCode::Loaded& l = *c.loaded;
  std::lock_guard<std::mutex> g(l.mu);
  if (l.owner) {
    FJ_CHECK(l.device == index, "a plan whose {} kernels were loaded for {}:{} was run on {}:{}", c.target->name(),
             c.target->name(), l.device, c.target->name(), index);
    return *l.owner;
  }
  FJ_INTERNAL_ASSERT(c.artifact != nullptr, "the plan's {} kernels were not compiled", c.target->name());
  std::vector<const KernelSpec*> specs;
  for (int k : c.kernels) specs.push_back(&kernels.at(k).spec);
  l.owner = c.target->load(c.artifact, specs, index);
  l.device = index;
  l.ready.store(l.owner.get(), std::memory_order_release);
  return *l.owner;
}

}  // namespace fusion_jit
