// The second size (resized) and the runs through one plan of a batch's shape class at both sizes
// (check_class, Note [The fuzzer's shape classes]).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>

#include "fuzz/fuzz_internal.h"
#include "passes/passes.h"

namespace fusion_jit::fuzz {

// Note [The fuzzer's shape classes]
// With --second-size each batch also runs through one plan of its shape class at two sizes, as the
// torch.compile backend serves a symbolic graph (GraphFunction::add_from_class). The batch's graph is
// replayed at its sizes and at resized()'s, and the two typed graphs differ only in integers: every extent
// that resized() changes becomes a symbol (hint: its first value), and every integer that differs becomes an
// expression over the symbols that gives both values (generalize(), Note [Graphs of two sizes] in
// ir/graph.h). That each graph is the class's graph at its size (is_instance) is checked, so the class's
// graph is right at both sizes by construction, whatever expression fit.
// Its plan is built once, under guards, as add_from_class builds a class (passes, fusion, code generation
// with every size a kernel argument), and instantiated at both sizes (instantiate_plan: numbers evaluated,
// the code shared); each instance runs against eager at its size. A second size that fails a guard of
// the class (the plan decided something on a size there: a dim that merges, an int32 offset bound) is
// checked with a plan of its own instead, as are recipes with in-place ops (torch.compile functionalizes
// them before a class's graph is made; the TorchScript and C++ paths capture each size); the report counts
// both. A recipe with random ops runs through a class of its own, the generator seeded before each eager
// replay and each instance's run as check_batch seeds it, so both draw the same numbers in the same order.

namespace {

// Each extent resized() changes, in place: the inputs' sizes and the sizes a view, reshape or expand names.
template <class F>
void for_each_extent(Recipe& r, F&& f) {
  for (auto& in : r.inputs)
    for (auto& s : in.sizes) f(s);
  for (auto& op : r.ops) {
    // Size lists: a view's, a reshape's and an expand's sizes, a normalization's normalized shape (the
    // input's last dims).
    const bool sizes = op.schema.rfind("aten::view", 0) == 0 || op.schema.rfind("aten::reshape", 0) == 0 ||
                       op.schema.rfind("aten::expand", 0) == 0 || op.schema == "aten::layer_norm" ||
                       op.schema == "aten::rms_norm";
    if (!sizes) continue;
    for (auto& a : op.args)
      if (auto* list = std::get_if<SymSizes>(&a.literal))
        for (auto& s : *list) {
          int64_t e = s.hint();
          f(e);
          s = e;
        }
  }
}

}  // namespace

std::map<int64_t, int64_t> second_extents(const std::vector<Recipe>& batch) {
  std::map<int64_t, int64_t> to;
  if (batch.empty()) return to;
  const uint64_t seed = batch.front().seed;
  for (const Recipe& r : batch)
    for (const auto& in : r.inputs)
      if (in.layout == Layout::kHugeStride) to[2] = 2;  // its two rows (make_input)
  for (Recipe r : batch)
    for_each_extent(r, [&](int64_t& e) {
      if (e >= 2 && !to.count(e)) to[e] = e + 1 + static_cast<int64_t>(mix(seed, static_cast<uint64_t>(e)) % 5);
    });
  for (auto it = to.begin(); it != to.end();) it = it->first == it->second ? to.erase(it) : std::next(it);
  return to;
}

std::vector<Recipe> resized(const std::vector<Recipe>& batch) {
  const std::map<int64_t, int64_t> to = second_extents(batch);
  std::vector<Recipe> out = batch;
  for (Recipe& r : out)
    for_each_extent(r, [&](int64_t& e) {
      auto it = to.find(e);
      if (it != to.end()) e = it->second;
    });
  return out;
}

namespace {

// The recipes `take` may cover, through one class plan; `seeded`: a single recipe with random ops, the
// generator seeded alike before each eager replay and each instance's run.
ClassCheck check_class_of(const std::vector<Recipe>& recipes, std::vector<bool> take, bool seeded, const CheckOptions& co) {
  const size_t n = recipes.size();
  ClassCheck out;
  out.results.resize(n);
  out.covered.assign(n, false);
  const std::vector<Recipe> second = resized(recipes);
  const std::map<int64_t, int64_t> extents = second_extents(recipes);
  BatchRun at[2] = {BatchRun(n), BatchRun(n)};
  for (size_t k = 0; k < n; ++k) {
    if (!take[k]) continue;
    CaseResult ignored;
    take[k] = at[0].eager_ok(recipes[k], k, co, seeded, &ignored) && at[1].eager_ok(second[k], k, co, seeded, &ignored);
  }
  for (size_t k = 0; k < n; ++k)
    if (take[k]) at[0].build(recipes[k], k, seeded), at[1].build(second[k], k, seeded);
  if (at[0].g->outputs().empty()) {
    out.why = "no graph of the batch runs at both sizes";
    return out;
  }
  std::unique_ptr<Graph> g = generalize(*at[0].g, *at[1].g, extents, &out.why);
  if (!g) return out;
  out.class_ir = print_graph(*g);
  out.covered = take;
  auto fail_all = [&](const std::string& msg) {
    for (size_t k = 0; k < n; ++k)
      if (take[k] && out.results[k].ok) out.results[k] = {false, msg};
  };
  const char* which[2] = {"first", "second"};
  ShapeGuards guards;
  std::unique_ptr<ExecutablePlan> cls;
  SymBindings bind[2];
  try {
    GuardScope scope(guards);
    bind[0] = g->symbols();
    for (const auto& [name, hint] : bind[0]) bind[1][name] = extents.at(hint);
    for (int i : {0, 1}) {
      std::string where;
      if (is_instance(*g, bind[i], *at[i].g, &where)) continue;
      fail_all(fmt::format("the class's graph at the {} size is not the batch's graph there: {}", which[i], where));
      return out;
    }
    verify_graph(*g);
    guards.set_phase("passes");
    run_pipeline(*g, nullptr);
    NvrtcCheck nvrtc(*g, co.nvrtc_arch, &out.results, take);
    guards.set_phase("plan");
    PlanTarget target;
    target.size_args = true;  // as for any class's graph
    cls = build_plan(std::move(g), target);
    nvrtc.join();
  } catch (const std::exception& e) {
    fail_all(std::string("building the class's plan failed: ") + e.what());
    return out;
  }
  for (const SymGuard& g : cls->guards.guards()) {
    if (!g.holds(bind[0])) {
      fail_all(fmt::format("the class's guard {} ({}) fails at the sizes it was built at", g.str(), g.phase));
      return out;
    }
    if (!g.holds(bind[1])) {
      out.covered.assign(n, false);
      out.outside = true;
      out.why = fmt::format("the second size fails the class's guard {} ({})", g.str(), g.phase);
      return out;
    }
  }
  for (int i : {0, 1}) {
    at[i].keep_inputs();
    std::vector<CaseResult> res(n);
    try {
      PlanInstance inst;
      inst.captured.output_kind = OutputKind::kTuple;
      inst.plan = instantiate_plan(*cls, bind[i]);
      resolve_aten_steps(inst);
      if (seeded) at::manual_seed(draw_seed(recipes[0].seed));
      at[i].judge_all(i ? second : recipes, take, at[i].run(inst), &res);
    } catch (const std::exception& e) {
      for (size_t k = 0; k < n; ++k)
        if (take[k]) res[k] = {false, std::string("fused run failed: ") + e.what()};
    }
    for (size_t k = 0; k < n; ++k)
      if (take[k] && out.results[k].ok && !res[k].ok)
        out.results[k] = {false, fmt::format("through its class's plan at its {} size: {}", which[i], res[k].message)};
  }
  return out;
}

}  // namespace

ClassCheck check_class(const std::vector<Recipe>& recipes, const CheckOptions& co) {
  // In-place ops never reach a class's graph: torch.compile functionalizes them before the backend sees
  // the graph, and the TorchScript and C++ paths capture each size. A recipe with random ops runs
  // alone, through a class of its own, seeded as check_batch seeds it.
  const size_t n = recipes.size();
  std::vector<bool> together(n, false), alone(n, false);
  for (size_t k = 0; k < n; ++k) {
    if (has_inplace_ops(recipes[k])) continue;
    (has_random_ops(recipes[k]) ? alone : together)[k] = true;
  }
  if (n == 1 && alone[0]) return check_class_of(recipes, alone, /*seeded=*/true, co);
  ClassCheck out = check_class_of(recipes, together, /*seeded=*/false, co);
  for (size_t k = 0; k < n; ++k) {
    if (!alone[k]) continue;
    ClassCheck own = check_class_of({recipes[k]}, {true}, /*seeded=*/true, co);
    out.covered[k] = own.covered[0];
    out.results[k] = own.results[0];
  }
  return out;
}

}  // namespace fusion_jit::fuzz
