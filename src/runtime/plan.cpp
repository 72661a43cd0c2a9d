#include "runtime/plan.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>

#include "codegen/cpu_printer.h"
#include "cost/cost_model.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::unique_ptr<ExecutablePlan> build_plan(std::unique_ptr<Graph> graph, bool enable_fusion) {
  const Options& opt = Options::get();
  auto plan = std::make_unique<ExecutablePlan>();
  plan->graph = std::move(graph);
  auto t0 = std::chrono::steady_clock::now();
  RooflineCostModel cost(host_cpu_description());
  plan->fusion = plan_fusion(*plan->graph, cost, enable_fusion && !opt.is_disabled("fusion"));
  plan->fusion_ms = ms_since(t0);
  if (opt.dumps("plan")) std::fprintf(stderr, "== fusion plan ==\n%s", explain_plan(plan->fusion).c_str());

  t0 = std::chrono::steady_clock::now();
  std::vector<KernelSpec> specs;
  for (const auto& g : plan->fusion.groups) specs.push_back(make_kernel_spec(g));
  if (!specs.empty()) plan->source = print_cpu_source(specs);
  plan->codegen_ms = ms_since(t0);
  if (opt.dumps("source") && !plan->source.empty())
    std::fprintf(stderr, "== generated source ==\n%s", plan->source.c_str());

  bool compiled = false;
  if (!specs.empty()) {
    try {
      plan->library = compile_cpu_source(plan->source);
      plan->compile_ms = plan->library->compile_ms();
      compiled = true;
    } catch (const Error& e) {
      if (opt.assert_no_compile) throw;
      std::string names;
      for (const auto& s : specs) names += (names.empty() ? "" : ", ") + s.name;
      log_warn("compiling fused kernels failed; groups {} run through ATen instead: {}", names, e.what());
      for (const auto& s : specs) plan->fallback_groups.push_back(s.name);
    }
  }
  std::vector<int> kernel_of_group(plan->fusion.groups.size(), -1);
  if (compiled) {
    for (auto& s : specs) {
      KernelLaunch k;
      k.fn = reinterpret_cast<CpuKernelFn>(plan->library->symbol(s.name));
      kernel_of_group[s.group] = static_cast<int>(plan->kernels.size());
      k.spec = std::move(s);
      plan->kernels.push_back(std::move(k));
    }
  }
  // Steps in fusion order; groups whose kernels are missing expand into their nodes.
  for (const auto& ps : plan->fusion.steps) {
    if (ps.group >= 0 && kernel_of_group[ps.group] >= 0) {
      ExecStep st;
      st.kernel = kernel_of_group[ps.group];
      plan->fused_ops += static_cast<int>(plan->fusion.groups[ps.group].nodes.size());
      plan->steps.push_back(st);
    } else if (ps.group >= 0) {
      for (const Node* n : plan->fusion.groups[ps.group].nodes) plan->steps.push_back(ExecStep{-1, n, {}});
    } else {
      plan->steps.push_back(ExecStep{-1, ps.node, {}});
    }
  }
  for (const auto& st : plan->steps)
    if (st.node && !st.node->is_constant()) plan->aten_ops[st.node->schema()]++;
  // Liveness: a value dies after the last step that reads it, unless the graph returns it.
  std::vector<int> last_use(plan->graph->num_value_ids(), -1);
  for (size_t i = 0; i < plan->steps.size(); ++i) {
    const auto& st = plan->steps[i];
    std::vector<const Value*> reads;
    if (st.kernel >= 0) {
      for (const auto& b : plan->kernels[st.kernel].spec.buffers) reads.push_back(b.value);
    } else {
      for (const Value* v : st.node->value_inputs()) reads.push_back(v);
      for (const Value* v : st.node->outputs()) reads.push_back(v);  // unused outputs die at once
    }
    for (const Value* v : reads) last_use[v->id()] = static_cast<int>(i);
  }
  for (const Value* o : plan->graph->outputs()) last_use[o->id()] = -1;
  for (size_t id = 0; id < last_use.size(); ++id)
    if (last_use[id] >= 0) plan->steps[last_use[id]].release.push_back(static_cast<int>(id));
  return plan;
}

std::string ExecutablePlan::explain() const {
  std::string s = explain_plan(fusion);
  for (const auto& f : fallback_groups) s += "fallback: " + f + " failed to compile and runs through ATen\n";
  s += fmt::format("{} kernel{}, {} fused op{}, {} ATen step{}; fusion {:.2f} ms, codegen {:.2f} ms, compile {:.1f} ms\n",
                   kernels.size(), kernels.size() == 1 ? "" : "s", fused_ops, fused_ops == 1 ? "" : "s",
                   steps.size() - kernels.size(), steps.size() - kernels.size() == 1 ? "" : "s", fusion_ms, codegen_ms,
                   compile_ms);
  return s;
}

}  // namespace fusion_jit
