#include "driver/build_plan.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>

#include "codegen/cuda/cuda_printer.h"
#include "codegen/target.h"
#include "cost/cost_model.h"
#include "driver/plan_cache.h"
#include "runtime/cuda_driver.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool graph_on_cuda(const Graph& g, int* index) {
  auto on = [&](const Value* v) {
    if (!v->is_tensor() || v->tensor_type().device != Device::kCUDA) return false;
    *index = v->tensor_type().device_index;
    return true;
  };
  for (const Value* v : g.inputs())
    if (on(v)) return true;
  for (const Node* n : g.nodes())
    for (const Value* v : n->outputs())
      if (on(v)) return true;
  return false;
}

}  // namespace

std::unique_ptr<ExecutablePlan> build_plan(std::unique_ptr<Graph> graph, const PlanTarget& target) {
  const Options& opt = Options::get();
  auto plan = std::make_unique<ExecutablePlan>();
  plan->graph = std::move(graph);
  auto t0 = std::chrono::steady_clock::now();
  int cuda_index = 0;
  const bool on_cuda = graph_on_cuda(*plan->graph, &cuda_index);
  // The architecture of the graph's GPU, asked of the driver once (throws without one).
  std::string device_arch;
  auto arch_of_device = [&]() -> const std::string& {
    if (device_arch.empty()) {
      CudaDeviceInfo info = cuda_device_info(cuda_index);
      device_arch = cuda_arch_for(info.major, info.minor);
    }
    return device_arch;
  };
  // The plan cache: the JIT path only (AOT plans and tools set an arch or skip compiling).
  std::string plan_key;
  // Plans built while a test's kernel hooks are set are not cached (Note [Kernel hooks]).
  if (target.compile && target.cuda_arch.empty() && !opt.is_disabled("cache") && kernel_hooks().empty()) {
    plan_key = plan_cache_key(*plan->graph, target, on_cuda && cuda_driver_available() ? arch_of_device() : "");
    if (auto cached = find_cached_plan(plan_key, &plan->graph)) {
      cached->from_plan_cache = true;
      cached->fusion_ms = ms_since(t0);
      return cached;
    }
  }
  RooflineCostModel cost(on_cuda ? cuda_gpu_description() : host_cpu_description());
  plan->fusion = plan_fusion(*plan->graph, cost, target.enable_fusion && !opt.is_disabled("fusion"));
  plan->fusion_ms = ms_since(t0);
  plan->fusion_text = explain_plan(plan->fusion);
  plan->num_groups = static_cast<int>(plan->fusion.groups.size());
  if (opt.dumps("plan")) std::fprintf(stderr, "== fusion plan ==\n%s", explain_plan(plan->fusion).c_str());

  t0 = std::chrono::steady_clock::now();
  std::vector<KernelSpec> cpu_specs, cuda_specs;
  for (const auto& g : plan->fusion.groups) {
    KernelSpec k = make_kernel_spec(g);
    (k.device == Device::kCUDA ? cuda_specs : cpu_specs).push_back(std::move(k));
  }
  if (!cpu_specs.empty()) plan->source = target_for(Device::kCPU).print_source(cpu_specs);
  if (!cuda_specs.empty()) plan->cuda_source = target_for(Device::kCUDA).print_source(cuda_specs);
  plan->codegen_ms = ms_since(t0);
  if (opt.dumps("source") && !plan->source.empty())
    std::fprintf(stderr, "== generated source ==\n%s", plan->source.c_str());
  if (opt.dumps("source") && !plan->cuda_source.empty())
    std::fprintf(stderr, "== generated CUDA source ==\n%s", plan->cuda_source.c_str());

  // Compiles one target's kernels; on failure their groups run through ATen, with a warning.
  auto compile_or_fall_back = [&](std::vector<KernelSpec>& specs, const char* what, auto compile) {
    if (specs.empty()) return false;
    try {
      compile();
      return true;
    } catch (const Error& e) {
      if (opt.assert_no_compile) throw;
      std::string names;
      for (const auto& s : specs) names += (names.empty() ? "" : ", ") + s.name;
      log_warn("compiling fused {} kernels failed; groups {} run through ATen instead: {}", what, names, e.what());
      for (const auto& s : specs) plan->fallback_groups.push_back(s.name);
      return false;
    }
  };
  std::vector<int> kernel_of_group(plan->fusion.groups.size(), -1);
  auto add_kernel = [&](KernelSpec&& s, CpuKernelFn fn) {
    KernelLaunch k;
    k.fn = fn;
    if (s.device == Device::kCUDA) {
      k.cuda_work = cuda_work_items(s);
      k.cuda_vector = cuda_vector_width(s);
    }
    kernel_of_group[s.group] = static_cast<int>(plan->kernels.size());
    k.spec = std::move(s);
    plan->kernels.push_back(std::move(k));
  };
  if (!target.compile) {
    for (auto* specs : {&cpu_specs, &cuda_specs})
      for (auto& s : *specs) add_kernel(std::move(s), nullptr);
    cpu_specs.clear();
    cuda_specs.clear();
  }
  if (compile_or_fall_back(cpu_specs, "CPU", [&] {
        plan->library = compile_cpu_source(plan->source);
        plan->compile_ms += plan->library->compile_ms();
      })) {
    for (auto& s : cpu_specs) {
      // A library without one kernel's function (a damaged or foreign object that loaded) costs that
      // group only: it runs through ATen.
      CpuKernelFn fn = nullptr;
      try {
        fn = reinterpret_cast<CpuKernelFn>(plan->library->symbol(s.name));
      } catch (const Error& e) {
        if (opt.assert_no_compile) throw;
        log_warn("fused CPU kernel {} is missing from its compiled library; its group runs through ATen: {}", s.name,
                 e.what());
        plan->fallback_groups.push_back(s.name);
        continue;
      }
      add_kernel(std::move(s), fn);
    }
  }
  if (compile_or_fall_back(cuda_specs, "CUDA", [&] {
        plan->cuda_arch = target.cuda_arch.empty() ? arch_of_device() : target.cuda_arch;
        plan->cuda_binary = compile_cuda_source(plan->cuda_source, plan->cuda_arch);
        plan->compile_ms += plan->cuda_binary->compile_ms;
      })) {
    for (auto& s : cuda_specs) add_kernel(std::move(s), nullptr);
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
  for (const auto& k : plan->kernels) plan->group_ops.push_back(static_cast<int>(plan->fusion.groups.at(k.spec.group).nodes.size()));
  for (size_t id = 0; id < last_use.size(); ++id)
    if (last_use[id] >= 0) plan->steps[last_use[id]].release.push_back(static_cast<int>(id));
  // Plans whose kernels all compiled go into the plan cache.
  if (!plan_key.empty() && plan->fallback_groups.empty()) store_plan(plan_key, *plan);
  return plan;
}

}  // namespace fusion_jit
