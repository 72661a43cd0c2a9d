#include "runtime/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <unordered_map>

#include "support/error.h"

namespace fusion_jit {

std::string ExecutablePlan::explain() const {
  std::string s;
  if (graph)
    for (const auto& note : graph->notes()) s += note + "\n";
  s += fusion_text;
  // Note [Plans of a shape class]
  std::string guard_text;
  for (const SymGuard& g : guards.guards()) guard_text += (guard_text.empty() ? "" : ", ") + g.str();
  if (!bindings.empty()) {
    std::string at;
    for (const auto& [name, value] : bindings) at += fmt::format("{}{}={}", at.empty() ? "" : ", ", name, value);
    s += fmt::format("shape class: the class's plan at {}{}\n", at,
                     guard_text.empty() ? "" : " (its guards: " + guard_text + ")");
  } else if (graph && !graph->symbols().empty()) {
    s += fmt::format("shape class: the plan of every size where {}\n", guard_text.empty() ? "the graph is defined" : guard_text);
  }
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
  if (!bindings.empty())
    s += fmt::format("instantiated in {:.3f} ms from the class's plan (built once: fusion {:.2f} ms, codegen {:.2f} ms, "
                     "compile {:.1f} ms)\n", instance_ms, fusion_ms, codegen_ms, compile_ms);
  else if (from_plan_cache)
    s += fmt::format("plan cache {:.2f} ms (lookup and kernels loaded)\n", fusion_ms);
  else
    s += fmt::format("fusion {:.2f} ms, codegen {:.2f} ms, compile {:.1f} ms\n", fusion_ms, codegen_ms, compile_ms);
  return s;
}

std::unique_ptr<ExecutablePlan> instantiate_plan(const ExecutablePlan& cls, const SymBindings& bindings) {
  FJ_INTERNAL_ASSERT(cls.guards.holds(bindings), "a plan instantiated where its guards do not hold");
  const auto t0 = std::chrono::steady_clock::now();
  auto p = std::make_unique<ExecutablePlan>();
  p->graph = concretize(*cls.graph, bindings);
  // The class's values and nodes to the instance's: concretize clones in order.
  const Graph& from = *cls.graph;
  const Graph& to = *p->graph;
  std::vector<const Value*> value_of(from.num_value_ids(), nullptr);
  std::unordered_map<const Node*, const Node*> node_of;
  for (size_t i = 0; i < from.inputs().size(); ++i) value_of[from.inputs()[i]->id()] = to.inputs()[i];
  const std::vector<Node*> from_nodes = from.nodes(), to_nodes = to.nodes();
  FJ_INTERNAL_ASSERT(from_nodes.size() == to_nodes.size(), "concretize changed the number of nodes");
  for (size_t j = 0; j < to_nodes.size(); ++j) {
    const Node* c = from_nodes[j];
    const Node* n = to_nodes[j];
    node_of.emplace(c, n);
    for (size_t i = 0; i < c->outputs().size(); ++i) value_of[c->outputs()[i]->id()] = n->outputs()[i];
  }
  auto value = [&](const Value* v) {
    const Value* out = v ? value_of.at(v->id()) : nullptr;
    FJ_INTERNAL_ASSERT(!v || out, "the class's plan reads {}, which its graph lacks", v->name());
    return out;
  };
  p->kernels = cls.kernels;
  for (KernelLaunch& k : p->kernels) {
    evaluate_numbers(&k.spec, bindings);
    for (KernelBuffer& b : k.spec.buffers) b.value = value(b.value);
  }
  p->steps = cls.steps;
  for (ExecStep& st : p->steps) {
    if (st.node) st.node = node_of.at(st.node);
    for (int& id : st.release) id = value_of.at(id)->id();
  }
  for (const TargetCode& c : cls.code) {
    TargetCode& t = p->code.emplace_back();
    t.target = c.target;
    t.arch = c.arch;
    t.source = c.source;
    t.artifact = c.artifact;
    t.kernels = c.kernels;  // `loaded` is the instance's own: loaded kernels hold their arguments
  }
  p->fallback_groups = cls.fallback_groups;
  p->aten_ops = cls.aten_ops;
  p->fused_ops = cls.fused_ops;
  p->num_groups = cls.num_groups;
  p->group_ops = cls.group_ops;
  p->fusion_text = cls.fusion_text;
  p->from_plan_cache = cls.from_plan_cache;
  p->code_class = cls.code_class;
  p->fusion_ms = cls.fusion_ms;
  p->codegen_ms = cls.codegen_ms;
  p->compile_ms = cls.compile_ms;
  p->guards = cls.guards;
  p->bindings = bindings;
  p->instance_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return p;
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
