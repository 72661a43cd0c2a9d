// The memory plan without torch (runtime/memory_plan.h): peak bytes, the arena's places, and the steps
// whose result takes a dying argument's storage, on plans built from IR text (sources only, no compiler)
// with a table of op facts standing in for the dispatcher's schemas. Every value is f32[16,16] (1 KB)
// unless its type says otherwise, so the expected numbers are counted by hand in kilobytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "driver/build_plan.h"
#include "plan_of.h"
#include "runtime/memory_plan.h"

namespace fusion_jit {
namespace {

constexpr int64_t kKB = 1024;

// Op facts from tables: views, mutating ops and in-place forms by schema. Records what it was asked.
class TableOps : public OpFacts {
 public:
  std::set<std::string> views = {"aten::t", "aten::view"};
  std::set<std::string> mutating = {"aten::add_.Tensor"};
  // test::residual(x, other) computes into other's storage as test::residual_(other, x).
  std::map<std::string, InPlaceForm> forms = {{"test::residual", {"test::residual_", 1}}};
  mutable std::set<std::string> asked;

  bool returns_alias(const Node& n) const override { return ask(n, views); }
  bool may_mutate(const Node& n) const override { return ask(n, mutating); }
  InPlaceForm in_place_form(const Node& n) const override {
    asked.insert(n.schema());
    auto it = forms.find(n.schema());
    return it == forms.end() ? InPlaceForm{} : it->second;
  }

 private:
  bool ask(const Node& n, const std::set<std::string>& table) const {
    asked.insert(n.schema());
    return table.count(n.schema()) > 0;
  }
};

using test_support::plan_of;

// The plan's steps, one word each: "k(%5)" for a kernel writing %5, an ATen step's schema and its first
// output ("aten::mm(%3)"), so that each test first checks the steps it counts on.
std::string steps_of(const ExecutablePlan& p) {
  std::string s;
  for (const ExecStep& st : p.steps) {
    if (!s.empty()) s += " ";
    if (st.kernel >= 0) {
      s += "k(";
      bool first = true;
      for (const KernelBuffer& b : p.kernels[st.kernel].spec.buffers)
        if (b.is_output) {
          s += (first ? "" : ",") + b.value->name();
          first = false;
        }
      s += ")";
    } else {
      s += st.node->schema() + "(" + (st.node->outputs().empty() ? "" : st.node->output()->name()) + ")";
    }
  }
  return s;
}

// The value named `name` ("%3") in the plan's graph.
const Value* value(const ExecutablePlan& p, const std::string& name) {
  for (const Node* n : p.graph->nodes())
    for (const Value* v : n->outputs())
      if (v->name() == name) return v;
  ADD_FAILURE() << "no value " << name;
  return nullptr;
}

int64_t offset_of(const MemoryPlan& m, const ExecutablePlan& p, const std::string& name) {
  return m.offset.at(value(p, name)->id());
}

// Three matrix products in a row: each result is made while the one before is alive, and dies at the
// next product. Eager and the plan (all ATen steps) both peak at two results: 2 KB.
TEST(MemoryPlan, PeakOfAChainIsTwoResults) {
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mm(%0, %1)
  %3 : f32[16,16] = aten::mm(%2, %1)
  %4 : f32[16,16] = aten::mm(%3, %1)
  return (%4)
)";
  TableOps ops;
  auto p = plan_of(ir);
  ASSERT_EQ(steps_of(*p), "aten::mm(%2) aten::mm(%3) aten::mm(%4)");
  EXPECT_EQ(eager_peak_bytes(*p->graph, ops), 2 * kKB);
  EXPECT_EQ(plan_peak_bytes(*p, ops), 2 * kKB);
  // No kernel output: nothing for the arena.
  const MemoryPlan m = plan_memory(*p, ops);
  EXPECT_EQ(m.arena_bytes, 0);
  EXPECT_EQ(m.values, 0);
  EXPECT_EQ(plan_peak_bytes(*p, ops, &m), 2 * kKB);
}

// Eager frees a value nothing reads at once, and counts a view as no bytes of its own: the unread
// product is gone before the next is made, and %3's transpose lives on %3's storage, so the peak is one
// result. With t as an op making a new result (not a view), two.
TEST(MemoryPlan, EagerPeakFreesUnreadValuesAndCountsViewsOnTheirBase) {
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mm(%0, %1)
  %3 : f32[16,16] = aten::mm(%0, %1)
  %4 : f32[16,16] = aten::t(%3)
  return (%3, %4)
)";
  auto g = parse_graph(ir);
  TableOps ops;
  EXPECT_EQ(eager_peak_bytes(*g, ops), 1 * kKB);
  ops.views.clear();
  EXPECT_EQ(eager_peak_bytes(*g, ops), 2 * kKB);
}

// Note [Static memory plan]: x * 2 dies at the first product and the product's result * 3 is made after
// it, so the two kernel outputs share the arena's first kilobyte; the returned result has storage of its
// own. (The kernels writing over the products' results, Note [Kernel results written over a dying input],
// are turned off here: they would leave one intermediate.)
TEST(MemoryPlan, DisjointLifetimesShareTheArena) {
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mul.Scalar(%0, 2.0)
  %3 : f32[16,16] = aten::mm(%2, %1)
  %4 : f32[16,16] = aten::mul.Scalar(%3, 3.0)
  %5 : f32[16,16] = aten::mm(%4, %1)
  %6 : f32[16,16] = aten::add.Scalar(%5, 1.0, 1)
  return (%6)
)";
  TableOps ops;
  auto p = plan_of(ir);
  ASSERT_EQ(steps_of(*p), "k(%2) aten::mm(%3) k(%4) aten::mm(%5) k(%6)");
  const MemoryPlan m = plan_memory(*p, ops, /*in_place=*/false);
  EXPECT_EQ(m.arena_bytes, 1 * kKB);
  EXPECT_EQ(m.values, 2);
  EXPECT_EQ(m.value_bytes, 2 * kKB);
  EXPECT_EQ(offset_of(m, *p, "%2"), 0);
  EXPECT_EQ(offset_of(m, *p, "%4"), 0);
  EXPECT_EQ(offset_of(m, *p, "%6"), -1);  // returned
  // The arena is made at the first placed value's step, let go after the last one is written, and its
  // bytes die with the last placed value (at the second product).
  EXPECT_EQ(m.first_step, 0);
  EXPECT_EQ(m.last_birth, 2);
  EXPECT_EQ(m.last_step, 3);
  // Both products read the arena and promise new results: checked.
  EXPECT_EQ(m.check, (std::vector<bool>{false, true, false, true, false}));
  // Peak: alone, two results at once from the first product on; with the arena (1 KB, steps 0 to 3), the
  // arena and a product.
  EXPECT_EQ(plan_peak_bytes(*p, ops), 2 * kKB);
  EXPECT_EQ(plan_peak_bytes(*p, ops, &m), 2 * kKB);
}

// Places never overlap for values alive at once: each placed value's bytes are apart from those of every
// placed value whose storage is alive at some common step (from its kernel to its release, read here from
// the plan's steps). Four kernel outputs of 1 KB: a (%2) alive to the last but one step, b (%4) to the
// last, c (%6) and d (%8) one after the other while a and b are alive. Placed largest first, then in
// order, a, b and c would take three kilobytes and d c's; but that arena, counted whole from the first
// step to the last, and the last two products hold 5 KB at the last step, where allocating each alone
// never needs more than 4 KB (steps 4 to 7): a, dead at the last step, is taken out, and b, c and d placed
// again, c and d sharing.
TEST(MemoryPlan, PlacesOfValuesAliveAtOnceNeverOverlap) {
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mul.Scalar(%0, 2.0)
  %3 : f32[16,16] = aten::mm(%2, %1)
  %4 : f32[16,16] = aten::mul.Scalar(%3, 3.0)
  %5 : f32[16,16] = aten::mm(%4, %1)
  %6 : f32[16,16] = aten::mul.Scalar(%5, 4.0)
  %7 : f32[16,16] = aten::mm(%6, %1)
  %8 : f32[16,16] = aten::mul.Scalar(%7, 5.0)
  %9 : f32[16,16] = aten::mm(%2, %8)
  %10 : f32[16,16] = aten::mm(%9, %4)
  return (%10)
)";
  TableOps ops;
  auto p = plan_of(ir);
  ASSERT_EQ(steps_of(*p),
            "k(%2) aten::mm(%3) k(%4) aten::mm(%5) k(%6) aten::mm(%7) k(%8) aten::mm(%9) aten::mm(%10)");
  const MemoryPlan m = plan_memory(*p, ops, /*in_place=*/false);
  std::map<const Value*, std::pair<int, int>> life;  // kernel output -> [written, released]
  const int end = static_cast<int>(p->steps.size());
  for (int s = 0; s < end; ++s) {
    const ExecStep& st = p->steps[s];
    if (st.kernel >= 0)
      for (const KernelBuffer& b : p->kernels[st.kernel].spec.buffers)
        if (b.is_output) life[b.value] = {s, end};
    for (const auto& [v, l] : life)
      if (std::count(st.release.begin(), st.release.end(), v->id())) life[v].second = s;
  }
  ASSERT_EQ(life.size(), 4u);
  for (const auto& [a, la] : life) {
    const int64_t at = m.offset[a->id()], bytes = a->tensor_type().extent() * 4;
    if (at < 0) continue;
    EXPECT_EQ(at % 64, 0) << a->name();
    EXPECT_LE(at + bytes, m.arena_bytes) << a->name();
    for (const auto& [b, lb] : life) {
      const int64_t bt = m.offset[b->id()], bb = b->tensor_type().extent() * 4;
      if (b == a || bt < 0 || la.first > lb.second || lb.first > la.second) continue;
      EXPECT_TRUE(at + bytes <= bt || bt + bb <= at)
          << a->name() << " at " << at << " and " << b->name() << " at " << bt << " overlap while both are alive";
    }
  }
  EXPECT_EQ(m.values, 3);
  EXPECT_EQ(m.arena_bytes, 2 * kKB);
  EXPECT_EQ(offset_of(m, *p, "%2"), -1);
  EXPECT_EQ(offset_of(m, *p, "%4"), 0);
  EXPECT_EQ(offset_of(m, *p, "%6"), 1 * kKB);
  EXPECT_EQ(offset_of(m, *p, "%8"), 1 * kKB);
  EXPECT_EQ(plan_peak_bytes(*p, ops), 4 * kKB);
  EXPECT_EQ(plan_peak_bytes(*p, ops, &m), 4 * kKB);
}

// A kernel reads its inputs while it writes its outputs: x * 2, dying at the kernel that adds it to its
// product, and that kernel's output are alive at that step and take different bytes.
TEST(MemoryPlan, AKernelsDyingInputAndItsOutputTakeDifferentBytes) {
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mul.Scalar(%0, 2.0)
  %3 : f32[16,16] = aten::mm(%2, %1)
  %4 : f32[16,16] = aten::add.Tensor(%2, %3, 1)
  %5 : f32[16,16] = aten::mm(%4, %1)
  return (%5)
)";
  TableOps ops;
  auto p = plan_of(ir);
  ASSERT_EQ(steps_of(*p), "k(%2) aten::mm(%3) k(%4) aten::mm(%5)");
  const MemoryPlan m = plan_memory(*p, ops, /*in_place=*/false);
  EXPECT_EQ(m.values, 2);
  EXPECT_EQ(m.arena_bytes, 2 * kKB);
  EXPECT_EQ(offset_of(m, *p, "%2"), 0);
  EXPECT_EQ(offset_of(m, *p, "%4"), 1 * kKB);
  // Alone: x * 2, the product and the sum at step 2; the arena, the product.
  EXPECT_EQ(plan_peak_bytes(*p, ops), 3 * kKB);
  EXPECT_EQ(plan_peak_bytes(*p, ops, &m), 3 * kKB);
}

// A view shares its base's storage, so the base's bytes stay alive while the view is: x * 2 is read
// through its transpose by the last product, after %2 itself died at the transpose, so the product's
// result * 3 cannot share its bytes. Without t as a view (a result of its own) they could.
TEST(MemoryPlan, AViewKeepsItsBasesStorageAlive) {
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mul.Scalar(%0, 2.0)
  %3 : f32[16,16] = aten::t(%2)
  %4 : f32[16,16] = aten::mm(%0, %1)
  %5 : f32[16,16] = aten::mul.Scalar(%4, 3.0)
  %6 : f32[16,16] = aten::mm(%3, %5)
  return (%6)
)";
  TableOps ops;
  auto p = plan_of(ir);
  ASSERT_EQ(steps_of(*p), "k(%2) aten::t(%3) aten::mm(%4) k(%5) aten::mm(%6)");
  const MemoryPlan m = plan_memory(*p, ops, /*in_place=*/false);
  EXPECT_EQ(m.values, 2);
  EXPECT_EQ(m.arena_bytes, 2 * kKB);
  EXPECT_EQ(offset_of(m, *p, "%2"), 0);
  EXPECT_EQ(offset_of(m, *p, "%5"), 1 * kKB);
  EXPECT_EQ(offset_of(m, *p, "%3"), -1);  // a view is not placed: it is its base's bytes
  EXPECT_EQ(m.last_step, 4);               // %2's bytes die with %3, at the last product
  // The view does not promise new results: not checked; the last product reads the arena: checked.
  EXPECT_EQ(m.check, (std::vector<bool>{false, false, false, false, true}));
  // Peak: the arena (2 KB) and the first product, or the arena and the last.
  EXPECT_EQ(plan_peak_bytes(*p, ops, &m), 3 * kKB);

  TableOps no_views;
  no_views.views.clear();
  const MemoryPlan apart = plan_memory(*p, no_views, /*in_place=*/false);
  EXPECT_EQ(apart.arena_bytes, 1 * kKB);
  EXPECT_EQ(offset_of(apart, *p, "%2"), 0);
  EXPECT_EQ(offset_of(apart, *p, "%5"), 0);
}

// Outputs, and storages an op may mutate, stay out of the arena: x * 2 changed in place by add_ keeps
// storage of its own; with add_ not mutating it would be placed.
TEST(MemoryPlan, MutatedValuesAndOutputsAreNotPlaced) {
  const char* ir = R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mul.Scalar(%0, 2.0)
  %3 : f32[16,16] = aten::add_.Tensor(%2, %1, 1)
  %4 : f32[16,16] = aten::mm(%3, %1)
  %5 : f32[16,16] = aten::relu(%4)
  return (%5)
)";
  TableOps ops;
  auto p = plan_of(ir);
  ASSERT_EQ(steps_of(*p), "k(%2) aten::add_.Tensor(%3) aten::mm(%4) k(%5)");
  const MemoryPlan m = plan_memory(*p, ops, /*in_place=*/false);
  EXPECT_EQ(m.arena_bytes, 0);
  EXPECT_EQ(offset_of(m, *p, "%2"), -1);
  EXPECT_EQ(offset_of(m, *p, "%5"), -1);
  TableOps pure;
  pure.mutating.clear();
  const MemoryPlan placed = plan_memory(*p, pure, /*in_place=*/false);
  EXPECT_EQ(placed.arena_bytes, 1 * kKB);
  EXPECT_EQ(offset_of(placed, *p, "%2"), 0);
  EXPECT_EQ(offset_of(placed, *p, "%5"), -1);
  // An op without alias annotation may return its input (type_as, dropout): where its result is mutated
  // later, its input is taken as that result's alias, and stays out of the arena too.
  auto q = plan_of(R"(graph(%0 : f32[16,16], %1 : f32[16,16]):
  %2 : f32[16,16] = aten::mul.Scalar(%0, 2.0)
  %3 : f32[16,16] = test::maybe_same(%2)
  %4 : f32[16,16] = aten::add_.Tensor(%3, %1, 1)
  %5 : f32[16,16] = aten::mm(%4, %1)
  return (%5)
)");
  ASSERT_EQ(steps_of(*q), "k(%2) test::maybe_same(%3) aten::add_.Tensor(%4) aten::mm(%5)");
  EXPECT_EQ(offset_of(plan_memory(*q, ops, /*in_place=*/false), *q, "%2"), -1);
  EXPECT_EQ(offset_of(plan_memory(*q, pure, /*in_place=*/false), *q, "%2"), 0);
}

// Note [Results written into a dying argument]: test::residual(x, other) takes other's storage where
// other dies at the step, is read once by it, has the result's type, and was made within the call with
// no other value on its storage. The step's other then counts once: the peak is one result, not two.
TEST(MemoryPlan, InPlaceOnlyIntoADyingArgumentOfTheResultsType) {
  TableOps ops;
  const std::string head = "graph(%0 : f32[16,16], %1 : f32[16,16]):\n  %2 : f32[16,16] = aten::mm(%0, %1)\n";
  struct Case {
    std::string body;
    int chosen;  // MemoryPlan::in_place of the residual step
    const char* why;
  } cases[] = {
      {"  %3 : f32[16,16] = test::residual(%0, %2)\n  return (%3)\n", 1, "other dies here"},
      {"  %3 : f32[16,16] = test::residual(%2, %0)\n  return (%3)\n", -1, "other is a graph input"},
      {"  %3 : f32[16,16] = test::residual(%0, %2)\n  return (%3, %2)\n", -1, "other is returned"},
      {"  %3 : f32[16,16] = test::residual(%0, %2)\n  %4 : f32[16,16] = aten::mm(%2, %3)\n  return (%4)\n", -1,
       "other is read later"},
      {"  %3 : f32[16,16] = test::residual(%2, %2)\n  return (%3)\n", -1, "other is read twice by the step"},
      {"  %3 : f16[16,16] = test::residual(%0, %2)\n  return (%3)\n", -1, "another dtype"},
      {"  %3 : f32[16,8] = test::residual(%0, %2)\n  return (%3)\n", -1, "other sizes"},
      {"  %3 : f32[16,16] = aten::t(%2)\n  %4 : f32[16,16] = test::residual(%0, %3)\n  return (%4, %2)\n", -1,
       "other is a view of a value still alive"},
      {"  %3 : f32[16,16] = aten::mm(%0, %2)\n  return (%3)\n", -1, "no in-place form"},
  };
  for (const Case& c : cases) {
    auto p = plan_of(head + c.body);
    const int step = static_cast<int>(p->steps.size()) - 1;  // the last step is the one asked about
    ASSERT_EQ(p->steps[step].kernel, -1) << c.why << ": " << steps_of(*p);
    const MemoryPlan m = plan_memory(*p, ops);
    for (size_t s = 0; s < m.in_place.size(); ++s)
      EXPECT_EQ(m.in_place[s], static_cast<int>(s) == step ? c.chosen : -1) << c.why << ", step " << s;
  }
  auto p = plan_of(head + cases[0].body);
  const MemoryPlan written = plan_memory(*p, ops), apart = plan_memory(*p, ops, /*in_place=*/false);
  EXPECT_EQ(apart.in_place, (std::vector<int>{-1, -1}));
  EXPECT_EQ(plan_peak_bytes(*p, ops, &written), 1 * kKB);
  EXPECT_EQ(plan_peak_bytes(*p, ops, &apart), 2 * kKB);
  // Another input index of the form is followed: test::residual writing into its first argument.
  ops.forms["test::residual"] = {"test::residual_", 0};
  auto first = plan_of(head + "  %3 : f32[16,16] = test::residual(%2, %0)\n  return (%3)\n");
  EXPECT_EQ(plan_memory(*first, ops).in_place, (std::vector<int>{-1, 0}));
}

// Note [Kernel results written over a dying input]: a pointwise kernel whose input is an ATen result
// dying there, of the output's type, writes over it; not over a graph input, a result still read or
// returned, or one of another dtype.
TEST(MemoryPlan, KernelsWriteOverADyingAtenResult) {
  TableOps ops;
  const std::string head = "graph(%0 : f32[16,16], %1 : f32[16,16]):\n  %2 : f32[16,16] = aten::mm(%0, %1)\n";
  struct Case {
    std::string body;
    bool over;
    const char* why;
  } cases[] = {
      {"  %3 : f32[16,16] = aten::relu(%2)\n  return (%3)\n", true, "the product dies at the kernel"},
      {"  %3 : f32[16,16] = aten::relu(%2)\n  return (%3, %2)\n", false, "the product is returned"},
      {"  %3 : f32[16,16] = aten::relu(%2)\n  %4 : f32[16,16] = aten::mm(%3, %2)\n  return (%4)\n", false,
       "the product is read later"},
      {"  %3 : f32[16,16] = aten::relu(%0)\n  %4 : f32[16,16] = aten::mm(%3, %2)\n  return (%4)\n", false,
       "a graph input"},
      {"  %3 : f64[16,16] = aten::to.dtype(%2, 7, False, False, None)\n  return (%3)\n", false,
       "another dtype"},
  };
  for (const Case& c : cases) {
    auto p = plan_of(head + c.body);
    int kernel_step = -1;
    for (size_t s = 0; s < p->steps.size(); ++s)
      if (p->steps[s].kernel >= 0) kernel_step = static_cast<int>(s);
    ASSERT_GE(kernel_step, 0) << c.why << ": " << steps_of(*p);
    const MemoryPlan m = plan_memory(*p, ops);
    const auto& pairs = m.kernel_in_place.at(kernel_step);
    EXPECT_EQ(pairs.empty(), !c.over) << c.why;
    if (!c.over || pairs.empty()) continue;
    const auto& buffers = p->kernels[p->steps[kernel_step].kernel].spec.buffers;
    ASSERT_EQ(pairs.size(), 1u);
    EXPECT_EQ(buffers[pairs[0].first].value->name(), "%3") << c.why;
    EXPECT_EQ(buffers[pairs[0].second].value->name(), "%2") << c.why;
    EXPECT_EQ(written_over(buffers, &pairs, pairs[0].first), &buffers[pairs[0].second]);
    EXPECT_EQ(written_over(buffers, &pairs, pairs[0].second), nullptr);
    EXPECT_EQ(plan_peak_bytes(*p, ops, &m), 1 * kKB) << c.why;
    EXPECT_EQ(plan_memory(*p, ops, /*in_place=*/false).kernel_in_place.at(kernel_step).size(), 0u);
  }
}

// The op facts are asked about ATen ops only: never a constant or a list, which the plan knows itself
// (a list shares its elements' storage; a constant is not the call's to count).
TEST(MemoryPlan, OpFactsAreAskedAboutAtenOpsOnly) {
  const char* ir = R"(graph(%0 : f32[16,16]):
  %1 : f32[16,16] = fj::constant(0)
  %2 : Tensor[] = prim::ListConstruct(%0, %1)
  %3 : f32[32,16] = test::concat(%2)
  %4 : f32[32,16] = aten::relu(%3)
  return (%4)
)";
  TableOps ops;
  auto p = plan_of(ir);
  ASSERT_EQ(steps_of(*p), "fj::constant(%1) prim::ListConstruct(%2) test::concat(%3) k(%4)");
  EXPECT_EQ(eager_peak_bytes(*p->graph, ops), 4 * kKB);  // test::concat's and relu's results
  const MemoryPlan m = plan_memory(*p, ops);
  EXPECT_EQ(plan_peak_bytes(*p, ops, &m), 2 * kKB);  // relu writes over test::concat's result
  EXPECT_EQ(ops.asked, (std::set<std::string>{"test::concat", "aten::relu"}));
}

// TableOpFacts: the op table answers for its ops (views and reshape alias, nothing mutates), the other
// facts for the rest, and every in-place form.
TEST(MemoryPlan, TheOpTableAnswersForItsOpsAndAsksOthersOfTheRest) {
  auto g = parse_graph(R"(graph(%0 : f32[4,4], %1 : f32[4,4]):
  %2 : f32[4,4] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[16] = aten::view(%2, [16])
  %4 : f32[4,4] = aten::reshape(%2, [4,4])
  %5 : f32[4,4] = test::residual(%0, %1)
  %6 : f32[4,4] = aten::add_.Tensor(%5, %1, 1)
  return (%3, %4, %6)
)");
  TableOps others;
  others.views.insert("aten::add.Tensor");  // wrong on purpose: the table's answer wins
  const TableOpFacts facts(others);
  const std::vector<Node*> n = g->nodes();
  EXPECT_FALSE(facts.returns_alias(*n[0]));
  EXPECT_TRUE(facts.returns_alias(*n[1]));
  EXPECT_TRUE(facts.returns_alias(*n[2]));
  for (int i : {0, 1, 2}) EXPECT_FALSE(facts.may_mutate(*n[i]));
  EXPECT_TRUE(others.asked.empty()) << "asked of a table op";
  EXPECT_FALSE(facts.returns_alias(*n[3]));
  EXPECT_TRUE(facts.may_mutate(*n[4]));
  EXPECT_EQ(facts.in_place_form(*n[3]).schema, std::string("test::residual_"));
  EXPECT_EQ(others.asked, (std::set<std::string>{"test::residual", "aten::add_.Tensor"}));
}

}  // namespace
}  // namespace fusion_jit
