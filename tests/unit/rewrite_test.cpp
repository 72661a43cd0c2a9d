// The rewrite engine (passes/rewrite.h) and its first users, the decompositions (passes/decompose.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "passes/passes.h"
#include "support/error.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

// tests/unit/data/decompositions.txt: cases of "=== title", an input graph, "--- decomposed", the expected
// graph after the decompose rule set (renumbered). FJ_UPDATE_GOLDEN=1 writes the expected parts anew.
TEST(Decompositions, GoldenIR) {
  const std::string path = std::string(FJ_TEST_DATA_DIR) + "/decompositions.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::string line, header, title, input, expected, out;
  enum { kHeader, kInput, kExpected } part = kHeader;
  int cases = 0;
  auto finish = [&] {
    if (title.empty()) return;
    ++cases;
    auto g = parse_graph(input);
    decompose(*g);
    verify_graph(*g);
    g->renumber();
    std::string got = print_graph(*g);
    EXPECT_EQ(got, expected) << title;
    out += "=== " + title + "\n" + input + "--- decomposed\n" + got;
  };
  while (std::getline(in, line)) {
    if (line.rfind("=== ", 0) == 0) {
      finish();
      title = line.substr(4), input.clear(), expected.clear(), part = kInput;
    } else if (line == "--- decomposed") {
      part = kExpected;
    } else if (part == kHeader) {
      header += line + "\n";
    } else {
      (part == kInput ? input : expected) += line + "\n";
    }
  }
  finish();
  EXPECT_GT(cases, 20);
  if (const char* u = std::getenv("FJ_UPDATE_GOLDEN"); u && std::string(u) == "1") std::ofstream(path) << header + out;
}


// The engine on small rules of its own. `apply` runs a set and returns the printed, renumbered graph.
std::string apply(const RuleSet& set, const std::string& in, bool expect_change = true,
                  const std::set<std::string>& disabled = {}, std::vector<RuleApplication>* log = nullptr) {
  auto g = parse_graph(in);
  EXPECT_EQ(run_rules(*g, set, disabled, log), expect_change);
  verify_graph(*g);
  g->renumber();
  return print_graph(*g);
}

// x * x -> x ** 2 for floating x (the same name bound twice, a type predicate, a replacement).
Rule square() {
  auto x = Pattern::tensor().where(is_floating_tensor).bind("x");
  return {"square", Pattern::op({"aten::mul.Tensor"}, {x, x}), [](const Match& m, Builder& b) {
            Value* v = m.value("x");
            return Replacement{b.op("aten::pow.Tensor_Scalar", {Arg::of(v), Arg::lit(int64_t{2})}, Builder::dt(v),
                                    Builder::sizes(v))};
          }};
}
// (x ** 2) ** 2 -> x ** 4 when x ** 2 has no other use (a sub-pattern, literals, single use).
Rule pow_pow() {
  auto inner = Pattern::op({"aten::pow.Tensor_Scalar"}, {Pattern::tensor().bind("x"), Pattern::literal(int64_t{2})});
  return {"pow_pow", Pattern::op({"aten::pow.Tensor_Scalar"}, {inner.single_use(), Pattern::literal(int64_t{2})}),
          [](const Match& m, Builder& b) {
            Value* v = m.value("x");
            return Replacement{b.op("aten::pow.Tensor_Scalar", {Arg::of(v), Arg::lit(int64_t{4})}, Builder::dt(v),
                                    Builder::sizes(v))};
          }};
}
// x * 1.0 -> x (an existing value as the replacement).
Rule mul_one() {
  return {"mul_one", Pattern::op({"aten::mul.Scalar"}, {Pattern::tensor().bind("x"), Pattern::literal(1.0)}),
          [](const Match& m, Builder&) { return Replacement{m.value("x")}; }};
}

TEST(Rewrite, LiteralArgumentsMatchByValueAndKind) {
  RuleSet set{"t", {mul_one()}};
  EXPECT_EQ(apply(set, R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::mul.Scalar(%0, 1.0)
  %2 : f32[4] = aten::mul.Scalar(%0, 2.0)
  %3 : f32[4] = aten::mul.Scalar(%0, 1)
  %4 : f32[4] = aten::add.Tensor(%1, %2, 1)
  %5 : f32[4] = aten::add.Tensor(%4, %3, 1)
  return (%5)
)"),
            R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::mul.Scalar(%0, 2.0)
  %2 : f32[4] = aten::mul.Scalar(%0, 1)
  %3 : f32[4] = aten::add.Tensor(%0, %1, 1)
  %4 : f32[4] = aten::add.Tensor(%3, %2, 1)
  return (%4)
)");
}

// sub(x, exp(y)) written either way round matches a commutative pattern; a non-commutative one only as
// written.
TEST(Rewrite, ACommutativePatternMatchesEitherOperandOrder) {
  auto exp_y = Pattern::op({"aten::exp"}, {Pattern::tensor().bind("y")});
  auto make = [&](bool commutative) {
    Pattern p = Pattern::op({"aten::mul.Tensor"}, {exp_y, Pattern::tensor().bind("x")});
    if (commutative) p = p.commutative();
    return Rule{"mul_exp", p, [](const Match& m, Builder& b) {
                  return Replacement{b.binary("aten::sub.Tensor", m.value("x"), m.value("y"), true)};
                }};
  };
  const char* ir = R"(graph(%0 : f32[4], %1 : f32[4]):
  %2 : f32[4] = aten::exp(%1)
  %3 : f32[4] = aten::mul.Tensor(%0, %2)
  return (%3)
)";
  EXPECT_EQ(apply(RuleSet{"t", {make(true)}}, ir),
            "graph(%0 : f32[4], %1 : f32[4]):\n  %2 : f32[4] = aten::sub.Tensor(%0, %1, 1)\n  return (%2)\n");
  apply(RuleSet{"t", {make(false)}}, ir, /*expect_change=*/false);
}

TEST(Rewrite, AnExistingValueOfAnotherLayoutIsNoReplacement) {
  apply(RuleSet{"t", {mul_one()}},
        "graph(%0 : f32[2,3]{1,2}):\n  %1 : f32[2,3] = aten::mul.Scalar(%0, 1.0)\n  return (%1)\n", false);
}

TEST(Rewrite, SameNameTwiceMeansSameValueAndPredicatesFilter) {
  RuleSet set{"t", {square()}};
  EXPECT_EQ(apply(set, R"(graph(%0 : f32[4], %1 : f32[4], %2 : i64[4]):
  %3 : f32[4] = aten::mul.Tensor(%0, %0)
  %4 : f32[4] = aten::mul.Tensor(%0, %1)
  %5 : i64[4] = aten::mul.Tensor(%2, %2)
  return (%3, %4, %5)
)"),
            R"(graph(%0 : f32[4], %1 : f32[4], %2 : i64[4]):
  %3 : f32[4] = aten::pow.Tensor_Scalar(%0, 2)
  %4 : f32[4] = aten::mul.Tensor(%0, %1)
  %5 : i64[4] = aten::mul.Tensor(%2, %2)
  return (%3, %4, %5)
)");
}

TEST(Rewrite, SingleUseIntermediate) {
  RuleSet set{"t", {pow_pow()}};
  // %1 is used twice: the rule does not fire.
  apply(set, R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::pow.Tensor_Scalar(%0, 2)
  %2 : f32[4] = aten::pow.Tensor_Scalar(%1, 2)
  %3 : f32[4] = aten::add.Tensor(%1, %2, 1)
  return (%3)
)",
        false);
  // A graph output is a use too.
  apply(set, R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::pow.Tensor_Scalar(%0, 2)
  %2 : f32[4] = aten::pow.Tensor_Scalar(%1, 2)
  return (%1, %2)
)",
        false);
  EXPECT_EQ(apply(set, R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::pow.Tensor_Scalar(%0, 2)
  %2 : f32[4] = aten::pow.Tensor_Scalar(%1, 2)
  return (%2)
)"),
            R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::pow.Tensor_Scalar(%0, 4)
  return (%1)
)");
}

TEST(Rewrite, RunsToAFixedPointAndLogsEachApplication) {
  // Sweep 1: both products become squares (the second sees the first's replacement as its argument).
  // Sweep 2: after DCE the inner square has one use, so pow_pow fires. Sweep 3 changes nothing.
  RuleSet set{"t", {square(), pow_pow()}};
  std::vector<RuleApplication> log;
  EXPECT_EQ(apply(set, R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::mul.Tensor(%0, %0)
  %2 : f32[4] = aten::mul.Tensor(%1, %1)
  return (%2)
)",
                  true, {}, &log),
            R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::pow.Tensor_Scalar(%0, 4)
  return (%1)
)");
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0].rule, "t.square");
  EXPECT_EQ(log[0].replaced, "%1 = aten::mul.Tensor");
  EXPECT_EQ(log[2].rule, "t.pow_pow");
  EXPECT_EQ(summarize(log), "t.square x2, t.pow_pow x1");
}

TEST(Rewrite, DisabledRulesAndSetsDoNotFire) {
  RuleSet set{"t", {square(), pow_pow()}};
  const std::string in = "graph(%0 : f32[4]):\n  %1 : f32[4] = aten::mul.Tensor(%0, %0)\n  return (%1)\n";
  apply(set, in, false, {"t.square"});
  apply(set, in, false, {"t"});
  apply(set, in, true, {"t.pow_pow", "other.square"});
  EXPECT_EQ(set.rule_names(), (std::vector<std::string>{"t.square", "t.pow_pow"}));
}

TEST(Rewrite, AbsentArgumentsAndUnusedOutputs) {
  // any() matches an absent argument (bound to nullptr); literal() does not. unused(1): output 1 unused.
  int fired = 0;
  RuleSet set{"t",
              {{"r",
                Pattern::op({"test::f"}, {Pattern::tensor().bind("x"), Pattern::any().bind("opt")}).outputs(2).unused(1),
                [&fired](const Match& m, Builder& b) {
                  ++fired;
                  EXPECT_EQ(m.arg("opt"), nullptr);
                  EXPECT_EQ(m.nodes.size(), 1u);
                  return Replacement{b.unary("aten::neg", m.value("x")), nullptr};
                }},
               {"needs_literal", Pattern::op({"test::g"}, {Pattern::tensor(), Pattern::literal()}),
                [](const Match&, Builder&) -> Replacement {
                  ADD_FAILURE() << "matched an absent argument as a literal";
                  return {};
                }}}};
  EXPECT_EQ(apply(set, R"(graph(%0 : f32[4]):
  %1 : f32[4], %2 : f32[4] = test::f(%0)
  %3 : f32[4], %4 : f32[4] = test::f(%1)
  %5 : f32[4] = test::g(%3)
  return (%5, %4)
)"),
            R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::neg(%0)
  %2 : f32[4], %3 : f32[4] = test::f(%1)
  %4 : f32[4] = test::g(%2)
  return (%4, %3)
)");
  EXPECT_EQ(fired, 1);
}

TEST(Rewrite, SideEffectsDeadNodesAndDeclinedRewrites) {
  // A declining rule leaves nothing behind; a node with side effects and a dead node are not matched.
  int tried = 0;
  RuleSet set{"t", {{"decline", Pattern::op({"aten::exp"}, {Pattern::tensor().bind("x")}),
                     [&tried](const Match& m, Builder& b) {
                       ++tried;
                       b.unary("aten::neg", b.unary("aten::abs", m.value("x")));
                       return Replacement{};
                     }}}};
  const std::string in = R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::exp(%0)
  %2 : f32[4] = !aten::exp(%0)
  %3 : f32[4] = aten::exp(%1)
  return (%1)
)";
  EXPECT_EQ(apply(set, in, false), in);
  EXPECT_EQ(tried, 1);
}

TEST(Rewrite, NewValuesTakeTheReplacedOutputsStrides) {
  RuleSet set{"t", {{"exp_to_neg", Pattern::op({"aten::exp"}, {Pattern::tensor().bind("x")}),
                     [](const Match& m, Builder& b) { return Replacement{b.unary("aten::neg", m.value("x"))}; }}}};
  EXPECT_EQ(apply(set, "graph(%0 : f32[2,3]{1,2}):\n  %1 : f32[2,3]{1,2} = aten::exp(%0)\n  return (%1)\n"),
            "graph(%0 : f32[2,3]{1,2}):\n  %1 : f32[2,3]{1,2} = aten::neg(%0)\n  return (%1)\n");
}

TEST(Rewrite, RulesThatUndoEachOtherAreCaught) {
  auto flip = [](const char* from, const char* to) {
    return Rule{std::string(from).substr(6), Pattern::op({from}, {Pattern::tensor().bind("x")}),
                [to = std::string(to)](const Match& m, Builder& b) { return Replacement{b.unary(to, m.value("x"))}; }};
  };
  RuleSet set{"t", {flip("test::a", "test::b"), flip("test::b", "test::a")}};
  auto g = parse_graph("graph(%0 : f32[4]):\n  %1 : f32[4] = test::a(%0)\n  return (%1)\n");
  try {
    run_rules(*g, set);
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("rule set t still rewrites after 32 sweeps"), std::string::npos) << e.what();
  }
}

TEST(Rewrite, DecompositionRulesAreNamedAndDisabledOneByOne) {
  const std::string in = R"(graph(%0 : f32[4,8]):
  %1 : f32[4,8] = aten::softmax.int(%0, 1, None)
  %2 : f32[4,8] = aten::log_softmax.int(%1, 1, None)
  return (%2)
)";
  std::vector<RuleApplication> log;
  std::string out = apply(decompositions(), in, true, {"decompose.softmax"}, &log);
  EXPECT_NE(out.find("aten::softmax.int"), std::string::npos) << out;
  EXPECT_EQ(out.find("aten::log_softmax.int"), std::string::npos) << out;
  EXPECT_EQ(summarize(log), "decompose.log_softmax x1");
  auto names = pipeline_names();
  for (const char* n : {"decompose", "dce", "cse", "constant_fold", "decompose.softmax", "decompose.layer_norm",
                        "decompose.batch_norm_inference"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

TEST(Rewrite, PipelineLeavesTheRulesThatFiredForExplain) {
  auto g = parse_graph(R"(graph(%0 : f32[4,8], %1 : f32[4,8]):
  %2 : f32[4,8] = aten::softmax.int(%0, 1, None)
  %3 : f32[4,8] = aten::softmax.int(%1, 0, None)
  %4 : f32[4,8] = aten::add.Tensor(%2, %3, 1)
  return (%4)
)");
  auto timings = run_pipeline(*g, nullptr);
  ASSERT_GE(timings.size(), 2u);
  EXPECT_EQ(timings[0].name, "attention");  // first: before decompose takes softmax apart
  EXPECT_EQ(timings[0].rewrites.size(), 0u);
  EXPECT_EQ(timings[1].name, "decompose");
  EXPECT_EQ(timings[1].rewrites.size(), 2u);
  EXPECT_EQ(g->notes(), std::vector<std::string>{"rewrites: decompose.softmax x2"});
  EXPECT_EQ(g->clone()->notes(), g->notes());
}

TEST(Rewrite, ADeclineWithAReasonReachesExplain) {
  RuleSet set{"t", {{"why", Pattern::op({"aten::exp"}, {Pattern::tensor().bind("x")}),
                     [](const Match&, Builder& b) { return b.decline("exp is kept"); }}}};
  auto g = parse_graph(R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::exp(%0)
  return (%1)
)");
  std::vector<RuleApplication> log;
  EXPECT_FALSE(run_rules(*g, set, {}, &log));
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].rule, "t.why");
  EXPECT_EQ(log[0].replaced, "%1 = aten::exp");
  EXPECT_EQ(log[0].declined, "exp is kept");
  EXPECT_EQ(summarize(log), "");
  // Through the pipeline: a note for explain.
  auto h = parse_graph(R"(graph(%0 : f32[2,4,8,8], %1 : f32[2,4,8,8], %2 : f32[2,4,8,8]):
  %3 : f32[2,4,8,8] = aten::matmul(%0, %1)
  %4 : f32[2,4,8,8] = aten::softmax.int(%3, -1, None)
  %5 : f32[2,4,8,8] = aten::matmul(%4, %2)
  return (%5, %4)
)");
  run_pipeline(*h, nullptr);
  EXPECT_EQ(h->notes(), (std::vector<std::string>{
                            "rewrites: decompose.softmax x1",
                            "declined: attention.sdpa at %5 = aten::matmul: the probabilities are also used elsewhere"}));
}

TEST(Rewrite, DisableOptionKnowsRulesAndRuleSets) {
  const char* ok[] = {"FUSION_JIT_DISABLE=decompose.softmax,decompose.std,cse,fusion", nullptr};
  EXPECT_EQ(Options::parse(ok).disabled,
            (std::set<std::string>{"decompose.softmax", "decompose.std", "cse", "fusion"}));
  const char* bad[] = {"FUSION_JIT_DISABLE=decompose.sofmax", nullptr};
  try {
    Options::parse(bad);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("FUSION_JIT_DISABLE: unknown item 'decompose.sofmax'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("decompose.softmax"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cache"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fusion_jit
