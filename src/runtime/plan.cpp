#include "runtime/plan.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "codegen/cpu_printer.h"
#include "codegen/cuda_printer.h"
#include "cost/cost_model.h"
#include "kernels_cache/kernels_cache.h"
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

#ifndef FJ_BUILD_ID
#define FJ_BUILD_ID "unknown"
#endif
constexpr int kPlanFormat = 2;

// Everything a plan holds besides the graph, as JSON: kernels (specs with value ids), steps (a kernel or
// a node's position), what explain shows.
std::string serialize_plan(const ExecutablePlan& p) {
  nlohmann::json j;
  j["format"] = kPlanFormat;
  j["source"] = p.source;
  j["cuda_source"] = p.cuda_source;
  j["cuda_arch"] = p.cuda_arch;
  j["fusion_text"] = p.fusion_text;
  j["num_groups"] = p.num_groups;
  j["group_ops"] = p.group_ops;
  j["fused_ops"] = p.fused_ops;
  j["aten_ops"] = p.aten_ops;
  std::map<const Node*, int> position;
  for (const Node* n : p.graph->nodes()) position.emplace(n, static_cast<int>(position.size()));
  for (const auto& k : p.kernels) {
    nlohmann::json kj{{"name", k.spec.name},   {"group", k.spec.group},  {"cuda", k.spec.device == Device::kCUDA},
                      {"sizes", k.spec.sizes}, {"numel", k.spec.numel},  {"index32", k.spec.index32},
                      {"body", k.spec.body},   {"cuda_work", k.cuda_work}, {"cuda_vector", k.cuda_vector}};
    if (k.spec.is_reduction()) {
      kj["kept_dims"] = k.spec.kept_dims;
      kj["rows"] = k.spec.rows;
      kj["row_len"] = k.spec.row_len;
      kj["row_loads"] = k.spec.row_loads;
      kj["row_prologue"] = k.spec.row_prologue;
      kj["row_stores"] = k.spec.row_stores;
      for (const auto& ps : k.spec.passes) {
        nlohmann::json pj{{"loads", ps.loads}, {"body", ps.body}, {"stores", ps.stores}, {"after", ps.after}};
        pj["accs"] = nlohmann::json::array();
        for (const auto& a : ps.accs) pj["accs"].push_back({a.kind, a.type, a.input});
        kj["passes"].push_back(pj);
      }
    }
    for (const auto& b : k.spec.buffers)
      kj["buffers"].push_back({{"value", b.value->id()}, {"dtype", static_cast<int>(b.dtype)}, {"out", b.is_output},
                               {"strides", b.strides}, {"extent", b.extent}});
    j["kernels"].push_back(kj);
  }
  for (const auto& st : p.steps)
    j["steps"].push_back({{"kernel", st.kernel}, {"node", st.node ? position.at(st.node) : -1}, {"release", st.release}});
  return j.dump();
}

// Fills `p` (whose graph is set) from serialize_plan's text; false when it does not fit the graph.
bool deserialize_plan(const std::string& text, ExecutablePlan* p) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || j.value("format", 0) != kPlanFormat) return false;
  std::vector<Node*> nodes = p->graph->nodes();
  std::map<int, const Value*> values;
  for (const Value* v : p->graph->inputs()) values[v->id()] = v;
  for (const Node* n : nodes)
    for (const Value* v : n->outputs()) values[v->id()] = v;
  p->source = j.at("source").get<std::string>();
  p->cuda_source = j.at("cuda_source").get<std::string>();
  p->cuda_arch = j.at("cuda_arch").get<std::string>();
  p->fusion_text = j.at("fusion_text").get<std::string>();
  p->num_groups = j.at("num_groups").get<int>();
  p->group_ops = j.at("group_ops").get<std::vector<int>>();
  p->fused_ops = j.at("fused_ops").get<int>();
  p->aten_ops = j.at("aten_ops").get<std::map<std::string, int>>();
  for (const auto& kj : j.value("kernels", nlohmann::json::array())) {
    KernelLaunch k;
    k.spec.name = kj.at("name").get<std::string>();
    k.spec.group = kj.at("group").get<int>();
    k.spec.device = kj.at("cuda").get<bool>() ? Device::kCUDA : Device::kCPU;
    k.spec.sizes = kj.at("sizes").get<std::vector<int64_t>>();
    k.spec.numel = kj.at("numel").get<int64_t>();
    k.spec.index32 = kj.at("index32").get<bool>();
    k.spec.body = kj.at("body").get<std::vector<std::string>>();
    k.cuda_work = kj.at("cuda_work").get<int64_t>();
    k.cuda_vector = kj.at("cuda_vector").get<int>();
    if (kj.contains("passes")) {
      k.spec.kept_dims = kj.at("kept_dims").get<int>();
      k.spec.rows = kj.at("rows").get<int64_t>();
      k.spec.row_len = kj.at("row_len").get<int64_t>();
      k.spec.row_loads = kj.at("row_loads").get<std::vector<int>>();
      k.spec.row_prologue = kj.at("row_prologue").get<std::vector<std::string>>();
      k.spec.row_stores = kj.at("row_stores").get<std::vector<std::pair<int, std::string>>>();
      for (const auto& pj : kj.at("passes")) {
        KernelPass ps;
        ps.loads = pj.at("loads").get<std::vector<int>>();
        ps.body = pj.at("body").get<std::vector<std::string>>();
        ps.stores = pj.at("stores").get<std::vector<std::pair<int, std::string>>>();
        ps.after = pj.at("after").get<std::vector<std::string>>();
        for (const auto& a : pj.at("accs")) ps.accs.push_back({a.at(0).get<std::string>(), a.at(1).get<std::string>(), a.at(2).get<std::string>()});
        k.spec.passes.push_back(std::move(ps));
      }
    }
    for (const auto& bj : kj.at("buffers")) {
      auto it = values.find(bj.at("value").get<int>());
      if (it == values.end() || !it->second->is_tensor()) return false;
      KernelBuffer b;
      b.value = it->second;
      b.dtype = static_cast<DType>(bj.at("dtype").get<int>());
      b.is_output = bj.at("out").get<bool>();
      b.strides = bj.at("strides").get<std::vector<int64_t>>();
      b.extent = bj.at("extent").get<int64_t>();
      if (b.dtype != b.value->tensor_type().dtype || b.extent != b.value->tensor_type().extent()) return false;
      k.spec.buffers.push_back(std::move(b));
    }
    p->kernels.push_back(std::move(k));
  }
  for (const auto& sj : j.value("steps", nlohmann::json::array())) {
    ExecStep st;
    st.kernel = sj.at("kernel").get<int>();
    int node = sj.at("node").get<int>();
    if (node >= static_cast<int>(nodes.size()) || st.kernel >= static_cast<int>(p->kernels.size())) return false;
    st.node = node >= 0 ? nodes[node] : nullptr;
    st.release = sj.at("release").get<std::vector<int>>();
    p->steps.push_back(std::move(st));
  }
  return true;
}

// Compiles (or finds in the caches) a deserialized plan's kernels; false when that fails.
bool load_cached_kernels(ExecutablePlan* p) {
  try {
    if (!p->source.empty()) p->library = compile_cpu_source(p->source);
    if (!p->cuda_source.empty()) p->cuda_binary = compile_cuda_source(p->cuda_source, p->cuda_arch);
    for (auto& k : p->kernels)
      if (k.spec.device == Device::kCPU) k.fn = reinterpret_cast<CpuKernelFn>(p->library->symbol(k.spec.name));
    return true;
  } catch (const Error& e) {
    if (Options::get().assert_no_compile) throw;
    log_warn("a cached plan's kernels could not be loaded; building the plan again: {}", e.what());
    return false;
  }
}

std::string plan_cache_key(const Graph& g, const PlanTarget& target, const std::string& cuda_arch) {
  const Options& opt = Options::get();
  const PlantedBugs& bugs = planted_bugs_for_tests();
  std::string flags = fmt::format("fusion={} bugs={}{}{}{}", target.enable_fusion && !opt.is_disabled("fusion"),
                                  bugs.left_aligned_broadcast, bugs.int32_always, bugs.maximum_drops_nan,
                                  bugs.bf16_truncates);
  std::string where = fmt::format("cpu cores {} | eager cpu math {} | cuda {}", host_cpu_description().cores,
                                  eager_cpu_math().key(), cuda_arch);
  return cache_key({"plan", print_graph(g), std::string("fusion_jit build ") + FJ_BUILD_ID, flags, where});
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
  if (target.compile && target.cuda_arch.empty() && !opt.is_disabled("cache")) {
    plan_key = plan_cache_key(*plan->graph, target, on_cuda && cuda_driver_available() ? arch_of_device() : "");
    if (auto text = KernelsCache::instance().get(plan_key)) {
      auto cached = std::make_unique<ExecutablePlan>();
      cached->graph = std::move(plan->graph);
      if (deserialize_plan(*text, cached.get()) && load_cached_kernels(cached.get())) {
        cached->from_plan_cache = true;
        cached->fusion_ms = ms_since(t0);
        return cached;
      }
      plan->graph = std::move(cached->graph);
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
  if (!cpu_specs.empty()) plan->source = print_cpu_source(cpu_specs);
  if (!cuda_specs.empty()) plan->cuda_source = print_cuda_source(cuda_specs);
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
  if (!plan_key.empty() && plan->fallback_groups.empty()) KernelsCache::instance().put(plan_key, serialize_plan(*plan));
  return plan;
}

std::string ExecutablePlan::explain() const {
  std::string s;
  if (graph)
    for (const auto& note : graph->notes()) s += note + "\n";
  s += fusion_text;
  if (from_plan_cache) s += "(plan from the plan cache: fusion and code generation skipped)\n";
  for (const auto& f : fallback_groups) s += "fallback: " + f + " failed to compile and runs through ATen\n";
  for (const auto& k : kernels) {
    const KernelSpec& ks = k.spec;
    if (ks.is_reduction() && ks.device == Device::kCPU)
      s += fmt::format("cpu {}: {} rows of {}, {} pass{}, {}{}\n", ks.name, ks.rows, ks.row_len, ks.passes.size(),
                       ks.passes.size() == 1 ? "" : "es",
                       reduction_is_column(ks) ? "column tiles of 32 rows vectorized across rows"
                                               : "rows over threads, 16 lanes per row",
                       ks.scratch.empty() ? "" : fmt::format(", {} value(s) kept in a scratch row", ks.scratch.size()));
    if (k.spec.device != Device::kCUDA) continue;
    const CudaKernelInfo* info = cuda_binary ? cuda_binary->kernel(k.spec.name) : nullptr;
    if (ks.is_reduction())
      s += fmt::format("cuda {} ({}): {} rows of {}, {} threads per row{}, {}, {} offsets", ks.name, cuda_arch, ks.rows,
                       ks.row_len, cuda_threads_per_row(ks), reduction_is_column(ks) ? " (column tile)" : "",
                       cuda_row_in_registers(ks) ? fmt::format("{} elements per thread in registers", cuda_elements_per_thread(ks))
                                                 : std::string("rows read once per pass"),
                       ks.index32 ? "int32" : "int64");
    else
      s += fmt::format("cuda {} ({}): {} elements, vector width {}, {} offsets", k.spec.name, cuda_arch, k.spec.numel,
                       k.cuda_vector, k.spec.index32 ? "int32" : "int64");
    if (info)
      s += fmt::format(", {} registers, {} B shared, {} B stack, spills {} B stored / {} B loaded", info->registers,
                       info->shared_bytes, info->stack_bytes, info->spill_stores, info->spill_loads);
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

ExecutablePlan::~ExecutablePlan() = default;

const std::vector<void*>& ExecutablePlan::cuda_functions(int device) const {
  std::lock_guard<std::mutex> g(cuda_mu_);
  if (cuda_module_) {
    FJ_CHECK(cuda_module_->device() == device, "a plan compiled for cuda:{} was run on cuda:{}", cuda_module_->device(),
             device);
    return cuda_functions_;
  }
  FJ_INTERNAL_ASSERT(cuda_binary != nullptr, "the plan has no CUDA binary");
  auto module = std::make_unique<CudaModule>(*cuda_binary, device);
  std::vector<void*> fns(kernels.size(), nullptr);
  for (size_t i = 0; i < kernels.size(); ++i)
    if (kernels[i].spec.device == Device::kCUDA) fns[i] = module->function(kernels[i].spec.name);
  cuda_module_ = std::move(module);
  cuda_functions_ = std::move(fns);
  return cuda_functions_;
}

}  // namespace fusion_jit
