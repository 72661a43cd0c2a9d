// Every op of the table against eager PyTorch: every dtype it accepts, broadcasting, transposed, sliced
// (storage offset) and expanded inputs, 0-d tensors, size-0 and size-1 dims, and NaN, +-Inf, +-0 values.
//
// One module per (op, dtype) applies the op to every layout at once, so each case costs one compile.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "op_corpus.h"

namespace fusion_jit::testing {
namespace {

class OpsTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpsTest, MatchesEager) {
  const OpCase& c = GetParam();
  auto m = corpus_module(c);
  for (at::ScalarType t : dtypes_of(c.dtypes)) {
    std::vector<c10::IValue> inputs = corpus_inputs(c, t);
    std::string what = std::string(c.name) + " " + c10::toString(t);
    RunResult r = run_and_compare(m, inputs, what);
    ASSERT_NE(r.plan, nullptr) << what << " ran eagerly";
    if (c.ints_via_aten && at::isIntegralType(t, true)) {
      EXPECT_TRUE(r.plan->kernels.empty()) << what << ": integer division must run through ATen";
    } else {
      EXPECT_FALSE(r.plan->kernels.empty()) << what << ": no fused kernel\n" << r.plan->explain();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpsTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return std::string(i.param.name); });

TEST(BatchNorm, InferenceIsFusedAndMatchesEager) {
  auto m = script("x, w, b, mean, var",
                  "    y = torch.batch_norm(x, w, b, mean, var, False, 0.1, 1e-5, False)\n    return torch.relu(y)");
  for (at::ScalarType t : {at::kFloat, at::kDouble}) {
    at::manual_seed(0);
    std::vector<c10::IValue> in{at::randn({2, 3, 4, 5}, t), at::randn({3}, t), at::randn({3}, t), at::randn({3}, t),
                                at::rand({3}, t) + 0.5};
    auto r = run_and_compare(m, in, "batch_norm");
    ASSERT_NE(r.plan, nullptr);
    EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
    EXPECT_EQ(r.plan->fused_ops, 2);
  }
  // channels-last input
  at::Tensor x = at::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  run_and_compare(m, {x, at::randn({3}), at::randn({3}), at::randn({3}), at::rand({3}) + 0.5}, "batch_norm NHWC");
}

}  // namespace
}  // namespace fusion_jit::testing
