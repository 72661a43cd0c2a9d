#include "driver/build_plan.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>

#include "codegen/lowering.h"
#include "cost/cost_model.h"
#include "driver/calibrate.h"
#include "driver/plan_cache.h"
#include "driver/predict.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"
#include "targets/targets.h"

namespace fusion_jit {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The devices the graph's tensors live on, each with the index of the first tensor there.
std::map<Device, int> graph_devices(const Graph& g) {
  std::map<Device, int> devices;
  auto add = [&](const Value* v) {
    if (v->is_tensor()) devices.emplace(v->tensor_type().device, v->tensor_type().device_index);
  };
  for (const Value* v : g.inputs()) add(v);
  for (const Node* n : g.nodes())
    for (const Value* v : n->outputs()) add(v);
  return devices;
}

// Note [Sizes as kernel arguments]: the plan's sources name its compiled code.
std::string code_class_of(const std::vector<TargetCode>& code) {
  std::string text;
  for (const auto& c : code) text += fmt::format("{} {}\n", c.target->name(), c.source);
  return text.empty() ? "" : fmt::format("{:016x}", std::hash<std::string>{}(text));
}

void check_admitted(const PlanTarget& target, const std::string& code_class) {
  if (target.admit && !target.admit(code_class))
    throw PlanRefused("its kernels differ from those of every signature compiled before");
}

}  // namespace

std::unique_ptr<ExecutablePlan> build_plan(std::unique_ptr<Graph> graph, const PlanTarget& target) {
  const Options& opt = Options::get();
  install_stored_calibration();  // before the first decision the cost model takes (Note [Calibration])
  auto plan = std::make_unique<ExecutablePlan>();
  plan->graph = std::move(graph);
  // Note [Plans of a shape class]: a class's graph keeps its sizes symbolic through fusion and code
  // generation, its kernels read them as arguments, and its decisions are the current scope's guards.
  const bool symbolic = !plan->graph->symbols().empty();
  ShapeGuards* guards = current_guards();
  FJ_INTERNAL_ASSERT(!symbolic || guards, "a shape class's plan is built with no GuardScope open");
  PlanTarget tgt = target;
  tgt.size_args = tgt.size_args || symbolic;
  auto t0 = std::chrono::steady_clock::now();
  const std::map<Device, int> devices = graph_devices(*plan->graph);
  auto index_on = [&](const Target& t) {
    auto it = devices.find(t.device());
    return it == devices.end() ? 0 : it->second;
  };
  // What each target compiles for: the architecture given, else its device's (asked once; it throws
  // when the device cannot be asked).
  std::map<std::string, std::string> archs = tgt.arch;
  auto arch_of = [&](const Target& t) -> const std::string& {
    auto it = archs.find(t.name());
    if (it == archs.end()) it = archs.emplace(t.name(), t.device_arch(index_on(t))).first;
    return it->second;
  };
  // The plan cache: the JIT path only (AOT plans and tools set an arch or skip compiling).
  std::string plan_key;
  // Plans built while a test's kernel hooks are set are not cached (Note [Kernel hooks]).
  // A class's plan too (Note [Symbolic sizes in the plan cache]).
  if (tgt.compile && tgt.arch.empty() && !opt.is_disabled("cache") && kernel_hooks().empty()) {
    std::string where;
    for (const auto& [device, index] : devices) {
      const Target& t = target_for(device);
      where += fmt::format("{} {} | ", t.name(), t.device_present() ? arch_of(t) : "");
    }
    plan_key = plan_cache_key(*plan->graph, tgt, where);
    if (auto cached = find_cached_plan(plan_key, &plan->graph)) {
      if (symbolic) {  // the stored plan's guards join those this build took so far (its passes')
        for (const SymGuard& g : cached->guards.guards()) {
          guards->set_phase(g.phase);
          guards->add(g);
        }
        cached->guards = *guards;
      }
      cached->code_class = code_class_of(cached->code);
      check_admitted(tgt, cached->code_class);
      cached->from_plan_cache = true;
      cached->fusion_ms = ms_since(t0);
      return cached;
    }
  }
  // The cost model plans for the graph's accelerator when it has one, else for the host.
  const Target* planned = &target_for(Device::kCPU);
  for (const auto& d : devices)
    if (d.first != Device::kCPU) planned = &target_for(d.first);
  RooflineCostModel cost(planned->machine(index_on(*planned)));
  if (symbolic) guards->set_phase("fusion");
  plan->fusion = plan_fusion(*plan->graph, cost, tgt.enable_fusion && !opt.is_disabled("fusion"),
                              !opt.is_disabled("horizontal"), !opt.is_disabled("cat"),
                              !opt.is_disabled("gather"), tgt.refuse_decision);
  plan->fusion_ms = ms_since(t0);
  plan->fusion_text = explain_plan(plan->fusion);
  if (!plan->fusion.groups.empty()) plan->fusion_text += "cost model: " + describe_device(cost.device()) + "\n";
  plan->num_groups = static_cast<int>(plan->fusion.groups.size());
  if (opt.dumps("plan")) std::fprintf(stderr, "== fusion plan ==\n%s", explain_plan(plan->fusion).c_str());

  // Lowering and printing: one source per target, in the order of all_targets().
  t0 = std::chrono::steady_clock::now();
  if (symbolic) guards->set_phase("code generation");
  const auto& targets = all_targets();
  std::vector<std::vector<KernelSpec>> by_target(targets.size());
  for (const auto& g : plan->fusion.groups) {
    const Target& t = target_for(group_device(g));
    const size_t ti = std::find(targets.begin(), targets.end(), &t) - targets.begin();
    by_target[ti].push_back(make_kernel_spec(g, t));
  }
  std::vector<std::vector<KernelSpec>> specs;  // by plan->code index
  for (size_t ti = 0; ti < targets.size(); ++ti) {
    if (by_target[ti].empty()) continue;
    TargetCode c;
    c.target = targets[ti];
    c.source = c.target->print_source(by_target[ti], tgt.size_args || tgt.size_args_if_compiled);
    plan->code.push_back(std::move(c));
    specs.push_back(std::move(by_target[ti]));
  }
  if (!tgt.size_args && tgt.size_args_if_compiled && tgt.compile) {
    bool all = true;
    for (auto& c : plan->code) {
      try {
        all = all && c.target->compiled(c.source, arch_of(*c.target));
      } catch (const Error&) {
        all = false;  // a device that cannot be asked: compiling will say so
      }
    }
    if (!all)  // printed again with literal sizes: what this plan would have been
      for (size_t ci = 0; ci < plan->code.size(); ++ci) plan->code[ci].source = plan->code[ci].target->print_source(specs[ci], false);
  }
  plan->codegen_ms = ms_since(t0);
  plan->code_class = code_class_of(plan->code);
  check_admitted(tgt, plan->code_class);
  if (opt.dumps("source"))
    for (const auto& c : plan->code)
      std::fprintf(stderr, "== generated %s source ==\n%s", c.target->name(), c.source.c_str());

  // Compiling: one compiler call per target. When it fails, or a kernel is missing from what it made,
  // those groups run through ATen, with a warning.
  std::vector<int> kernel_of_group(plan->fusion.groups.size(), -1);
  if (symbolic) guards->set_phase("compiling and steps");
  auto fall_back = [&](const KernelSpec& s) { plan->fallback_groups.push_back(s.name); };
  for (size_t ci = 0; ci < plan->code.size(); ++ci) {
    TargetCode& c = plan->code[ci];
    const Target& t = *c.target;
    if (tgt.compile) {
      try {
        c.arch = arch_of(t);
        c.artifact = t.compile(c.source, c.arch);
        plan->compile_ms += c.artifact->compile_ms();
      } catch (const Error& e) {
        if (opt.assert_no_compile) throw;
        std::string names;
        for (const auto& s : specs[ci]) names += (names.empty() ? "" : ", ") + s.name;
        log_warn("compiling fused {} kernels failed; groups {} run through ATen instead: {}", t.name(), names, e.what());
        for (const auto& s : specs[ci]) fall_back(s);
        continue;
      }
    } else {
      auto it = archs.find(t.name());
      if (it != archs.end()) c.arch = it->second;
    }
    for (auto& s : specs[ci]) {
      if (c.artifact && !c.artifact->has_kernel(s.name)) {
        // A damaged or foreign object that loaded costs that group only.
        FJ_CHECK(!opt.assert_no_compile, "fused {} kernel {} is missing from its compiled library", t.name(), s.name);
        log_warn("fused {} kernel {} is missing from its compiled library; its group runs through ATen", t.name(),
                 s.name);
        fall_back(s);
        continue;
      }
      KernelLaunch k;
      k.code = static_cast<int>(ci);
      k.slot = static_cast<int>(c.kernels.size());
      kernel_of_group[s.group] = static_cast<int>(plan->kernels.size());
      c.kernels.push_back(static_cast<int>(plan->kernels.size()));
      k.calls = kernel_calls(s);
      k.spec = std::move(s);
      plan->kernels.push_back(std::move(k));
    }
  }
  // Steps in fusion order; groups whose kernels are missing expand into their nodes.
  for (const auto& ps : plan->fusion.steps) {
    if (ps.group >= 0 && kernel_of_group[ps.group] >= 0) {
      ExecStep st;
      st.kernel = kernel_of_group[ps.group];
      plan->fused_ops += plan->fusion.groups[ps.group].num_ops();
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
  for (const auto& k : plan->kernels) plan->group_ops.push_back(plan->fusion.groups.at(k.spec.group).num_ops());
  for (size_t id = 0; id < last_use.size(); ++id)
    if (last_use[id] >= 0) plan->steps[last_use[id]].release.push_back(static_cast<int>(id));
  if (symbolic) plan->guards = *guards;
  // Plans whose kernels all compiled go into the plan cache.
  if (!plan_key.empty() && plan->fallback_groups.empty()) store_plan(plan_key, *plan);
  return plan;
}

}  // namespace fusion_jit
