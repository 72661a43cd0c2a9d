// Symbolic sizes (Note [Symbolic sizes]): canonical expressions, ranges, guards, the text form.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "ir/graph.h"
#include "ir/sym.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

std::vector<std::string> texts(const ShapeGuards& g) {
  std::vector<std::string> out;
  for (const SymGuard& x : g.guards()) out.push_back(x.str());
  return out;
}

TEST(Sym, ArithmeticIsCanonicalAndCarriesHints) {
  const SymInt s0 = SymInt::symbol("s0", 37), s1 = SymInt::symbol("s1", 5);
  const SymInt a = s0 * 64 + 1, b = 1 + 64 * s0;
  EXPECT_EQ(a.str(), "64*s0+1");
  EXPECT_EQ(a.expr(), b.expr());  // interned: one pointer per expression
  EXPECT_EQ(a.hint(), 37 * 64 + 1);
  EXPECT_EQ(((s0 + 1) * (s0 - 1)).str(), "s0*s0-1");
  EXPECT_EQ((s1 * s0 * 2 - s0 * s1).str(), "s0*s1");
  const SymInt zero = s0 - s0;
  EXPECT_FALSE(zero.is_symbolic());
  EXPECT_EQ(zero.hint(), 0);
  EXPECT_EQ((s0 * 64 + 1).evaluate({{"s0", 3}}), 193);
  EXPECT_EQ((-s0).str(), "-s0");
  EXPECT_THROW((void)(s0 * s1).evaluate({{"s0", 3}}), Error);  // s1 has no value
}

TEST(Sym, DivisionModMinMaxSimplifyWhereExact) {
  const SymInt s0 = SymInt::symbol("s0", 37), s1 = SymInt::symbol("s1", 5);
  EXPECT_EQ(floor_div(4 * s0 + 8, 4).str(), "s0+2");
  const SymInt h = floor_div(s0, 8);
  EXPECT_EQ(h.str(), "(s0//8)");
  EXPECT_EQ(h.hint(), 4);
  EXPECT_EQ(h.evaluate({{"s0", 17}}), 2);
  EXPECT_FALSE(mod(8 * s0, 4).is_symbolic());
  EXPECT_EQ(mod(s0, 8).str(), "(s0%8)");
  EXPECT_EQ(mod(s0, 8).hint(), 5);
  EXPECT_EQ(floor_div(-s0, 8).evaluate({{"s0", 17}}), -3);  // Python's floor
  EXPECT_EQ(floor_div(s0 * s1, s0 * s1).str(), "1");
  // Ranges decide: a symbol is at least 2.
  EXPECT_EQ(sym_max(s0, 1).str(), "s0");
  EXPECT_EQ(sym_min(s0 + 1, s0).str(), "s0");
  const SymInt m = sym_max(s0, s1);
  EXPECT_EQ(m.str(), "max(s0,s1)");
  EXPECT_EQ(m.hint(), 37);
  EXPECT_EQ(m.evaluate({{"s0", 3}, {"s1", 9}}), 9);
}

TEST(Sym, NumbersCompareAsNumbersAtTheEndsOfInt64) {
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(SymInt(hi) > SymInt(-1));
  EXPECT_TRUE(SymInt(lo) < 1);
  EXPECT_FALSE(SymInt(lo) == 1);
  EXPECT_TRUE(SymInt(lo) != SymInt(hi));
  EXPECT_TRUE(hi >= SymInt(lo));
}

TEST(Sym, DecisionsRecordGuardsUnlessRangesDecide) {
  const SymInt s0 = SymInt::symbol("s0", 37), s1 = SymInt::symbol("s1", 5);
  ShapeGuards g;
  GuardScope scope(g);
  EXPECT_FALSE(s0 == 1);           // every symbol is at least 2
  EXPECT_TRUE(s0 * s1 > 1);
  EXPECT_TRUE(s0 + 1 != s0);
  EXPECT_TRUE(64 * s0 == s0 * 64);  // the same expression
  EXPECT_TRUE(g.guards().empty());
  EXPECT_TRUE(s0 != 64);
  EXPECT_TRUE(2 * s0 < 4096);
  EXPECT_TRUE(s1 < s0);
  EXPECT_EQ(texts(g), (std::vector<std::string>{"s0 != 64", "s0 < 2048", "s0-s1 > 0"}));
  EXPECT_TRUE(37 == s0);  // implies s0 != 64 and s0 < 2048, which go
  EXPECT_EQ(texts(g), (std::vector<std::string>{"s0-s1 > 0", "s0 == 37"}));
  EXPECT_TRUE(g.specializes("s0"));
  EXPECT_FALSE(g.specializes("s1"));
  EXPECT_TRUE(g.holds({{"s0", 37}, {"s1", 5}}));
  EXPECT_FALSE(g.holds({{"s0", 38}, {"s1", 5}}));
}

// A negative term covered by a positive multiple of it: 64*s0*s1 >= 128*s0 > 64*s0 for s1 >= 2, so the
// comparison and the max need no guard; the same bound from above decides the other way round. Where
// the cover falls short (s0*s0 - 3*s0 is -2 at s0 = 2, 0 at 3), it is a guard.
TEST(Sym, RangesSeeThroughTermsThatMultiplesCover) {
  const SymInt s0 = SymInt::symbol("s0", 37), s1 = SymInt::symbol("s1", 5);
  ShapeGuards g;
  GuardScope scope(g);
  EXPECT_TRUE(64 * s0 * s1 > 64 * s0);
  EXPECT_TRUE(64 * s0 < 64 * s0 * s1 + 192 * s1);
  EXPECT_TRUE(s0 * s0 >= 2 * s0);
  EXPECT_TRUE(s0 - 1 >= 1);
  EXPECT_EQ(sym_max(64 * s0 * s1 + 192 * s1, 64 * s0 + 192 * s1).str(), "64*s0*s1+192*s1");
  EXPECT_EQ(sym_max(64 * s0 + 192 * s1, 64 * s0 * s1 + 192 * s1).str(), "64*s0*s1+192*s1");
  EXPECT_EQ(sym_max(s0 - 1, 1).str(), "s0-1");
  EXPECT_EQ(sym_min(s0 - 1, 1).str(), "1");
  EXPECT_EQ(sym_abs(1 - s0).str(), "s0-1");
  EXPECT_TRUE(g.guards().empty()) << texts(g).front();
  EXPECT_TRUE(s0 * s0 > 3 * s0);
  EXPECT_EQ(texts(g), (std::vector<std::string>{"3*s0-s0*s0 < 0"}));
}

// A guard implied by one recorded before it is not recorded; those a new guard implies go. Bounds divide
// by their variable part's common factor, so bounds on multiples of one expression compare.
TEST(Sym, GuardsKeepTheTighterBound) {
  const SymInt s0 = SymInt::symbol("s0", 31);
  ShapeGuards g;
  GuardScope scope(g);
  EXPECT_TRUE(s0 <= 40);
  EXPECT_TRUE(s0 < 35);   // tighter: s0 <= 40 goes
  EXPECT_TRUE(s0 != 50);  // implied: not recorded
  EXPECT_TRUE(s0 <= 45);
  EXPECT_EQ(texts(g), (std::vector<std::string>{"s0 < 35"}));
  EXPECT_TRUE(128 * s0 < 2147483647);  // s0 < 16777216: implied
  EXPECT_TRUE(4 * s0 > 7);             // s0 >= 2 decides it
  EXPECT_TRUE(3 * s0 > 91);            // s0 > 30 (3*s0 >= 92, so s0 >= 31)
  EXPECT_EQ(texts(g), (std::vector<std::string>{"s0 < 35", "s0 > 30"}));
  for (int64_t n : {31, 34}) EXPECT_TRUE(g.holds({{"s0", n}})) << n;
  for (int64_t n : {30, 35}) EXPECT_FALSE(g.holds({{"s0", n}})) << n;
  EXPECT_TRUE(256 * s0 - 1000 < 7000);  // 256*s0 <= 7999: s0 < 32
  EXPECT_EQ(texts(g), (std::vector<std::string>{"s0 > 30", "s0 < 32"}));
}

TEST(Sym, ReadingAsANumberSpecializes) {
  const SymInt s0 = SymInt::symbol("s0", 37);
  ShapeGuards g;
  {
    GuardScope scope(g);
    const int64_t n = 2 * s0;  // the implicit conversion of code written for numbers
    EXPECT_EQ(n, 74);
    const int64_t again = 2 * s0;
    EXPECT_EQ(again, 74);
  }
  EXPECT_EQ(texts(g), (std::vector<std::string>{"s0 == 37"}));
  EXPECT_TRUE(g.holds({{"s0", 37}}));
  EXPECT_FALSE(g.holds({{"s0", 36}}));
  // Scopes nest; the innermost records.
  ShapeGuards outer, inner;
  {
    GuardScope a(outer);
    {
      GuardScope b(inner);
      (void)(s0 != 5);
    }
    (void)(s0 != 6);
  }
  EXPECT_EQ(texts(inner), (std::vector<std::string>{"s0 != 5"}));
  EXPECT_EQ(texts(outer), (std::vector<std::string>{"s0 != 6"}));
}

TEST(Sym, ADecisionWithNoScopeIsAnInternalError) {
  const SymInt s0 = SymInt::symbol("s0", 37);
  EXPECT_THROW((void)static_cast<int64_t>(s0), InternalError);
  EXPECT_THROW((void)(s0 < 40), InternalError);
  EXPECT_NO_THROW((void)(s0 == 1));  // decided by the range: no guard needed
  EXPECT_EQ(s0.hint(), 37);          // the hint itself is no decision
  EXPECT_THROW(SymInt::symbol("s9", 1), Error);  // sizes 0 and 1 are not symbols
}

TEST(Sym, ParsesItsOwnText) {
  const SymBindings hints{{"s0", 37}, {"s1", 5}};
  for (const char* text : {"64*s0+1", "(s0//8)", "(s0%8)*s1", "max(s0,s1)", "-3", "s0*s0-1", "-s0+s1"}) {
    size_t pos = 0;
    const SymInt v = parse_sym(text, pos, hints);
    EXPECT_EQ(v.str(), text);
    EXPECT_EQ(pos, std::string(text).size()) << text;
  }
  size_t pos = 0;
  const SymInt v = parse_sym("2 * (s0 + 3) // 2, rest", pos, hints);
  EXPECT_EQ(v.str(), "s0+3");
  EXPECT_EQ(v.hint(), 40);
  EXPECT_EQ(pos, 17u);
  for (const char* bad : {"s2+1", "2*", "(s0", "min(s0)", "s0//0", "#"}) {
    size_t p = 0;
    EXPECT_THROW(parse_sym(bad, p, hints), Error) << bad;
  }
}

TEST(SymGraph, TextRoundTripsAndVerifies) {
  const std::string text =
      "graph[s0=37,s1=5](%0 : f32[2,s0,64], %1 : f32[s1,1,64]{64,64*s1,1}):\n"
      "  %2 : f32[2,s0,64] = aten::relu(%0)\n"
      "  %3 : f32[2,s0]{1,2} = aten::sum.dim_IntList(%2, [2], False, None)\n"
      "  %4 : f32[2,s0,4,16] = aten::view(%2, [2,s0,4,16])\n"
      "  %5 : f32[2,s0-1,4,16]{64*s0,64,16,1} = aten::slice.Tensor(%4, 1, 0, s0-1, 1)\n"
      "  %6 : f32[2,s0-1,4,16] = aten::clamp(%5, -9223372036854775808, 9223372036854775807)\n"
      "  return (%3, %6)\n";
  auto g = parse_graph(text);
  EXPECT_EQ(print_graph(*g), text);
  EXPECT_EQ(g->symbols(), (SymBindings{{"s0", 37}, {"s1", 5}}));
  const TensorType& t = g->inputs()[0]->tensor_type();
  EXPECT_TRUE(t.is_symbolic());
  EXPECT_EQ(t.sym_numel().str(), "128*s0");
  EXPECT_EQ(t.strides.str(), "64*s0,64,1");  // derived from the sizes
  EXPECT_EQ(g->inputs()[1]->tensor_type().strides.str(), "64,64*s1,1");
  EXPECT_NO_THROW(verify_graph(*g));
  EXPECT_EQ(print_graph(*g->clone()), text);
  // At one size: no symbol left, in types or literals.
  const std::string at5 = print_graph(*concretize(*g, {{"s0", 5}, {"s1", 3}}));
  EXPECT_NE(at5.find("graph(%0 : f32[2,5,64], %1 : f32[3,1,64]{64,192,1})"), std::string::npos) << at5;
  EXPECT_NE(at5.find("f32[2,4,4,16]{320,64,16,1} = aten::slice.Tensor(%4, 1, 0, 4, 1)"), std::string::npos) << at5;
  EXPECT_NE(at5.find("aten::view(%2, [2,5,4,16])"), std::string::npos) << at5;
  EXPECT_EQ(at5.find("s0"), std::string::npos) << at5;
  EXPECT_THROW(concretize(*g, {{"s1", 3}}), Error);  // s0 has no value
}

TEST(SymGraph, BadSymbolicTextAndTypesAreRefused) {
  // Sizes 0 and 1 are not symbols; every symbol needs its hint.
  EXPECT_THROW(parse_graph("graph[s0=1](%0 : f32[s0]):\n  return (%0)\n"), Error);
  try {
    parse_graph("graph(%0 : f32[4,s0]):\n  return (%0)\n");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("s0 has no hint"), std::string::npos) << e.what();
  }
  // A type over a symbol the graph does not name, or off its hint, fails verification.
  Graph g;
  TensorType t;
  t.sizes = {SymInt::symbol("s0", 40)};
  t.strides = {1};
  ValueType vt;
  vt.tensor = t;
  g.add_output(g.add_input(vt));
  EXPECT_THROW(verify_graph(g), InternalError);
  g.set_symbol("s0", 37);
  EXPECT_THROW(verify_graph(g), InternalError);
  g.set_symbol("s0", 40);
  EXPECT_NO_THROW(verify_graph(g));
}

TEST(SymGraph, ShapeArithmeticStaysSymbolic) {
  const SymInt s0 = SymInt::symbol("s0", 37), s1 = SymInt::symbol("s1", 5);
  ShapeGuards g;
  GuardScope scope(g);
  EXPECT_EQ(broadcast_shapes({s0, 1, 64}, {s1, 64}).str(), "s0,s1,64");
  EXPECT_EQ(reduced_shape({2, s0, 64}, {1}, true).str(), "2,1,64");
  EXPECT_EQ(reduced_shape({2, s0, 64}, {2}, false).str(), "2,s0");
  EXPECT_EQ(view_shape({2, s0, 64}, {-1, 64}).str(), "2*s0,64");
  EXPECT_EQ(view_shape({2, s0, 64}, {2, s0, 8, -1}).str(), "2,s0,8,8");
  EXPECT_EQ(cat_shape({{s0, 64}, {3, 64}, {s1, 64}}, 0).str(), "s0+s1+3,64");
  EXPECT_EQ(contiguous_strides({2, s0, 64}).str(), "64*s0,64,1");
  EXPECT_EQ(channels_last_strides({s1, 64, s0, s0}).str(), "64*s0*s0,1,64*s0,64");
  EXPECT_TRUE(g.guards().empty());
  // Where the shapes fit at the hints only under a condition, the condition is a guard.
  EXPECT_EQ(broadcast_shapes({s0}, {SymInt::symbol("s2", 37)}).str(), "s0");
  EXPECT_EQ(view_shape({s0 + 1, 6}, {-1, 4}).str(), "((6*s0+6)//4),4");
  EXPECT_EQ(texts(g), (std::vector<std::string>{"s0-s2 == 0", "2*((6*s0+6)//4)-3*s0 == 3"}));
  // Where they do not fit at the hints, an Error names them.
  EXPECT_THROW(broadcast_shapes({s0}, {s1}), Error);
  EXPECT_THROW(view_shape({s0, 6}, {-1, 4}), Error);
  EXPECT_THROW(cat_shape({{s0, 64}, {s0, 32}}, 0), Error);
}

}  // namespace
}  // namespace fusion_jit

#include "codegen/lowering.h"
#include "cost/cost_model.h"
#include "driver/build_plan.h"
#include "fusion/fusion.h"
#include "passes/passes.h"
#include "runtime/plan.h"
#include "targets/cpu/cpu_printer.h"
#include "targets/cuda/nvrtc.h"
#include "targets/targets.h"

namespace fusion_jit {
namespace {

// The transformer-like fragment below at sizes [2, s0, 64], or at [2, n, 64] when concretized.
const char* kFragment =
    "graph[s0=37](%0 : f32[2,s0,64], %1 : f32[64], %w : f32[64,64]):\n"
    "  %2 : f32[2,s0,64] = aten::add.Tensor(%0, %1, 1)\n"
    "  %3 : f32[2,s0,64] = aten::relu(%2)\n"
    "  %4 : f32[2,s0] = aten::sum.dim_IntList(%3, [2], False, None)\n"
    "  %5 : f32[2,s0,64] = aten::softmax.int(%3, 2, None)\n"
    "  %6 : f32[2,s0,64], %7 : f32[2,s0,1], %8 : f32[2,s0,1] = aten::native_layer_norm(%5, [64], %1, %1, 1e-05)\n"
    "  %9 : f32[2,s0,64] = aten::gelu(%6, \"none\")\n"
    "  %10 : f32[2,64,s0]{64*s0,1,64} = aten::transpose.int(%9, 1, 2)\n"
    "  %11 : f32[2,64,s0] = aten::mul.Scalar(%10, 2.0)\n"
    "  %12 : f32[2,s0,64] = aten::matmul(%6, %w)\n"
    "  %13 : f32[2,s0,64] = aten::tanh(%12)\n"
    "  %14 : Tensor[] = prim::ListConstruct(%13, %9)\n"
    "  %15 : f32[2,2*s0,64] = aten::cat(%14, 1)\n"
    "  %16 : f32[2,2*s0,64] = aten::sigmoid(%15)\n"
    "  %17 : f32[2,s0,4,16] = aten::view(%13, [2, s0, 4, 16])\n"
    "  %18 : f32[2,4,s0,16]{64*s0,16,64,1} = aten::transpose.int(%17, 1, 2)\n"
    "  %19 : f32[2,4,s0,16] = aten::exp(%18)\n"
    "  %20 : f32[2,4,s0-1,16]{64*s0-64,16*s0-16,16,1} = aten::slice.Tensor(%19, 2, 1, s0, 1)\n"
    "  %21 : f32[2,4,s0-1,16] = aten::neg(%20)\n"
    "  return (%4, %11, %16, %21)\n";

TEST(SymGraph, ThePassPipelineAndThePlanKeepTheClass) {
  auto g = parse_graph(kFragment);
  ShapeGuards guards;
  GuardScope scope(guards);
  run_pipeline(*g, nullptr);
  // Softmax and layer norm decomposed, the cat moved after the sigmoid, the slice before the exp: every
  // decision held for all s0 (the slice's result, of length s0-1, is dense whatever that length).
  EXPECT_EQ(texts(guards), std::vector<std::string>{});
  const std::string optimized = print_graph(*g);
  EXPECT_NE(optimized.find("aten::amax"), std::string::npos) << optimized;
  EXPECT_NE(optimized.find("f32[2,s0,1] = aten::var.correction"), std::string::npos) << optimized;
  EXPECT_NE(optimized.find("f32[2,4,s0-1,16]{64*s0,16,64,1} = aten::slice.Tensor"), std::string::npos) << optimized;
  EXPECT_NE(optimized.find("f32[2,4,s0-1,16] = aten::exp"), std::string::npos) << optimized;
  // So the class's optimized graph at any size is that size's optimized graph (2: the slice is 1 long).
  for (int64_t n : {37, 2, 3, 4, 64, 1000}) {
    auto concrete = concretize(*parse_graph(kFragment), {{"s0", n}});
    EXPECT_TRUE(concrete->symbols().empty());
    run_pipeline(*concrete, nullptr);
    concrete->renumber();
    EXPECT_EQ(print_graph(*concretize(*g, {{"s0", n}})), print_graph(*concrete)) << "s0 = " << n;
  }
  // Building the plan keeps s0 too: its kernels read their sizes as arguments
  // (SymGraph.KernelsOfTheClassReadTheirSizesAsArguments), and the plan is valid where their int32
  // offsets suffice and the slice is longer than 1 (a dim of size 1 merges away, another source).
  guards.set_phase("build_plan");
  PlanTarget t;
  t.compile = false;
  t.size_args = true;
  auto plan = build_plan(std::move(g), t);
  EXPECT_EQ(texts(guards), (std::vector<std::string>{"s0 < 8388608", "s0 != 2"}));
  EXPECT_FALSE(guards.specializes("s0"));
  EXPECT_EQ(guards.guards().back().phase, "code generation");  // build_plan names its steps
  for (int64_t n : {int64_t{3}, int64_t{37}, int64_t{38}, int64_t{1000}, int64_t{1} << 22}) EXPECT_TRUE(guards.holds({{"s0", n}})) << n;
  for (int64_t n : {int64_t{2}, int64_t{1} << 23}) EXPECT_FALSE(guards.holds({{"s0", n}})) << n;
}

// The pass pipeline's graph of `text`, renumbered; concretized at `b` first where given.
std::unique_ptr<Graph> optimized(const char* text, const SymBindings* b = nullptr) {
  auto g = b ? concretize(*parse_graph(text), *b) : parse_graph(text);
  run_pipeline(*g, nullptr);
  g->renumber();
  return g;
}

// A fusion plan as text with its sizes at `b`: each step, a group's iteration space, nodes (by position),
// inputs, outputs and rows, so that the plan of a class at one size and the plan of that size compare.
std::string plan_at(const Graph& g, const FusionPlan& p, const SymBindings& b) {
  std::map<const Node*, int> index;
  for (const Node* n : g.nodes()) index.emplace(n, static_cast<int>(index.size()));
  auto sizes = [&](const SymSizes& s) {
    std::string out = "[";
    for (const SymInt& x : s) out += std::to_string(x.evaluate(b)) + ",";
    return out + "]";
  };
  std::string s;
  for (const PlanStep& step : p.steps) {
    if (step.group < 0) {
      s += "aten " + std::to_string(index.at(step.node)) + "\n";
      continue;
    }
    const FusionGroup& grp = p.groups[step.group];
    s += "group over " + sizes(grp.shape) + ":";
    for (const Node* n : grp.nodes) s += " " + std::to_string(index.at(n));
    s += "; reads";
    for (const Value* v : grp.inputs) s += " " + v->name();
    s += "; writes";
    for (const Value* v : grp.outputs) s += " " + v->name();
    if (const auto& f = grp.reduction) {
      s += "; rows of " + sizes(f->shape) + " over";
      for (int64_t d : f->dims) s += " " + std::to_string(d);
      s += fmt::format(", {} passes of {}", f->passes, f->row_len.evaluate(b));
    }
    for (const Decision& d : grp.decisions) s += std::string(" ") + (d.fused ? "+" : "-");
    s += "\n";
  }
  return s;
}

// Two symbols, a cat of unequal items (a key/value cache and this step's keys) and reductions over the
// symbolic dim.
const char* kCacheStep =
    "graph[s0=37,s1=5](%0 : f32[s1,s0,64], %1 : f32[s1,3,64], %2 : f32[s1,s0,64]):\n"
    "  %3 : f32[s1,s0,64] = aten::mul.Tensor(%0, %2)\n"
    "  %4 : f32[s1,s0,64] = aten::exp(%3)\n"
    "  %5 : Tensor[] = prim::ListConstruct(%1, %4)\n"
    "  %6 : f32[s1,s0+3,64] = aten::cat(%5, 1)\n"
    "  %7 : f32[s1,s0+3,64] = aten::neg(%6)\n"
    "  %8 : f32[s1,1,64] = aten::amax(%0, [1], True)\n"
    "  %9 : f32[s1,1,64] = aten::sum.dim_IntList(%2, [1], True, None)\n"
    "  %10 : f32[s1,1,64] = aten::add.Tensor(%8, %9, 1)\n"
    "  %11 : f32[s1,s0,64] = aten::sub.Tensor(%0, %8, 1)\n"
    "  return (%7, %10, %11)\n";

TEST(SymGraph, FusionGroupsTheClassAsItGroupsEachSize) {
  RooflineCostModel cost(DeviceDescription{"test-cpu", 40.0, 100.0, 2.0, 0.95, 2});
  // The passes' guards: the cache's items differ in size, so the cat is one of unequal items.
  const std::vector<std::pair<const char*, std::vector<std::string>>> cases = {{kFragment, {}},
                                                                               {kCacheStep, {"s0 != 3"}}};
  for (const auto& [text, pass_guards] : cases) {
    ShapeGuards guards;
    GuardScope scope(guards);
    auto g = optimized(text);
    const SymBindings hints = g->symbols();
    EXPECT_EQ(texts(guards), pass_guards);
    guards.set_phase("fusion");
    const FusionPlan plan = plan_fusion(*g, cost);
    // Fusion decides on shapes that are equal or broadcast for every size, and prices kernels at the
    // hints: it adds no guard, and its groups, iteration spaces and rows stay symbolic.
    EXPECT_EQ(texts(guards), pass_guards);
    ASSERT_GE(plan.groups.size(), 2u);
    bool symbolic = false;
    for (const FusionGroup& grp : plan.groups) symbolic |= grp.shape.is_symbolic();
    EXPECT_TRUE(symbolic);
    EXPECT_NE(explain_plan(plan).find(",s0,"), std::string::npos) << explain_plan(plan);
    // The class's plan at each size is the plan fusion makes for that size's graph.
    for (int64_t n : {37, 2, 4, 63, 1000}) {
      SymBindings b = hints;
      b["s0"] = n;
      ASSERT_TRUE(guards.holds(b)) << "s0 = " << n;
      auto concrete = optimized(text, &b);
      EXPECT_EQ(plan_at(*g, plan, b), plan_at(*concrete, plan_fusion(*concrete, cost), {})) << "s0 = " << n;
    }
  }
}

// The CPU kernels of a fusion plan, printed with their sizes as arguments (Note [Sizes as kernel
// arguments]): the specs and the source.
std::pair<std::vector<KernelSpec>, std::string> cpu_kernels(const FusionPlan& plan) {
  std::vector<KernelSpec> specs;
  for (const FusionGroup& grp : plan.groups) specs.push_back(make_kernel_spec(grp, target_for(Device::kCPU)));
  std::string source = print_cpu_source(specs, /*size_args=*/true);
  return {std::move(specs), std::move(source)};
}

// Code generation on a class: the kernels of the class's fusion plan print the source that every size of
// the class prints, and their argument expressions evaluated at a size are the arguments that size's
// kernels take. The decisions the printer takes on sizes (int32 offsets, a dim of size 1, a table that
// fits) are guards, and none fixes a symbol.
TEST(SymGraph, KernelsOfTheClassReadTheirSizesAsArguments) {
  RooflineCostModel cost(DeviceDescription{"test-cpu", 40.0, 100.0, 2.0, 0.95, 2});
  const std::vector<std::pair<const char*, std::vector<std::string>>> cases = {
      {kFragment, {"s0 < 8388608", "s0 != 2"}},  // int32 offsets: 256*s0 < 2^31 - 1, the widest kernel's
      {kCacheStep, {"s0 != 3", "s0*s1+3*s1 < 33554432", "s0*s1 < 33554432"}}};
  for (const auto& [text, want] : cases) {
    ShapeGuards guards;
    GuardScope scope(guards);
    auto g = optimized(text);
    const SymBindings hints = g->symbols();
    const FusionPlan plan = plan_fusion(*g, cost);
    guards.set_phase("codegen");
    const auto [specs, source] = cpu_kernels(plan);
    EXPECT_EQ(texts(guards), want) << source;
    EXPECT_FALSE(guards.specializes("s0"));
    size_t symbolic = 0;
    for (const KernelSpec& k : specs) {
      ASSERT_EQ(k.arg_exprs.size(), k.args.size());
      for (const SymInt& a : k.arg_exprs) symbolic += a.is_symbolic();
    }
    EXPECT_GE(symbolic, specs.size()) << "every kernel reads some size of the class";
    int checked = 0;
    for (int64_t n : {37, 2, 4, 63, 1000}) {
      SymBindings b = hints;
      b["s0"] = n;
      if (!guards.holds(b)) continue;
      ++checked;
      auto concrete = optimized(text, &b);
      const auto [cspecs, csource] = cpu_kernels(plan_fusion(*concrete, cost));
      EXPECT_EQ(csource, source) << "s0 = " << n;
      ASSERT_EQ(cspecs.size(), specs.size());
      for (size_t i = 0; i < specs.size(); ++i)
        EXPECT_EQ(arg_values(specs[i], b), cspecs[i].args) << "s0 = " << n << ", " << specs[i].name;
    }
    EXPECT_GE(checked, 4);
  }
}

// A plan as text with its numbers: each step (a kernel's name, arguments, iteration space and buffers by
// value name with their strides, extents and offsets; an ATen step's node by position) and the values
// released after it, so that an instance of a class's plan and the plan built for that size compare.
std::string plan_text(const ExecutablePlan& p) {
  std::map<const Node*, int> index;
  for (const Node* n : p.graph->nodes()) index.emplace(n, static_cast<int>(index.size()));
  std::map<int, std::string> names;
  for (const Value* v : p.graph->inputs()) names[v->id()] = v->name();
  for (const Node* n : p.graph->nodes())
    for (const Value* v : n->outputs()) names[v->id()] = v->name();
  auto nums = [](const SymSizes& s) { return fmt::format("{}", fmt::join(s.hints(), ",")); };
  std::string out;
  for (const ExecStep& st : p.steps) {
    if (st.kernel >= 0) {
      const KernelSpec& k = p.kernels[st.kernel].spec;
      out += fmt::format("{} over [{}] rows {} of {} args [{}]:", k.name, nums(k.sizes), k.rows.hint(),
                         k.row_len.hint(), fmt::join(k.args, ","));
      for (const KernelBuffer& b : k.buffers)
        out += fmt::format(" {}{{{}}}+{}/{}", b.value->name(), nums(b.strides), b.offset.hint(), b.extent.hint());
    } else {
      out += fmt::format("aten {}", index.at(st.node));
    }
    out += "; releases";
    for (int id : st.release) out += " " + names.at(id);
    out += "\n";
  }
  return out;
}

// Note [Plans of a shape class]: the class's plan is built once; each size of the class instantiates it
// by evaluation alone, and the instance is the plan that size's own graph builds: the same graph, steps,
// kernels, arguments, buffers and generated code. Sizes outside the guards are refused.
TEST(SymGraph, OnePlanServesEverySizeOfTheClass) {
  const std::vector<std::pair<const char*, std::vector<std::string>>> cases = {
      {kFragment, {"s0 < 8388608", "s0 != 2"}},
      {kCacheStep, {"s0 != 3", "s0*s1+3*s1 < 33554432", "s0*s1 < 33554432"}}};
  PlanTarget t;
  t.compile = false;
  for (const auto& [text, want] : cases) {
    ShapeGuards guards;
    std::unique_ptr<ExecutablePlan> cls;
    SymBindings hints;
    {
      GuardScope scope(guards);
      auto g = optimized(text);
      hints = g->symbols();
      cls = build_plan(std::move(g), t);  // a class's graph: sizes as arguments, whatever the target says
    }
    EXPECT_EQ(texts(cls->guards), want);
    ASSERT_FALSE(cls->kernels.empty());
    for (const KernelLaunch& k : cls->kernels) EXPECT_EQ(k.spec.arg_exprs.size(), k.spec.args.size()) << k.spec.name;
    EXPECT_NE(cls->explain().find("shape class: the plan of every size where " + want[0]), std::string::npos)
        << cls->explain();
    int checked = 0;
    for (int64_t n : {37, 2, 3, 4, 63, 1000}) {
      SymBindings b = hints;
      b["s0"] = n;
      if (!cls->guards.holds(b)) {
        EXPECT_THROW(instantiate_plan(*cls, b), InternalError) << "s0 = " << n;
        continue;
      }
      ++checked;
      auto inst = instantiate_plan(*cls, b);
      PlanTarget sized = t;
      sized.size_args = true;
      auto own = build_plan(optimized(text, &b), sized);
      EXPECT_EQ(print_graph(*inst->graph), print_graph(*own->graph)) << "s0 = " << n;
      EXPECT_EQ(plan_text(*inst), plan_text(*own)) << "s0 = " << n;
      ASSERT_EQ(inst->code.size(), own->code.size());
      for (size_t c = 0; c < own->code.size(); ++c) EXPECT_EQ(inst->code[c].source, own->code[c].source) << "s0 = " << n;
      EXPECT_EQ(inst->code_class, own->code_class);
      EXPECT_NE(inst->explain().find(fmt::format("the class's plan at s0={}", n)), std::string::npos) << inst->explain();
    }
    EXPECT_GE(checked, 4);
  }
}

// Note [Run-time dividers]: a CUDA kernel of a shape class divides its index by sizes through a magic
// number and shift derived from each size's expression at every size (KernelSpec::arg_of), so no divider
// fixes a size; each size's instance is the plan built for that size, source and arguments alike.
TEST(SymGraph, CudaDividersOfAClassAreDerivedAtEachSize) {
  PlanTarget t;
  t.compile = false;
  t.arch["cuda"] = "sm_90";
  auto cuda = [](std::unique_ptr<Graph> g) {
    set_device(*g, Device::kCUDA, 0);
    return g;
  };
  ShapeGuards guards;
  std::unique_ptr<ExecutablePlan> cls;
  SymBindings hints;
  {
    GuardScope scope(guards);
    auto g = cuda(optimized(kFragment));
    hints = g->symbols();
    cls = build_plan(std::move(g), t);
  }
  EXPECT_FALSE(guards.specializes("s0")) << fmt::format("{}", fmt::join(texts(guards), ", "));
  ASSERT_NE(cls->code_for(Device::kCUDA), nullptr);
  int dividers = 0;
  for (const KernelLaunch& k : cls->kernels)
    for (size_t i = 0; i < k.spec.arg_of.size(); ++i)
      if (k.spec.arg_of[i] == ArgOf::kDividerMagic) {
        ++dividers;
        EXPECT_TRUE(k.spec.arg_exprs[i].is_symbolic() || k.spec.arg_exprs[i].hint() > 1) << k.spec.name;
      }
  EXPECT_GT(dividers, 0) << cls->code_for(Device::kCUDA)->source;
  int checked = 0;
  for (int64_t n : {37, 3, 5, 64, 1000, 4097}) {
    SymBindings b = hints;
    b["s0"] = n;
    if (!cls->guards.holds(b)) continue;
    ++checked;
    auto inst = instantiate_plan(*cls, b);
    PlanTarget sized = t;
    sized.size_args = true;
    auto own = build_plan(cuda(optimized(kFragment, &b)), sized);
    EXPECT_EQ(plan_text(*inst), plan_text(*own)) << "s0 = " << n;
    ASSERT_EQ(inst->code.size(), own->code.size());
    for (size_t c = 0; c < own->code.size(); ++c) EXPECT_EQ(inst->code[c].source, own->code[c].source) << "s0 = " << n;
    for (size_t k = 0; k < own->kernels.size(); ++k)
      EXPECT_EQ(inst->kernels[k].spec.args, own->kernels[k].spec.args) << "s0 = " << n << ", kernel " << k;
  }
  EXPECT_GE(checked, 5);
}

// A size used as a number (`x + x.shape[1]`) is a kernel argument of the class's CPU kernel, not a literal
// that would fix the symbol.
TEST(SymGraph, ASizeUsedAsANumberIsAKernelArgument) {
  const char* text =
      "graph[s0=37](%0 : f32[4,s0]):\n"
      "  %1 : f32[4,s0] = aten::add.Scalar(%0, s0, 1)\n"
      "  %2 : f32[4,s0] = aten::mul.Scalar(%1, 2*s0+1)\n"
      "  return (%2)\n";
  ShapeGuards guards;
  std::unique_ptr<ExecutablePlan> cls;
  {
    GuardScope scope(guards);
    PlanTarget t;
    t.compile = false;
    cls = build_plan(optimized(text), t);
  }
  EXPECT_FALSE(cls->guards.specializes("s0")) << fmt::format("{}", fmt::join(texts(cls->guards), ", "));
  ASSERT_EQ(cls->kernels.size(), 1u);
  const KernelSpec& k = cls->kernels[0].spec;
  std::vector<std::string> exprs;
  for (const SymInt& e : k.arg_exprs) exprs.push_back(e.str());
  EXPECT_NE(std::find(exprs.begin(), exprs.end(), "s0"), exprs.end()) << fmt::format("{}", fmt::join(exprs, ", "));
  EXPECT_NE(std::find(exprs.begin(), exprs.end(), "2*s0+1"), exprs.end()) << fmt::format("{}", fmt::join(exprs, ", "));
  EXPECT_NE(cls->code[0].source.find("((float)z"), std::string::npos) << cls->code[0].source;
  auto inst = instantiate_plan(*cls, {{"s0", 5}});
  const std::vector<int64_t>& args = inst->kernels[0].spec.args;
  EXPECT_NE(std::find(args.begin(), args.end(), 5), args.end());
  EXPECT_NE(std::find(args.begin(), args.end(), 11), args.end());
}

// Note [Sizes in device functions]: in a CUDA kernel of a shape class, a size read as a number by a
// statement (the pointwise body's and a cat piece's device functions, a row's statements after its
// reduction) is a size argument passed in, not a literal that would fix the symbol; each size's instance
// passes its own value, and the one source compiles.
TEST(SymGraph, ACudaKernelReadsASizeUsedAsANumberAsAnArgument) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"pointwise body",
       "graph[s0=37](%0 : f32[4,s0]):\n"
       "  %1 : f32[4,s0] = aten::add.Scalar(%0, s0, 1)\n"
       "  %2 : f32[4,s0] = aten::mul.Scalar(%1, 2*s0+1)\n"
       "  return (%2)\n"},
      {"row after its sum",
       "graph[s0=37](%0 : f32[4,s0]):\n"
       "  %1 : f32[4,s0] = aten::exp(%0)\n"
       "  %2 : f32[4] = aten::sum.dim_IntList(%1, [1], False, None)\n"
       "  %3 : f32[4] = aten::div.Scalar(%2, s0)\n"
       "  return (%3)\n"},
      {"cat piece",
       "graph[s0=37](%0 : f32[2,s0,8], %1 : f32[2,3,8]):\n"
       "  %2 : f32[2,3,8] = aten::add.Scalar(%1, s0, 1)\n"
       "  %3 : Tensor[] = prim::ListConstruct(%0, %2)\n"
       "  %4 : f32[2,s0+3,8] = aten::cat(%3, 1)\n"
       "  return (%4)\n"}};
  PlanTarget t;
  t.compile = false;
  t.arch["cuda"] = "sm_90";
  for (const auto& [what, text] : cases) {
    ShapeGuards guards;
    std::unique_ptr<ExecutablePlan> cls;
    {
      GuardScope scope(guards);
      auto g = optimized(text);
      set_device(*g, Device::kCUDA, 0);
      cls = build_plan(std::move(g), t);
    }
    EXPECT_FALSE(guards.specializes("s0")) << what << ": " << fmt::format("{}", fmt::join(texts(guards), ", "));
    const TargetCode* code = cls->code_for(Device::kCUDA);
    ASSERT_NE(code, nullptr) << what;
    EXPECT_NE(code->source.find("((float)z"), std::string::npos) << what << "\n" << code->source;
    std::vector<std::string> exprs;
    for (const KernelLaunch& k : cls->kernels)
      for (const SymInt& e : k.spec.arg_exprs) exprs.push_back(e.str());
    EXPECT_NE(std::find(exprs.begin(), exprs.end(), "s0"), exprs.end()) << what << ": " << fmt::format("{}", fmt::join(exprs, ", "));
    int checked = 0;
    for (int64_t n : {5, 41, 63, 1001}) {
      if (!cls->guards.holds({{"s0", n}})) continue;
      ++checked;
      auto inst = instantiate_plan(*cls, {{"s0", n}});
      bool passed = false;
      for (const KernelLaunch& k : inst->kernels)
        passed = passed || std::find(k.spec.args.begin(), k.spec.args.end(), n) != k.spec.args.end();
      EXPECT_TRUE(passed) << what << ": s0 = " << n << " is not an argument of the instance";
      EXPECT_EQ(inst->code_for(Device::kCUDA)->source, code->source) << what;
    }
    EXPECT_GE(checked, 2) << what << ": " << fmt::format("{}", fmt::join(texts(cls->guards), ", "));
    std::string why;
    if (!nvrtc_available(&why)) continue;  // the source's text is checked above; compiling needs NVRTC
    auto bin = compile_cuda_source(code->source, "sm_90");
    EXPECT_EQ(bin->kernels.size(), cls->kernels.size()) << what << "\n" << bin->log << "\n" << code->source;
  }
}

// rms_norm's decomposition over a symbolic row: no guard on the CPU; on CUDA, where eager's kernel takes
// another path for rows not a multiple of 4, a divisibility guard, not the row's size.
TEST(SymGraph, RmsNormOverASymbolicRowKeepsTheClass) {
  const char* text =
      "graph[s0=37](%0 : f32[4,s0]):\n"
      "  %1 : f32[4,s0] = aten::rms_norm(%0, [s0], None, None)\n"
      "  return (%1)\n";
  for (Device d : {Device::kCPU, Device::kCUDA}) {
    ShapeGuards guards;
    {
      GuardScope scope(guards);
      auto g = parse_graph(text);
      set_device(*g, d, 0);
      run_pipeline(*g, nullptr);
      EXPECT_EQ(print_graph(*g).find("aten::rms_norm"), std::string::npos) << print_graph(*g);
    }
    EXPECT_FALSE(guards.specializes("s0")) << fmt::format("{}", fmt::join(texts(guards), ", "));
    if (d == Device::kCPU) {
      EXPECT_TRUE(texts(guards).empty()) << fmt::format("{}", fmt::join(texts(guards), ", "));
    }
  }
}

// Note [Horizontal fusion] in a shape class: two independent groups over [s0,64] and [64,s0] are the same
// space only at the hint s0 = 64; comparing them as numbers fixed s0 (s0 == 64) whether they merged or
// not. They are compared as expressions: apart, with no guard.
TEST(SymGraph, HorizontalFusionDoesNotFixTheClassesSize) {
  const char* text =
      "graph[s0=64](%0 : f32[s0,64]):\n"
      "  %1 : f32[s0,64] = aten::exp(%0)\n"
      "  %2 : f32[64,s0]{1,64} = aten::permute(%0, [1,0])\n"
      "  %3 : f32[64,s0] = aten::sin(%2)\n"
      "  return (%1, %3)\n";
  PlanTarget t;
  t.compile = false;
  ShapeGuards guards;
  std::unique_ptr<ExecutablePlan> cls;
  {
    GuardScope scope(guards);
    cls = build_plan(optimized(text), t);
  }
  EXPECT_FALSE(guards.specializes("s0")) << fmt::format("{}", fmt::join(texts(guards), ", "));
  EXPECT_EQ(cls->kernels.size(), 2u) << cls->explain();
}

TEST(SymGraph, APassDecisionTheClassDoesNotShareIsAGuard) {
  // slice(x, 1, 0, 40) is all of x where s0 <= 40 only: the slice goes, under that guard.
  auto g = parse_graph(
      "graph[s0=37](%0 : f32[2,s0]):\n"
      "  %1 : f32[2,s0] = aten::slice.Tensor(%0, 1, 0, 40, 1)\n"
      "  %2 : f32[2,s0] = aten::exp(%1)\n"
      "  return (%2)\n");
  ShapeGuards guards;
  {
    GuardScope scope(guards);
    run_pipeline(*g, nullptr);
  }
  EXPECT_EQ(print_graph(*g).find("slice"), std::string::npos) << print_graph(*g);
  EXPECT_EQ(texts(guards), (std::vector<std::string>{"s0 <= 40"}));
  EXPECT_EQ(guards.guards()[0].phase, "rule views.full_slice");
  EXPECT_TRUE(guards.holds({{"s0", 40}}));
  EXPECT_FALSE(guards.holds({{"s0", 41}}));
}

// Note [Graphs of two sizes]: each integer that differs between two typed captures of one program
// becomes an expression over one symbol per changed extent, giving both values.
TEST(Generalize, FitsEachSizeThatDiffers) {
  const std::string first =
      "graph(%0 : f32[3,4], %1 : f32[4]):\n"
      "  %2 : f32[3,4] = aten::add.Tensor(%0, %1, 1)\n"
      "  %3 : f32[12] = aten::view(%2, [12])\n"
      "  %4 : f32[4,3]{1,4} = aten::transpose.int(%2, 0, 1)\n"
      "  %5 : Tensor[] = prim::ListConstruct(%2, %0)\n"
      "  %6 : f32[6,4] = aten::cat(%5, 0)\n"
      "  %7 : f32[2,4] = aten::slice.Tensor(%2, 0, 1, 9223372036854775807, 1)\n"
      "  %8 : f32[2,4] = aten::mul.Scalar(%7, 0.5)\n"
      "  return (%3, %4, %6, %8)\n";
  auto resize = [](std::string text, const std::vector<std::pair<std::string, std::string>>& subs) {
    for (auto [from, to] : subs)
      for (size_t p = text.find(from); p != std::string::npos; p = text.find(from, p + to.size()))
        text.replace(p, from.size(), to);
    return text;
  };
  const std::string second = resize(first, {{"[3,4]", "[5,6]"}, {"[4]", "[6]"}, {"[12]", "[30]"},
                                            {"[4,3]{1,4}", "[6,5]{1,6}"}, {"[6,4]", "[10,6]"}, {"[2,4]", "[4,6]"}});
  const auto a = parse_graph(first), b = parse_graph(second);
  std::string why;
  const auto cls = generalize(*a, *b, {{3, 5}, {4, 6}}, &why);
  ASSERT_TRUE(cls) << why;
  EXPECT_EQ(print_graph(*cls),
            "graph[s0=3,s1=4](%0 : f32[s0,s1], %1 : f32[s1]):\n"
            "  %2 : f32[s0,s1] = aten::add.Tensor(%0, %1, 1)\n"
            "  %3 : f32[s0*s1] = aten::view(%2, [s0*s1])\n"
            "  %4 : f32[s1,s0]{1,s1} = aten::transpose.int(%2, 0, 1)\n"
            "  %5 : Tensor[] = prim::ListConstruct(%2, %0)\n"
            "  %6 : f32[2*s0,s1] = aten::cat(%5, 0)\n"
            "  %7 : f32[s0-1,s1] = aten::slice.Tensor(%2, 0, 1, 9223372036854775807, 1)\n"
            "  %8 : f32[s0-1,s1] = aten::mul.Scalar(%7, 0.5)\n"
            "  return (%3, %4, %6, %8)\n");
  // Both captures are the class's graph at their sizes; a third size is too, and a capture with another
  // number is not.
  EXPECT_TRUE(is_instance(*cls, {{"s0", 3}, {"s1", 4}}, *a, &why)) << why;
  EXPECT_TRUE(is_instance(*cls, {{"s0", 5}, {"s1", 6}}, *b, &why)) << why;
  const auto c = parse_graph(resize(first, {{"[3,4]", "[7,2]"}, {"[4]", "[2]"}, {"[12]", "[14]"},
                                            {"[4,3]{1,4}", "[2,7]{1,2}"}, {"[6,4]", "[14,2]"}, {"[2,4]", "[6,2]"}}));
  EXPECT_TRUE(is_instance(*cls, {{"s0", 7}, {"s1", 2}}, *c, &why)) << why;
  EXPECT_FALSE(is_instance(*cls, {{"s0", 7}, {"s1", 3}}, *c, &why));
  EXPECT_NE(why.find("s1 is 3 there, not 2"), std::string::npos) << why;
  EXPECT_TRUE(same_program(*a, *c));
  EXPECT_EQ(structure_hash(*a), structure_hash(*c));
  // Graphs that differ beyond their integers, or in an integer that is not a size, have no class.
  const auto renamed = parse_graph(resize(second, {{"aten::mul.Scalar", "aten::div.Scalar"}}));
  EXPECT_FALSE(generalize(*a, *renamed, {{3, 5}, {4, 6}}, &why));
  EXPECT_NE(why.find("differ beyond their sizes: node 6 (aten::mul.Scalar): and aten::div.Scalar"), std::string::npos) << why;
  EXPECT_FALSE(same_program(*a, *renamed));
  EXPECT_NE(structure_hash(*a), structure_hash(*renamed));
  const auto scaled = parse_graph(resize(second, {{"0.5", "0.7"}}));
  EXPECT_FALSE(generalize(*a, *scaled, {{3, 5}, {4, 6}}, &why));
  EXPECT_NE(why.find("argument 1: 0.5 and 0.7"), std::string::npos) << why;
  const auto negative = parse_graph(resize(second, {{"transpose.int(%2, 0, 1)", "transpose.int(%2, 0, -1)"}}));
  EXPECT_FALSE(generalize(*a, *negative, {{3, 5}, {4, 6}}, &why));
  EXPECT_NE(why.find("not a size differs: 1 and -1"), std::string::npos) << why;
  EXPECT_FALSE(generalize(*a, *a, {{3, 5}, {4, 6}}, &why));
  EXPECT_NE(why.find("no size differs"), std::string::npos) << why;
}

}  // namespace
}  // namespace fusion_jit
