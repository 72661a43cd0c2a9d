// Work estimation (cost/work.h) and the roofline model (cost/cost_model.h), without the fuser's search.
#include <gtest/gtest.h>

#include "cost/cost_model.h"
#include "cost/work.h"
#include "fusion/fusion.h"

namespace fusion_jit {
namespace {

std::vector<const Node*> all_nodes(const Graph& g) {
  std::vector<const Node*> out;
  for (const Node* n : g.nodes()) out.push_back(n);
  return out;
}

TEST(Work, ExpensiveOpsCostTwentyFlopsByTheirFlag) {
  auto g = parse_graph(R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::exp(%0)
  %2 : f32[4] = aten::add.Tensor(%1, %1, 1)
  %3 : f32[4] = aten::fmod.Scalar(%2, 2.0)
  %4 : f32[4] = aten::cumsum(%3, 0, None)
  return (%4)
)");
  auto ns = g->nodes();
  EXPECT_EQ(op_flops(*ns[0]), 20);
  EXPECT_EQ(op_flops(*ns[1]), 1);
  EXPECT_EQ(op_flops(*ns[2]), 20);
  EXPECT_EQ(op_flops(*ns[3]), 1);  // not in the table: one flop per element
}

TEST(Work, NodeAloneReadsEachInputOnceAndWritesItsOutput) {
  auto g = parse_graph(R"(graph(%0 : f32[64,128], %1 : f16[128]):
  %2 : f32[64,128] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[64,128] = aten::mul.Tensor(%2, %2)
  return (%3)
)");
  WorkEstimate add = node_work(*g->nodes()[0]);
  EXPECT_EQ(add.bytes, 32768 + 256 + 32768);
  EXPECT_EQ(add.flops, 8192);
  EXPECT_EQ(add.launches, 1);
  WorkEstimate square = node_work(*g->nodes()[1]);
  EXPECT_EQ(square.bytes, 32768 + 32768);  // %2 read once
}

TEST(Work, KernelCountsOutsideReadsAndItsWrites) {
  auto g = parse_graph(R"(graph(%0 : f32[64,128], %1 : f32[128]):
  %2 : f32[64,128] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[64,128] = aten::gelu(%2, "none")
  %4 : f32[64,128] = aten::add.Tensor(%3, %0, 1)
  return (%4, %2)
)");
  KernelSketch k{all_nodes(*g), {64, 128}, {g->outputs()[0], g->outputs()[1]}, std::nullopt};
  WorkEstimate w = kernel_work(k, host_cpu_description());
  EXPECT_EQ(w.bytes, 32768 + 512 + 2 * 32768);  // %0 and %1 in, %4 and %2 out
  EXPECT_EQ(w.flops, (1 + 20 + 1) * 8192);
  EXPECT_EQ(w.launches, 1);
  // The same ops apart: every intermediate is written and read again, three launches.
  WorkEstimate apart;
  for (const Node* n : g->nodes()) apart += node_work(*n);
  EXPECT_EQ(apart.launches, 3);
  EXPECT_GT(apart.bytes, w.bytes);
  RooflineCostModel cost(DeviceDescription{"test-cpu", 40.0, 100.0, 2.0, 0.95, 2});
  EXPECT_LT(cost.estimate_us(w), cost.estimate_us(apart));
}

const char* kSoftmax = R"(graph(%0 : f32[256,1024], %1 : f32[256,1024]):
  %2 : f32[256,1024] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[256,1] = aten::amax(%2, [1], True)
  %4 : f32[256,1024] = aten::sub.Tensor(%2, %3, 1)
  %5 : f32[256,1024] = aten::exp(%4)
  %6 : f32[256,1] = aten::sum.dim_IntList(%5, [1], True, None)
  %7 : f32[256,1] = aten::log(%6)
  %8 : f32[256,1024] = aten::sub.Tensor(%4, %7, 1)
  return (%8)
)";

TEST(Work, RowsThatDoNotFitOnChipAreReadAgainEachPass) {
  auto g = parse_graph(kSoftmax);
  auto nodes = all_nodes(*g);
  std::set<const Value*> writes{g->outputs()[0]};
  auto form = reduction_form(nodes, writes, nullptr);
  ASSERT_TRUE(form.has_value());
  ASSERT_EQ(form->passes, 3);
  RowWalk rows{&form->shape, &form->dims, &form->row_values, form->passes, form->row_len};
  EXPECT_EQ(row_input_bytes(nodes, rows), 2 * 4 * 1024);  // %0 and %1 vary along the row
  KernelSketch k{nodes, form->shape, writes, rows};

  DeviceDescription big{"big-chip", 40.0, 100.0, 2.0, 0.95, 2};
  EXPECT_TRUE(row_fits_on_chip(8192, big));
  WorkEstimate kept = kernel_work(k, big);
  EXPECT_EQ(kept.bytes, 3 * 256 * 1024 * 4);  // two inputs, one output
  // log runs once per row, exp per element.
  const int64_t numel = 256 * 1024;
  EXPECT_EQ(kept.flops, numel * (1 + 1 + 1 + 20 + 1 + 1) + 256 * 20);

  DeviceDescription tiny = big;
  tiny.on_chip_row_bytes = 1024;
  EXPECT_FALSE(row_fits_on_chip(8192, tiny));
  WorkEstimate reread = kernel_work(k, tiny);
  EXPECT_EQ(reread.bytes - kept.bytes, 2 * 8192 * 256);  // two more passes over 256 rows of 8 KB
  EXPECT_EQ(reread.flops, kept.flops);
}

TEST(CostModel, RooflineOverlapsComputeAndMemory) {
  RooflineCostModel cost(DeviceDescription{"test", 1.0, 1.0, 2.0, 0.5, 1});
  WorkEstimate w;
  w.bytes = 3000;   // 3 us at 1 GB/s
  w.flops = 1000;   // 1 us at 1 GFLOP/s
  w.launches = 2;
  EXPECT_DOUBLE_EQ(cost.estimate_us(w), 3.0 + 1.0 - 0.5 * 1.0 + 2 * 2.0);
}

// Note [Channels-last activations]: the layout decision's estimate is the cost model's, each term linear in
// what it counts with the device's calibration constants.
TEST(CostModel, ChannelsLastEstimateIsLinearInEachTerm) {
  DeviceDescription d;
  d.cl_gain_ns_per_written = 2.0;
  d.cl_ns_per_weight = 3.0;
  d.cl_ns_per_copied = 5.0;
  d.cl_ns_per_edge = 7.0;
  const LayoutEstimate e = channels_last_estimate(d, 1000, 100, 10, 1);
  EXPECT_DOUBLE_EQ(e.gain_us, 2.0);
  EXPECT_DOUBLE_EQ(e.cost_us, (300.0 + 50.0 + 7.0) / 1000.0);
  const LayoutEstimate none = channels_last_estimate(host_cpu_description(), 0, 0, 0, 0);
  EXPECT_EQ(none.gain_us, 0.0);
  EXPECT_EQ(none.cost_us, 0.0);
}

}  // namespace
}  // namespace fusion_jit
