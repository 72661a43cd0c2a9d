#include "runtime/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
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
  // The generated source's size beside the compile time (0 ms where the kernel cache had the code).
  size_t source_bytes = 0;
  for (const auto& c : code) source_bytes += c.source.size();
  const std::string compile = fmt::format("compile {:.1f} ms of {:.1f} KB of source", compile_ms, source_bytes / 1024.0);
  if (!bindings.empty())
    s += fmt::format("instantiated in {:.3f} ms from the class's plan (built once: fusion {:.2f} ms, codegen {:.2f} ms, "
                     "{})\n", instance_ms, fusion_ms, codegen_ms, compile);
  else if (from_plan_cache)
    s += fmt::format("plan cache {:.2f} ms (lookup and kernels loaded; {:.1f} KB of source)\n", fusion_ms, source_bytes / 1024.0);
  else
    s += fmt::format("fusion {:.2f} ms, codegen {:.2f} ms, {}\n", fusion_ms, codegen_ms, compile);
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
  if (cls.from_plan_cache) {  // numbers from disk: checked at each size
    const std::string why = check_plan_numbers(*p);
    if (!why.empty()) {
      std::string at;
      for (const auto& [name, value] : bindings) at += fmt::format("{}{}={}", at.empty() ? "" : ", ", name, value);
      throw Error(fmt::format("the plan cache's plan of this shape class is not valid at {}: {}", at, why));
    }
  }
  p->instance_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

std::string check_plan_numbers(const ExecutablePlan& p) {
  constexpr int64_t kLimit = int64_t{1} << 48;  // no tensor has that many elements
  for (const KernelLaunch& kl : p.kernels) {
    const KernelSpec& k = kl.spec;
    for (const SymInt& n : k.sizes)
      if (n.hint() < 0 || n.hint() >= kLimit) return fmt::format("kernel {}: a size of {}", k.name, n.hint());
    for (const KernelPiece& pc : k.pieces) {
      // Note [Cats of unequal items]: a piece lies inside its dim, and inside its parent where that splits
      // the same dim.
      if (pc.start.hint() < 0 || pc.start.hint() >= pc.end.hint() || pc.end.hint() > k.sizes.at(pc.dim).hint())
        return fmt::format("kernel {}: a piece [{}, {}) of dim {}", k.name, pc.start.hint(), pc.end.hint(), pc.dim);
      for (int q = pc.parent; q >= 0; q = k.pieces[q].parent) {
        const KernelPiece& up = k.pieces[q];
        if (up.dim == pc.dim && (pc.start.hint() < up.start.hint() || pc.end.hint() > up.end.hint()))
          return fmt::format("kernel {}: a piece outside its parent", k.name);
      }
    }
    for (const KernelBuffer& b : k.buffers) {
      // Every element the kernel reaches lies inside the tensor.
      if (b.offset.hint() < 0 || b.offset.hint() >= kLimit) return fmt::format("kernel {}: an offset of {}", k.name, b.offset.hint());
      bool empty = false;
      double reach = static_cast<double>(b.offset.hint());
      for (size_t d = 0; d < b.strides.size(); ++d) {
        if (b.strides[d].hint() < 0 || b.strides[d].hint() >= kLimit)
          return fmt::format("kernel {}: a stride of {}", k.name, b.strides[d].hint());
        // A piece's buffer is read over the deepest of its pieces that splits the dim, from its start.
        int64_t n = k.sizes.at(d).hint();
        if (b.piece >= 0)
          for (int q : k.piece_path(b.piece))
            if (k.pieces[q].dim == static_cast<int>(d)) n = k.pieces[q].end.hint() - k.pieces[q].start.hint();
        empty |= n == 0;
        reach += static_cast<double>(n - 1) * static_cast<double>(b.strides[d].hint());
      }
      if (b.gather >= 0) {
        if (b.gather_stride.hint() < 0 || b.gather_rows.hint() < 0) return fmt::format("kernel {}: a gathered table", k.name);
        reach += static_cast<double>(std::max<int64_t>(b.gather_rows.hint() - 1, 0)) * static_cast<double>(b.gather_stride.hint());
      }
      if (!empty && reach >= static_cast<double>(b.extent.hint()))
        return fmt::format("kernel {}: a buffer of {} elements reached at element {}", k.name, b.extent.hint(), reach);
    }
  }
  return "";
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
