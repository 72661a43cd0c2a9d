// The time model (Note [Kernel times], cost/kernel_time.h) and the facts it reads of a plan's kernels and
// ATen steps (driver/predict.h), against figures and counts worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "cost/kernel_time.h"
#include "driver/build_plan.h"
#include "plan_of.h"
#include "driver/predict.h"
#include "driver/step_times.h"
#include "kernels_cache/kernels_cache.h"
#include "runtime/profile.h"

namespace fusion_jit {
namespace {

// Round figures: 100 GB/s at 1 MB and below on one thread (200 split), 10 GB/s from 100 MB up (20 split).
TimeFigures round_figures() {
  TimeFigures f = time_figures(std::nullopt, 2, 1000);
  f.streams = {{1 << 20, 100.0, 200.0}, {100 << 20, 10.0, 20.0}};
  f.kernel_us = 0.5;
  f.parallel_kernel_us = 3.5;
  f.kernel_step_us = 1.0 + static_cast<double>(kStepProbeBytes) / (100.0 * 1e3);  // 1 us beyond its probe's bytes
  f.aten_step_us = 2.0 + static_cast<double>(kStepProbeBytes) / (100.0 * 1e3);
  f.gemm_gflops = 100.0;
  f.conv_step_us = 5.0;
  f.op_ns = {{"exp", 1.0}, {"sqrt", 0.5}};
  return f;
}

using test_support::plan_of;

TEST(KernelTime, BandwidthIsInterpolatedInLogBytesAndFlatBeyondThePoints) {
  const TimeFigures f = round_figures();
  EXPECT_DOUBLE_EQ(bandwidth_gbps(f, 1024, false), 100.0);
  EXPECT_DOUBLE_EQ(bandwidth_gbps(f, int64_t{1} << 40, true), 20.0);
  // 10 MB lies halfway between 1 MB and 100 MB in log(bytes).
  EXPECT_NEAR(bandwidth_gbps(f, int64_t{10} << 20, false), 55.0, 1e-9);
  EXPECT_NEAR(bandwidth_gbps(f, int64_t{10} << 20, true), 110.0, 1e-9);
}

TEST(KernelTime, AKernelIsItsStepItsTrafficAndItsOpClassesSplitAcrossThePool) {
  const TimeFigures f = round_figures();
  KernelFacts small;  // 500 elements: one chunk of the grain (1000), serial
  small.range = 500;
  small.bytes = 4000;
  small.op_counts = {{"exp", 500}, {"unknown", 500}};
  TimePrediction p = predict_kernel(small, f);
  EXPECT_EQ(p.threads, 1);
  EXPECT_NEAR(p.dispatch_us, 1.0, 1e-9);
  EXPECT_NEAR(p.memory_us, 4000 / 100e3, 1e-12);
  EXPECT_NEAR(p.compute_us, 0.5, 1e-12);  // 500 exps at 1 ns; unknown classes are free
  EXPECT_NEAR(p.us, p.dispatch_us + p.memory_us + p.compute_us, 1e-12);

  KernelFacts big = small;  // 100,000 elements: split, two threads
  big.range = 100000;
  big.bytes = int64_t{1} << 30;
  big.op_counts = {{"exp", 100000}};
  p = predict_kernel(big, f);
  EXPECT_EQ(p.threads, 2);
  EXPECT_NEAR(p.dispatch_us, 1.0 + 3.0, 1e-9);  // the step plus what splitting adds
  EXPECT_NEAR(p.memory_us, static_cast<double>(int64_t{1} << 30) / 20e3, 1e-6);
  EXPECT_NEAR(p.compute_us, 100000 * 1.0 / 2 / 1e3, 1e-9);

  // A reduction splits rows: 4 rows of 400 are 1,600 elements but one row per chunk of 1000 elements.
  KernelFacts rows;
  rows.range = 4;
  rows.elements_per_unit = 400;
  rows.bytes = 6400;
  rows.reread_bytes = 6400;
  rows.row_bytes = 1600;
  p = predict_kernel(rows, f);
  EXPECT_EQ(p.threads, 2);
  EXPECT_NEAR(p.memory_us, 6400 / 200e3 + 6400 / 200e3, 1e-12);
}

TEST(KernelTime, AnAtenStepIsItsDispatchAndItsBytesOrFlopsWhicheverIsLonger) {
  const TimeFigures f = round_figures();
  StepFacts view;
  view.view = true;
  view.bytes = 1 << 20;
  EXPECT_NEAR(predict_aten_step(view, f).us, 2.0, 1e-9);
  StepFacts copy;
  copy.bytes = 1 << 20;
  EXPECT_NEAR(predict_aten_step(copy, f).us, 2.0 + (1 << 20) / 200e3, 1e-9);
  StepFacts gemm;
  gemm.compute = true;
  gemm.flops = 2e9;
  gemm.bytes = 1 << 20;
  EXPECT_NEAR(predict_aten_step(gemm, f).us, 2.0 + 2e9 / 100e3, 1e-6);
  StepFacts gemv = gemm;  // bytes dominate
  gemv.flops = 2e3;
  gemv.bytes = int64_t{1} << 30;
  EXPECT_NEAR(predict_aten_step(gemv, f).us, 2.0 + static_cast<double>(int64_t{1} << 30) / 20e3, 1e-6);
  StepFacts conv = gemm;
  conv.conv = true;
  EXPECT_NEAR(predict_aten_step(conv, f).us, 2.0 + 2e9 / 100e3 + 5.0, 1e-6);
}

TEST(KernelTime, OpClassesOfKernelCalls) {
  EXPECT_EQ(op_classes_of_call("fj_exp"), std::vector<std::string>{"exp"});
  EXPECT_EQ(op_classes_of_call("fj_gelu_as"), std::vector<std::string>{"erf"});
  EXPECT_EQ(op_classes_of_call("fj_silu"), std::vector<std::string>{"sigmoid"});
  EXPECT_EQ(op_classes_of_call("fj_softplus"), (std::vector<std::string>{"exp", "log"}));
  EXPECT_TRUE(op_classes_of_call("fj_add").empty());
}

TEST(KernelTime, FactsOfAPointwiseKernelCountEachBufferOnceAndItsCallsPerElement) {
  // exp(x) * sqrt(b), b broadcast along the rows: 64x32 floats in and out, 32 of b.
  auto p = plan_of(
      "graph(%0 : f32[64,32], %1 : f32[32]):\n"
      "  %2 : f32[64,32] = aten::exp(%0)\n"
      "  %3 : f32[32] = aten::sqrt(%1)\n"
      "  %4 : f32[64,32] = aten::mul.Tensor(%2, %3)\n"
      "  return (%4)\n");
  ASSERT_EQ(p->kernels.size(), 1u);
  const KernelFacts k = kernel_facts(p->kernels[0].spec, p->kernels[0].calls);
  EXPECT_EQ(k.range, 64 * 32);
  EXPECT_EQ(k.elements_per_unit, 1);
  EXPECT_EQ(k.bytes, (64 * 32 * 2 + 32) * 4);
  EXPECT_EQ(k.op_counts.at("exp"), 64 * 32);
  EXPECT_EQ(k.op_counts.at("sqrt"), 64 * 32);  // the sqrt of a broadcast row is computed per element
  EXPECT_EQ(k.reread_bytes, 0);
}

TEST(KernelTime, FactsOfASoftmaxKernelCountTheRowsReadAgainByLaterPasses) {
  auto p = plan_of(
      "graph(%0 : f32[16,256]):\n"
      "  %1 : f32[16,1] = aten::amax(%0, [1], True)\n"
      "  %2 : f32[16,256] = aten::sub.Tensor(%0, %1, 1)\n"
      "  %3 : f32[16,256] = aten::exp(%2)\n"
      "  %4 : f32[16,1] = aten::sum.dim_IntList(%3, [1], True, None)\n"
      "  %5 : f32[16,256] = aten::div.Tensor(%3, %4)\n"
      "  return (%5)\n");
  ASSERT_EQ(p->kernels.size(), 1u);
  const KernelSpec& spec = p->kernels[0].spec;
  ASSERT_TRUE(spec.is_reduction());
  const KernelFacts k = kernel_facts(spec, p->kernels[0].calls);
  EXPECT_EQ(k.range, 16);
  EXPECT_EQ(k.elements_per_unit, 256);
  EXPECT_EQ(k.bytes, 2 * 16 * 256 * 4);
  EXPECT_EQ(k.row_bytes, 256 * 4);
  // Every pass after the first that loads the input reads each row again.
  int later_loads = 0;
  for (size_t i = 1; i < spec.passes.size(); ++i)
    for (int b : spec.passes[i].loads) later_loads += b == 0;
  EXPECT_GE(spec.passes.size(), 2u);
  EXPECT_EQ(k.reread_bytes, later_loads * 16 * 256 * 4);
  EXPECT_GE(k.op_counts.at("exp"), 16 * 256);
}

TEST(KernelTime, FactsOfAtenStepsViewsCopiesAndFlops) {
  auto p = plan_of(
      "graph(%0 : f32[8,16], %1 : f32[16,32], %2 : f32[4,8,6,6], %3 : f32[2,8,3,3]):\n"
      "  %4 : f32[8,32] = aten::mm(%0, %1)\n"
      "  %5 : f32[16,8]{1,16} = aten::transpose.int(%0, 0, 1)\n"
      "  %6 : f32[128] = aten::reshape(%5, [128])\n"
      "  %7 : f32[2,64] = aten::reshape(%0, [2, 64])\n"
      "  %8 : f32[4,2,4,4] = aten::conv2d(%2, %3, None, [1, 1], [0, 0], [1, 1], 1)\n"
      "  return (%4, %6, %7, %8)\n");
  const Node *mm = nullptr, *transpose = nullptr, *copy = nullptr, *view = nullptr, *conv = nullptr;
  for (const ExecStep& st : p->steps) {
    if (st.kernel >= 0) continue;
    const std::string& s = st.node->schema();
    if (s == "aten::mm") mm = st.node;
    if (s == "aten::transpose.int") transpose = st.node;
    if (s == "aten::reshape") (st.node->output()->name() == "%6" ? copy : view) = st.node;
    if (s == "aten::conv2d") conv = st.node;
  }
  ASSERT_TRUE(mm && transpose && copy && view && conv);
  StepFacts f = aten_step_facts(*mm);
  EXPECT_TRUE(f.compute);
  EXPECT_DOUBLE_EQ(f.flops, 2.0 * 8 * 32 * 16);
  EXPECT_EQ(f.bytes, (8 * 16 + 16 * 32 + 8 * 32) * 4);
  EXPECT_TRUE(aten_step_facts(*transpose).view);
  EXPECT_FALSE(aten_step_facts(*copy).view) << "a transposed tensor reshaped flat is a copy";
  EXPECT_TRUE(aten_step_facts(*view).view) << "a contiguous one is a view";
  f = aten_step_facts(*conv);
  EXPECT_TRUE(f.compute && f.conv);
  EXPECT_DOUBLE_EQ(f.flops, 2.0 * (4 * 2 * 4 * 4) * (8 * 3 * 3));
}

TEST(KernelTime, APlanIsPricedStepByStepUnderTheNamesItsProfileUses) {
  auto p = plan_of(
      "graph(%0 : f32[8,16], %1 : f32[16,32]):\n"
      "  %2 : f32[8,16] = aten::exp(%0)\n"
      "  %3 : f32[8,32] = aten::mm(%2, %1)\n"
      "  %4 : f32[8,32] = aten::relu(%3)\n"
      "  return (%4)\n");
  const std::vector<StepPrediction> steps = predict_plan(*p, round_figures());
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].kind, "kernel");
  EXPECT_EQ(steps[0].name, p->kernels[0].spec.name);
  EXPECT_EQ(steps[1].kind, "aten");
  EXPECT_EQ(steps[1].name, "%3");
  EXPECT_EQ(steps[1].op, "aten::mm");
  for (const StepPrediction& s : steps) {
    EXPECT_EQ(s.name, step_name(*p, s.step));
    EXPECT_GT(s.time.us, 0);
    EXPECT_TRUE(std::isfinite(s.time.us));
  }
}

// Note [Measured step times]: an ATen step measured once is priced by its measurement; the record is
// hostile input.
TEST(KernelTime, AnAtenStepMeasuredBeforeIsPricedByItsMeasurement) {
  const char* ir =
      "graph(%0 : f32[8,16], %1 : f32[16,32]):\n"
      "  %2 : f32[8,16] = aten::exp(%0)\n"
      "  %3 : f32[8,32] = aten::mm(%2, %1)\n"
      "  %4 : f32[8,32] = aten::relu(%3)\n"
      "  return (%4)\n";
  auto p = plan_of(ir);
  const Node* mm = p->steps.at(1).node;
  ASSERT_TRUE(mm && mm->schema() == "aten::mm");
  EXPECT_EQ(aten_step_signature(*mm), "aten::mm(f32[8,16], f32[16,32])");

  char tmpl[] = "/tmp/fj-step-times-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string previous = KernelsCache::instance().dir();
  KernelsCache::use_dir(tmpl);
  forget_step_times();
  EXPECT_TRUE(stored_step_times().empty());
  const TimeFigures f = round_figures();
  const double modelled = predict_plan(*p, f).at(1).time.us;
  store_step_times({{aten_step_signature(*mm), 123.5}});
  forget_step_times();  // read back from the cache, as a later process would
  EXPECT_EQ(stored_step_times().at("aten::mm(f32[8,16], f32[16,32])"), 123.5);
  const std::vector<StepPrediction> steps = predict_plan(*p, f);
  EXPECT_TRUE(steps.at(1).measured);
  EXPECT_EQ(steps.at(1).time.us, 123.5);
  EXPECT_NE(steps.at(1).time.us, modelled);
  EXPECT_FALSE(steps.at(0).measured) << "kernels are always the model's";

  std::string why;
  const std::string good = step_times_to_json({{"aten::mm(f32[2,2], f32[2,2])", 3.0}});
  ASSERT_TRUE(step_times_from_json(good, &why)) << why;
  auto refused = [&](const std::string& from, const std::string& to, const std::string& reason) {
    std::string text = good;
    ASSERT_NE(text.find(from), std::string::npos) << from << " in " << text;
    text.replace(text.find(from), from.size(), to);
    std::string w;
    EXPECT_FALSE(step_times_from_json(text, &w)) << text;
    EXPECT_NE(w.find(reason), std::string::npos) << w;
  };
  refused(":3.0}", ":-3.0}", "out of range");
  refused(":3.0}", ":1e300}", "out of range");
  refused(":3.0}", ":\"3\"}", "out of range");
  refused("\"format\":1", "\"format\":2", "format");
  refused("\"machine\":\"", "\"machine\":\"another ", "another machine");
  EXPECT_FALSE(step_times_from_json("[]", &why));
  // A damaged record in the cache is not used.
  KernelsCache::instance().put(step_times_key(), "{\"format\": 1}");
  forget_step_times();
  EXPECT_TRUE(stored_step_times().empty());
  KernelsCache::use_dir(previous.empty() ? std::string(tmpl) : previous);
  forget_step_times();
  std::system((std::string("rm -rf ") + tmpl).c_str());
}

TEST(KernelTime, StepRecordingKeepsEachCallsTimeByPlanAndStep) {
  profile_reset();
  int plan = 0;
  record_step_time(&plan, 2, 1500);
  record_step_time(&plan, 2, 2500);
  const StepTimes t = step_times_snapshot();
  ASSERT_EQ(t.count(&plan), 1u);
  EXPECT_EQ(t.at(&plan).at(2), (std::vector<int64_t>{1500, 2500}));
  profile_reset();
  EXPECT_TRUE(step_times_snapshot().empty());
  EXPECT_FALSE(step_recording());
}

}  // namespace
}  // namespace fusion_jit
