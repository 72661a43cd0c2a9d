#include <gtest/gtest.h>

#include "fusion/fusion.h"

namespace fusion_jit {
namespace {

std::string plan_text(const std::string& ir, bool enable = true, bool horizontal = true, bool cat = true) {
  auto g = parse_graph(ir);
  verify_graph(*g);
  RooflineCostModel cost(DeviceDescription{"test-cpu", 40.0, 100.0, 2.0, 0.95, 2});
  return explain_plan(plan_fusion(*g, cost, enable, horizontal, cat));
}

// Writes the actual text when it differs, so that a changed plan is easy to review.
void expect_plan(const std::string& ir, const std::string& expected, bool enable = true) {
  std::string got = plan_text(ir, enable);
  EXPECT_EQ(got, expected) << "actual plan:\n" << got;
}

TEST(Fusion, ChainBecomesOneGroup) {
  expect_plan(R"(graph(%0 : f32[64,128], %1 : f32[128]):
  %2 : f32[64,128] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[64,128] = aten::gelu(%2, "none")
  %4 : f32[64,128] = aten::add.Tensor(%3, %0, 1)
  return (%4)
)",
              R"(group 0: 3 ops over [64,128], est. 3.9 us fused vs 11.8 us unfused
    aten::add.Tensor %2
    aten::gelu %3
    aten::add.Tensor %4
  reads: %0 %1
  writes: %4
  + aten::gelu %3: fused: saves 64.0 KB of traffic and 1 launch (est. 8.2 -> 4.5 us)
  + aten::add.Tensor %2: fused: saves 96.0 KB of traffic and 1 launch (est. 8.2 -> 3.9 us)
)");
}

TEST(Fusion, OpaqueOpSplitsAndSaysWhy) {
  expect_plan(R"(graph(%0 : f32[8,16], %1 : f32[16,16]):
  %2 : f32[8,16] = aten::relu(%0)
  %3 : f32[8,16] = aten::mm(%2, %1)
  %4 : f32[8,16] = aten::sigmoid(%3)
  %5 : f32[8,16] = aten::mul.Tensor(%4, %2)
  return (%5)
)",
              R"(group 0: 1 op over [8,16], est. 2.0 us fused vs 2.0 us unfused
    aten::relu %2
  reads: %0
  writes: %2
  single op: no neighbour could join
aten: aten::mm %3: not in the op table: runs through ATen
group 1: 2 ops over [8,16], est. 2.0 us fused vs 4.1 us unfused
    aten::sigmoid %4
    aten::mul.Tensor %5
  reads: %3 %2
  writes: %5
  + aten::sigmoid %4: fused: saves 1.0 KB of traffic and 1 launch (est. 4.1 -> 2.0 us)
  - aten::relu %2: would create a cycle: a path between it and the group runs through another step
)");
}

TEST(Fusion, IntermediateUsedOutsideBecomesSecondOutput) {
  std::string got = plan_text(R"(graph(%0 : f32[32]):
  %1 : f32[32] = aten::exp(%0)
  %2 : f32[32] = aten::neg(%1)
  %3 : f32[32] = aten::cumsum(%1, 0, None)
  return (%2, %3)
)");
  EXPECT_NE(got.find("group 0: 2 ops over [32]"), std::string::npos) << got;
  EXPECT_NE(got.find("writes: %1 %2"), std::string::npos) << got;
}

TEST(Fusion, SiblingsShareAKernel) {
  std::string got = plan_text(R"(graph(%0 : f32[32]):
  %1 : f32[32] = aten::exp(%0)
  %2 : f32[32] = aten::neg(%1)
  %3 : f32[32] = aten::sin(%1)
  return (%2, %3)
)");
  EXPECT_NE(got.find("group 0: 3 ops over [32]"), std::string::npos) << got;
  EXPECT_NE(got.find("writes: %2 %3"), std::string::npos) << got;
}

// Note [Decisions measured both ways]: the N-th accepted fusion made the other way, the rest decided afresh.
TEST(Fusion, AnAcceptedFusionIsMadeTheOtherWayForMeasurement) {
  auto g = parse_graph(R"(graph(%0 : f32[1024]):
  %1 : f32[1024] = aten::exp(%0)
  %2 : f32[1024] = aten::neg(%1)
  %3 : f32[1024] = aten::sin(%2)
  return (%3)
)");
  RooflineCostModel cost(DeviceDescription{"test-cpu", 40.0, 100.0, 2.0, 0.95, 2});
  const FusionPlan decided = plan_fusion(*g, cost);
  ASSERT_EQ(decided.groups.size(), 1u);
  int accepted = 0;
  for (const Decision& d : decided.groups[0].decisions) accepted += d.fused;
  ASSERT_EQ(accepted, 2);
  for (int i = 0; i < accepted; ++i) {
    const FusionPlan split = plan_fusion(*g, cost, true, true, true, true, /*refuse_decision=*/i);
    EXPECT_EQ(split.groups.size(), 2u) << i;
    const std::string text = explain_plan(split);
    EXPECT_NE(text.find(std::string("- ") + "aten::"), std::string::npos) << text;
    EXPECT_NE(text.find(std::string(kRefusedForMeasurement) + " (would fuse: est. "), std::string::npos) << text;
  }
  // A decision past the last is none: the plan as decided.
  EXPECT_EQ(explain_plan(plan_fusion(*g, cost, true, true, true, true, accepted)), explain_plan(decided));
}

TEST(Fusion, BroadcastProducerIsRecomputedOnlyWhenPrivate) {
  std::string got = plan_text(R"(graph(%0 : f32[64,32], %1 : f32[32]):
  %2 : f32[32] = aten::mul.Scalar(%1, 2.0)
  %3 : f32[64,32] = aten::add.Tensor(%0, %2, 1)
  return (%3)
)");
  EXPECT_NE(got.find("fused (broadcast, recomputed per element)"), std::string::npos) << got;
  got = plan_text(R"(graph(%0 : f32[64,32], %1 : f32[32]):
  %2 : f32[32] = aten::mul.Scalar(%1, 2.0)
  %3 : f32[64,32] = aten::add.Tensor(%0, %2, 1)
  return (%3, %2)
)");
  EXPECT_NE(got.find("- aten::mul.Scalar %2: output shape [32] differs from the group's [64,32] and is used outside"),
            std::string::npos)
      << got;
}

TEST(Fusion, RuntimeScalarIsNotFusible) {
  std::string why;
  auto g = parse_graph(R"(graph(%0 : f32[4], %1 : int):
  %2 : f32[4] = aten::mul.Scalar(%0, %1)
  return (%2)
)");
  EXPECT_FALSE(can_fuse_node(*g->nodes()[0], &why));
  EXPECT_EQ(why, "argument 1 is computed at run time (%1), not a constant");
}

TEST(Fusion, BatchNormTrainingIsNotFusible) {
  std::string why;
  auto g = parse_graph(R"(graph(%0 : f32[2,3,4], %1 : f32[3]):
  %2 : f32[2,3,4] = aten::batch_norm(%0, %1, %1, %1, %1, True, 0.1, 1e-05, False)
  %3 : f32[2,3,4] = aten::batch_norm(%0, %1, %1, %1, %1, False, 0.1, 1e-05, False)
  return (%2, %3)
)");
  EXPECT_FALSE(can_fuse_node(*g->nodes()[0], &why));
  EXPECT_EQ(why, "batch_norm in training mode");
  EXPECT_TRUE(can_fuse_node(*g->nodes()[1], &why));
}

TEST(Fusion, IntegerDivisionByALiteralIsFusibleUnlessItCouldRaise) {
  auto g = parse_graph(R"(graph(%0 : i32[8], %1 : i32[8], %2 : i8[8]):
  %3 : i32[8] = aten::remainder.Scalar(%0, 5)
  %4 : i32[8] = aten::div.Scalar_mode(%0, -7, "floor")
  %5 : i32[8] = aten::fmod.Scalar(%0, 3)
  %6 : i8[8] = aten::remainder.Scalar(%2, 300)
  %7 : i32[8] = aten::remainder.Scalar(%0, 0)
  %8 : i32[8] = aten::div.Scalar_mode(%0, -1, "trunc")
  %9 : i8[8] = aten::fmod.Scalar(%2, 256)
  %10 : i32[8] = aten::remainder.Tensor(%0, %1)
  %11 : f32[8] = aten::remainder.Scalar(%0, 2.5)
  return (%3, %4, %5, %6, %7, %8, %9, %10, %11)
)");
  const auto& n = g->nodes();
  std::string why;
  for (int i : {0, 1, 2, 3, 8}) EXPECT_TRUE(can_fuse_node(*n[i], &why)) << i << ": " << why;
  EXPECT_FALSE(can_fuse_node(*n[4], &why));
  EXPECT_EQ(why, "integer remainder by zero: eager raises");
  EXPECT_FALSE(can_fuse_node(*n[5], &why));
  EXPECT_EQ(why, "integer div by -1 runs through ATen (the minimum value overflows)");
  EXPECT_FALSE(can_fuse_node(*n[6], &why));  // 256 is 0 as an int8
  EXPECT_EQ(why, "integer fmod by zero: eager raises");
  EXPECT_FALSE(can_fuse_node(*n[7], &why));
  EXPECT_EQ(why, "integer remainder by a tensor runs through ATen: eager raises on a zero divisor");
}

TEST(Fusion, IndependentGroupsOverOneShapeMergeSideBySide) {
  // An integer chain and an independent comparison of the same input: one kernel (Note [Horizontal
  // fusion]); with fusion disabled, one per op.
  const std::string ir = R"(graph(%0 : i32[64,128]):
  %1 : i32[64,128] = aten::mul.Scalar(%0, 3)
  %2 : i32[64,128] = aten::remainder.Scalar(%1, 5)
  %3 : i32[64,128] = aten::add.Scalar(%2, 1, 1)
  %4 : b8[64,128] = aten::gt.Scalar(%0, 2)
  return (%3, %4)
)";
  std::string text = plan_text(ir);
  EXPECT_EQ(text.find("group 1"), std::string::npos) << text;
  EXPECT_NE(text.find("group 0: 4 ops over [64,128]"), std::string::npos) << text;
  EXPECT_NE(text.find("+ aten::mul.Scalar %1 and 2 more ops, independent, over [64,128]: merged side by side"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("writes: %3 %4"), std::string::npos) << text;
  EXPECT_NE(plan_text(ir, false).find("group 3"), std::string::npos);
  std::string apart = plan_text(ir, true, false);  // FUSION_JIT_DISABLE=horizontal
  EXPECT_NE(apart.find("group 1: 1 op over [64,128]"), std::string::npos) << apart;
  EXPECT_EQ(apart.find("side by side"), std::string::npos) << apart;
  // Outputs in another layout: a merged kernel would walk one of them strided.
  std::string transposed = plan_text(R"(graph(%0 : f32[4,6,8], %1 : f32[4,6,8]{1,32,4}):
  %2 : f32[4,6,8] = aten::add.Tensor(%1, %1, 1)
  %3 : f32[4,6,8]{1,32,4} = aten::neg(%1)
  return (%2, %3)
)");
  EXPECT_NE(transposed.find("group 1"), std::string::npos) << transposed;
  // Nothing read in common: a launch is all a merge would save.
  std::string unrelated = plan_text(R"(graph(%0 : f32[4,6,8], %1 : f32[4,6,8]):
  %2 : f32[4,6,8] = aten::exp(%0)
  %3 : f32[4,6,8] = aten::neg(%1)
  return (%2, %3)
)");
  EXPECT_NE(unrelated.find("group 1"), std::string::npos) << unrelated;
  // A shared 0-d tensor is not worth a merge either.
  std::string scalar = plan_text(R"(graph(%0 : f32[4,6,8], %1 : f32[4,6,8], %2 : f32[]):
  %3 : f32[4,6,8] = aten::mul.Tensor(%0, %2)
  %4 : f32[4,6,8] = aten::add.Tensor(%1, %2, 1)
  return (%3, %4)
)");
  EXPECT_NE(scalar.find("group 1"), std::string::npos) << scalar;
}

TEST(Fusion, GroupsWithAPathBetweenThemOrOtherShapesStayApart) {
  // Both groups read %0, but group 1 reads the mm of group 0's output: merging would make a cycle. %7
  // reads %0 too but has another shape.
  std::string text = plan_text(R"(graph(%0 : f32[8,16], %1 : f32[16,16]):
  %2 : f32[8,16] = aten::relu(%0)
  %3 : f32[8,16] = aten::mm(%2, %1)
  %4 : f32[8,16] = aten::sigmoid(%3)
  %5 : f32[8,16] = aten::mul.Tensor(%4, %0)
  %6 : f32[8] = aten::select.int(%0, 1, 0)
  %7 : f32[8] = aten::exp(%6)
  return (%5, %7)
)");
  EXPECT_NE(text.find("group 0: 1 op over [8,16]"), std::string::npos) << text;
  EXPECT_NE(text.find("group 1: 2 ops over [8,16]"), std::string::npos) << text;
  EXPECT_NE(text.find("group 2: 1 op over [8]"), std::string::npos) << text;
  EXPECT_EQ(text.find("side by side"), std::string::npos) << text;
}

// Note [Concatenation in kernels]: rotary embedding's cat((-x2, x1)) is stored by the kernel that
// negates x2 (iterating over the items' shape), the list with it; its consumer, over the result's shape,
// is a kernel of its own and says why the cat did not join it.
TEST(Fusion, CatOfItemsOfOneShapeIsStoredByTheirKernel) {
  std::string text = plan_text(R"(graph(%0 : f32[4,16]):
  %1 : f32[4,8]{16,1} = aten::slice.Tensor(%0, 1, 8, 16, 1)
  %2 : f32[4,8] = aten::neg(%1)
  %3 : f32[4,8]{16,1} = aten::slice.Tensor(%0, 1, 0, 8, 1)
  %4 : Tensor[] = prim::ListConstruct(%2, %3)
  %5 : f32[4,16] = aten::cat(%4, -1)
  %6 : f32[4,16] = aten::mul.Tensor(%5, %0)
  return (%6)
)");
  EXPECT_NE(text.find("group 0: 2 ops over [4,8]"), std::string::npos) << text;
  EXPECT_NE(text.find("    prim::ListConstruct %4\n    aten::cat %5\n  reads: %1 %3\n  writes: %5"), std::string::npos)
      << text;
  EXPECT_NE(text.find("group 1: 1 op over [4,16]"), std::string::npos) << text;
  EXPECT_NE(text.find("aten::cat %5: aten::cat joins a kernel over its items' shape [4,8], not the group's [4,16]"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("aten: aten::cat"), std::string::npos) << text;
  // FUSION_JIT_DISABLE=cat: the list and the cat are ATen steps again.
  std::string off = plan_text(R"(graph(%0 : f32[4,8]):
  %1 : f32[4,8] = aten::neg(%0)
  %2 : Tensor[] = prim::ListConstruct(%1, %0)
  %3 : f32[4,16] = aten::cat(%2, -1)
  return (%3)
)", true, true, /*cat=*/false);
  EXPECT_NE(off.find("aten: prim::ListConstruct %2"), std::string::npos) << off;
  EXPECT_NE(off.find("aten: aten::cat %3: runs through ATen (FUSION_JIT_DISABLE=cat)"), std::string::npos) << off;
  // stack: the items' shape too; one item left by cat (the empty cache skipped) is a copy its consumer reads.
  text = plan_text(R"(graph(%0 : f32[4,8], %1 : f32[2,0,8], %2 : f32[2,4,8]):
  %3 : f32[4,8] = aten::relu(%0)
  %4 : f32[4,8] = aten::mul.Scalar(%0, 2.0)
  %5 : Tensor[] = prim::ListConstruct(%3, %4)
  %6 : f32[4,2,8] = aten::stack(%5, 1)
  %7 : f32[2,4,8] = aten::exp(%2)
  %8 : Tensor[] = prim::ListConstruct(%1, %7)
  %9 : f32[2,4,8] = aten::cat(%8, 1)
  %10 : f32[2,4,8] = aten::add.Scalar(%9, 1.0, 1)
  return (%6, %10)
)");
  EXPECT_NE(text.find("group 0: 3 ops over [4,8]"), std::string::npos) << text;
  EXPECT_NE(text.find("group 1: 3 ops over [2,4,8]"), std::string::npos) << text;
  EXPECT_EQ(text.find("aten: "), std::string::npos) << text;
}

TEST(Fusion, CatsThatCannotBeStoredByOneKernelRunThroughATenAndSayWhy) {
  std::string text = plan_text(R"(graph(%0 : f32[4,8], %1 : f32[2,8], %2 : i32[4,8]):
  %3 : f32[4,8] = aten::exp(%0)
  %4 : Tensor[] = prim::ListConstruct(%3, %1)
  %5 : f32[6,8] = aten::cat(%4, 0)
  %6 : Tensor[] = prim::ListConstruct(%3, %2)
  %7 : f32[8,8] = aten::cat(%6, 0)
  %8 : Tensor[] = prim::ListConstruct(%3, %3)
  %9 : f32[8,8] = aten::cat(%8, 0)
  %10 : f32[2,4,8] = aten::stack(%8, 0)
  return (%5, %7, %9, %10)
)");
  EXPECT_NE(text.find("aten: aten::cat %7: item 1 is i32, the result f32: runs through ATen"), std::string::npos)
      << text;
  EXPECT_NE(text.find("aten: aten::cat %9: its list is read by another node too"), std::string::npos) << text;
  EXPECT_NE(text.find("aten: aten::stack %10: its list is read by another node too"), std::string::npos) << text;
  EXPECT_NE(text.find("aten: prim::ListConstruct %8"), std::string::npos) << text;
}

// Note [Cats of unequal items]: a cat of items of unequal sizes is one kernel over its result with its
// items' producers and its consumers; a producer feeding two items, one read by others, and a second
// such cat stay apart, and the decisions say why.
TEST(Fusion, CatOfUnequalItemsIsOneKernelOverItsResult) {
  std::string text = plan_text(R"(graph(%0 : f32[4,8], %1 : f32[2,8]):
  %2 : f32[4,8] = aten::exp(%0)
  %3 : Tensor[] = prim::ListConstruct(%2, %1)
  %4 : f32[6,8] = aten::cat(%3, 0)
  %5 : f32[6,8] = aten::relu(%4)
  return (%5)
)");
  EXPECT_NE(text.find("group 0: 3 ops over [6,8]"), std::string::npos) << text;
  EXPECT_EQ(text.find("aten: "), std::string::npos) << text;
  text = plan_text(R"(graph(%0 : f32[4,8], %1 : f32[2,8], %2 : f32[8,8]):
  %3 : f32[2,8] = aten::exp(%1)
  %4 : Tensor[] = prim::ListConstruct(%0, %3, %3)
  %5 : f32[8,8] = aten::cat(%4, 0)
  %6 : f32[2,8] = aten::neg(%1)
  %7 : Tensor[] = prim::ListConstruct(%0, %6)
  %8 : f32[6,8] = aten::cat(%7, 0)
  %9 : f32[2,8] = aten::mm(%6, %2)
  %10 : Tensor[] = prim::ListConstruct(%1, %0)
  %11 : f32[6,8] = aten::cat(%10, 0)
  %12 : f32[6,8] = aten::add.Tensor(%8, %11, 1)
  return (%5, %9, %12)
)");
  EXPECT_NE(text.find("aten::exp %3: aten::exp %3 computes two items of cats of unequal items"), std::string::npos)
      << text;
  EXPECT_NE(text.find("aten::neg %6: aten::neg %6 computes item 1 of aten::cat %8 and is read by others"),
            std::string::npos) << text;
  EXPECT_NE(text.find("are cats of unequal items apart: one per kernel"), std::string::npos) << text;
  EXPECT_EQ(text.find("aten: aten::cat"), std::string::npos) << text;
}

TEST(Fusion, DisabledGivesOneGroupPerOp) {
  std::string got = plan_text(R"(graph(%0 : f32[32]):
  %1 : f32[32] = aten::exp(%0)
  %2 : f32[32] = aten::neg(%1)
  return (%2)
)",
                              false);
  EXPECT_NE(got.find("group 0: 1 op"), std::string::npos) << got;
  EXPECT_NE(got.find("group 1: 1 op"), std::string::npos) << got;
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

const char* kSoftmax = R"(graph(%0 : f32[256,1024], %1 : f32[256,1024]):
  %2 : f32[256,1024] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[256,1] = aten::amax(%2, [1], True)
  %4 : f32[256,1024] = aten::sub.Tensor(%2, %3, 1)
  %5 : f32[256,1024] = aten::exp(%4)
  %6 : f32[256,1] = aten::sum.dim_IntList(%5, [1], True, None)
  %7 : f32[256,1024] = aten::div.Tensor(%5, %6)
  return (%7)
)";

TEST(FusionReductions, MaskedSoftmaxIsOneGroupWithThreePasses) {
  auto g = parse_graph(kSoftmax);
  RooflineCostModel cost(DeviceDescription{"test-cpu", 40.0, 100.0, 2.0, 0.95, 2});
  FusionPlan p = plan_fusion(*g, cost);
  ASSERT_EQ(p.groups.size(), 1u) << explain_plan(p);
  ASSERT_TRUE(p.groups[0].reduction.has_value());
  EXPECT_EQ(p.groups[0].reduction->passes, 3);
  EXPECT_EQ(p.groups[0].reduction->dims, std::vector<int64_t>{1});
  EXPECT_EQ(p.groups[0].reduction->row_values.size(), 2u);  // max and sum
  EXPECT_NE(explain_plan(p).find("persistent row: 3 passes over a row of 8.0 KB kept on chip"), std::string::npos)
      << explain_plan(p);
}

TEST(FusionReductions, RowsLargerThanTheChipAreChargedAReadPerPass) {
  auto g = parse_graph(kSoftmax);
  DeviceDescription d{"tiny-chip", 40.0, 100.0, 2.0, 0.95, 2};
  d.on_chip_row_bytes = 1024;  // rows of 8 KB do not fit
  RooflineCostModel cost(d);
  std::string text = explain_plan(plan_fusion(*g, cost));
  EXPECT_NE(text.find("larger than the 1.0 KB on chip: each pass reads them again"), std::string::npos) << text;
}

TEST(FusionReductions, ReductionsOverOtherDimsStayApartAndSayWhy) {
  auto g = parse_graph(R"(graph(%0 : f32[64,32]):
  %1 : f32[64,1] = aten::sum.dim_IntList(%0, [1], True, None)
  %2 : f32[64,32] = aten::div.Tensor(%0, %1)
  %3 : f32[32] = aten::sum.dim_IntList(%2, [0], False, None)
  return (%3)
)");
  RooflineCostModel cost(DeviceDescription{"test-cpu", 40.0, 100.0, 2.0, 0.95, 2});
  FusionPlan p = plan_fusion(*g, cost);
  EXPECT_EQ(p.groups.size(), 2u) << explain_plan(p);
  EXPECT_NE(explain_plan(p).find("reduces [64,32] over dims [0], the group reduces [64,32] over dims [1]"),
            std::string::npos)
      << explain_plan(p);
}

TEST(FusionReductions, MeanAndVarOfOneInputShareAKernel) {
  auto g = parse_graph(R"(graph(%0 : f32[64,32]):
  %1 : f32[64] = aten::mean.dim(%0, [1], False, None)
  %2 : f32[64] = aten::var.correction(%0, [1], 1, False)
  return (%1, %2)
)");
  RooflineCostModel cost(DeviceDescription{"test-cpu", 40.0, 100.0, 2.0, 0.95, 2});
  FusionPlan p = plan_fusion(*g, cost);
  ASSERT_EQ(p.groups.size(), 1u) << explain_plan(p);
  EXPECT_EQ(p.groups[0].reduction->passes, 1);
  EXPECT_EQ(p.groups[0].outputs.size(), 2u);
}

TEST(FusionReductions, RowValueReadAcrossTheRowsIsRefused) {
  // sum over dim 0 without keepdim gives [32], which broadcasts along dim 1 of [32,32]: not the row's dim.
  auto g = parse_graph(R"(graph(%0 : f32[32,32]):
  %1 : f32[32] = aten::sum.dim_IntList(%0, [1], False, None)
  %2 : f32[32,32] = aten::mul.Tensor(%0, %1)
  return (%2)
)");
  RooflineCostModel cost(DeviceDescription{"test-cpu", 40.0, 100.0, 2.0, 0.95, 2});
  FusionPlan p = plan_fusion(*g, cost);
  EXPECT_EQ(p.groups.size(), 2u) << explain_plan(p);
  EXPECT_NE(explain_plan(p).find("across the rows"), std::string::npos) << explain_plan(p);
}

}  // namespace
}  // namespace fusion_jit
