// Every op of the table against eager PyTorch: every dtype it accepts (its first in every run, the others
// in a sample that changes daily: sampling.h), broadcasting, transposed, sliced
// (storage offset) and expanded inputs, 0-d tensors, size-0 and size-1 dims, and NaN, +-Inf, +-0 values.
//
// One module per (op, dtype) applies the op to every layout at once, so each case costs one compile.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/csrc/jit/passes/inliner.h>

#include <cstring>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "fusion/fusion.h"
#include "gather_corpus.h"
#include "ir/op_table.h"
#include "op_corpus.h"
#include "reduction_corpus.h"
#include "runtime/memory_plan.h"
#include "sampling.h"
#include "torch/capture.h"
#include "torch/executor.h"

namespace fusion_jit::testing {
namespace {

// The op table's alias and mutation facts (ir/ops.def: kReturnsAlias; every op pure), which the memory
// plan reads instead of the dispatcher's schemas (TableOpFacts), are the dispatcher's for every op of it.
TEST(OpTable, AliasAndMutationFactsAreTheDispatchersForEveryOp) {
  const OpFacts& table = plan_op_facts();
  const OpFacts& dispatcher = dispatcher_op_facts();
  int aliases = 0;
  for (const OpInfo& op : all_ops()) {
    Graph g;
    TensorType t;
    t.sizes = {2};
    t.strides = {1};
    Node* n = g.append(op.schema, {}, {ValueType{t, ""}});
    ASSERT_EQ(n->op(), &op) << op.schema;
    EXPECT_EQ(table.returns_alias(*n), dispatcher.returns_alias(*n)) << op.schema;
    EXPECT_EQ(table.may_mutate(*n), dispatcher.may_mutate(*n)) << op.schema;
    aliases += table.returns_alias(*n);
  }
  EXPECT_GE(aliases, 12);  // the views, reshape and contiguous at least
}

class OpsTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpsTest, MatchesEager) {
  const OpCase& c = GetParam();
  auto m = corpus_module(c);
  for (at::ScalarType t : sample_of(std::string("ops/") + c.name, dtypes_of(c.dtypes))) {
    std::vector<c10::IValue> inputs = corpus_inputs(c, t);
    std::string what = std::string(c.name) + " " + c10::toString(t);
    RunResult r = run_and_compare(m, inputs, what);
    ASSERT_NE(r.plan, nullptr) << what << " ran eagerly";
    if (c.ints_via_aten && at::isIntegralType(t, true)) {
      EXPECT_TRUE(r.plan->kernels.empty()) << what << ": integer division must run through ATen";
    } else if (r.plan->explain().find("views.identity") != std::string::npos) {
      // A cast to the input's own dtype: eager returns the input itself, and so does the plan.
      ASSERT_EQ(r.fused.size(), r.eager.size()) << what;
      for (size_t i = 0; i < r.fused.size(); ++i)
        for (const c10::IValue& in : inputs) {
          if (!in.isTensor()) continue;
          EXPECT_EQ(r.fused[i].is_same(in.toTensor()), r.eager[i].is_same(in.toTensor())) << what << ": output " << i;
        }
    } else {
      EXPECT_FALSE(r.plan->kernels.empty()) << what << ": no fused kernel\n" << r.plan->explain();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpsTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return std::string(i.param.name); });

// Integer division by literals in every integer dtype, over the dtype's whole range where it is small (the
// minimum included): the literal is converted to the dtype as eager converts it (300 is 44 in 8 bits). The
// chain and the independent comparison of the same input run as one kernel (Note [Horizontal fusion]).
TEST(IntegerDivision, ByALiteralIsFusedAndMatchesEagerInEveryIntegerDtype) {
  auto m = script("x",
                  "    y = torch.remainder(x, 300) + torch.div(x, -7, rounding_mode='floor') * 2\n"
                  "    z = y - torch.fmod(x, 5) + torch.div(x, 3, rounding_mode='trunc')\n"
                  "    return z, x > 2");
  for (at::ScalarType t : {at::kByte, at::kChar, at::kShort, at::kInt, at::kLong}) {
    at::Tensor x;
    if (t == at::kByte) x = at::arange(0, 256, at::kInt).to(t);
    else if (t == at::kChar) x = at::arange(-128, 128, at::kInt).to(t);
    else {
      at::manual_seed(3);
      x = at::randint(-100000, 100000, {4, 300}, at::kLong).to(t);
      x.view(-1)[0] = t == at::kShort ? -32768 : t == at::kInt ? INT32_MIN : INT64_MIN;
      x.view(-1)[1] = t == at::kShort ? 32767 : t == at::kInt ? INT32_MAX : INT64_MAX;
    }
    std::string what = std::string("integer division ") + c10::toString(t);
    auto r = run_and_compare(m, {x}, what);
    ASSERT_NE(r.plan, nullptr) << what;
    EXPECT_EQ(r.plan->kernels.size(), 1u) << what << "\n" << r.plan->explain();
    for (size_t i = 0; i < r.fused.size(); ++i)
      EXPECT_TRUE(r.fused[i].equal(r.eager[i])) << what << ": output " << i << " not exactly eager's";
  }
}

// A divisor that is 0 in the dtype (256 as uint8) or a tensor runs through ATen, which raises as eager does;
// nothing is fused that could trap.
TEST(IntegerDivision, ADivisorThatCouldRaiseRunsThroughATenAndRaisesAsEager) {
  auto m = script("x, d", "    return torch.remainder(x + 1, 256), torch.remainder(x, d)");
  at::Tensor x = at::arange(0, 8, at::kInt).to(at::kByte);
  at::Tensor d = at::ones({8}, at::kByte);
  EXPECT_THROW(m.forward({x, d}), std::exception);
  CompiledModule fused = compile(m);
  try {
    fused({x, d});
    ADD_FAILURE() << "integer remainder by 256 as uint8 (zero) did not raise";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("ZeroDivisionError"), std::string::npos) << e.what();
  }
  at::Tensor y = at::arange(0, 8, at::kInt).to(at::kShort);
  auto r = run_and_compare(m, {y, at::full({8}, 3, at::kShort)}, "remainder by 256 as int16 and by a tensor");
  ASSERT_NE(r.plan, nullptr);
  std::string text = r.plan->explain();
  EXPECT_NE(text.find("integer remainder by a tensor runs through ATen"), std::string::npos) << text;
}

// Note [bfloat16 rounding in 32-bit lanes]: a float32 rounded to bfloat16 in a store (y) and inside a
// kernel (z's product, rounded before it is widened back) gives torch's bits: ties to even both ways, the
// largest finite float rounding to inf, subnormals, signed zeros and infinities, NaNs kept NaN. Over
// special bit patterns and random ones, in a kernel of more than one vector.
TEST(BFloat16, RoundingGivesTorchsBitsInStoresAndIntermediates) {
  auto m = script("x, h", "    y = x.type_as(h)\n    z = (y * 3.0).type_as(x)\n    return (y, z * 1.0)");
  const std::vector<uint32_t> specials = {
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0xbf808000u, 0xbf818000u,  // ties and their neighbours
      0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu,                            // to inf, or not
      0x00000001u, 0x00008000u, 0x00018000u, 0x807fffffu, 0x00400000u,                // subnormals
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,                            // zeros, infinities
      0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fffffffu, 0xff80ffffu};              // NaNs
  std::vector<uint32_t> bits(4096);
  at::manual_seed(3);
  at::Tensor r = at::randint(0, std::numeric_limits<int32_t>::max(), {4096}, at::kLong);
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t v = static_cast<uint32_t>(r[static_cast<int64_t>(i)].item<int64_t>());
    bits[i] = i < specials.size() ? specials[i] : (i % 2 ? v | 0x80000000u : v);
  }
  at::Tensor x = at::empty({64, 64}, at::kFloat);
  std::memcpy(x.data_ptr(), bits.data(), bits.size() * 4);
  auto compiled = std::make_shared<CompiledModule>(compile(m));
  const std::vector<c10::IValue> in{x, at::zeros({1}, at::kBFloat16)};
  const ExecutablePlan* plan = compiled->plan_for(in);  // made first: the call below runs the plan
  ASSERT_NE(plan, nullptr);
  std::vector<at::Tensor> eager = flatten(m.forward(in)), fused = flatten((*compiled)(in));
  ASSERT_EQ(fused.size(), 2u);
  EXPECT_EQ(plan->explain().find("aten: aten::mul"), std::string::npos) << plan->explain();
  for (int k = 0; k < 2; ++k) {
    at::Tensor e = eager[k].contiguous(), f = fused[k].contiguous();
    ASSERT_EQ(e.scalar_type(), f.scalar_type()) << "output " << k;
    at::Tensor both_nan = at::isnan(e).logical_and(at::isnan(f));
    at::Tensor same_bits = k == 0 ? e.view(at::kShort).eq(f.view(at::kShort)) : e.view(at::kInt).eq(f.view(at::kInt));
    at::Tensor ok = both_nan.logical_or(same_bits);
    EXPECT_TRUE(ok.all().item<bool>()) << "output " << k << ": first differing element "
                                       << at::nonzero(ok.logical_not().flatten()).flatten().slice(0, 0, 1)
                                       << "\nfused: " << f.flatten().slice(0, 0, 8) << "\neager: " << e.flatten().slice(0, 0, 8);
    EXPECT_TRUE(at::isnan(e).eq(at::isnan(f)).all().item<bool>()) << "output " << k << ": NaN where the other is not";
  }
}

// Eager's CPU gelu of a contiguous tensor of more than one element goes through oneDNN (NaN at +-inf, for
// float32 and, where the CPU has the instructions, float16 and bfloat16); every other tensor through
// ATen's own loop (+inf at +inf). The kernels choose by the input's layout (Target::gelu_fn): transposed,
// sliced, permuted, expanded and one-element inputs, and gelu of a contiguous intermediate. (Not
// channels-last ones: a channels-last plan's activations are NCHW in eager, and the kernels follow that.)
TEST(Gelu, InfinitiesFollowEagersPathForEachLayout) {
  const double inf = std::numeric_limits<double>::infinity();
  auto m = script("a, b, c, d, e, f", "    return (torch.gelu(a), torch.gelu(b), torch.gelu(c), torch.gelu(d), torch.gelu(e),"
                                      " torch.gelu(f * 2.0))");
  for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf}) {
    auto specials = [&](std::vector<int64_t> sizes) {
      at::Tensor x = at::randn(sizes, at::kDouble);
      x.view(-1)[0] = inf;
      x.view(-1)[1] = -inf;
      return x.to(t);
    };
    std::vector<c10::IValue> in{specials({6, 5}).t(), specials({4, 9}).slice(1, 0, 8), specials({2, 4, 3, 5}).permute({0, 2, 1, 3}),
                                specials({1, 7}).expand({3, 7}), at::full({1}, inf, t), specials({4, 8})};
    auto r = run_and_compare(m, in, std::string("gelu ") + c10::toString(t));
    ASSERT_NE(r.plan, nullptr);
    EXPECT_FALSE(r.plan->kernels.empty());
    EXPECT_TRUE(std::isinf(r.eager[0][0][0].item<double>())) << "eager's loop gives +inf at +inf";
  }
}

// Note [Inline float32 exp]: float32 exp, and sigmoid, silu and softmax through it, against exp in float64
// rounded to float: at most one ulp apart (eager's own exp is within one ulp too) over the whole range,
// from where the result underflows to 0 through the subnormals to where it overflows, and exactly
// eager's at the edges: +-inf, NaN, +-0, the largest finite result and the first infinite one.
TEST(Exp, Float32IsWithinAnUlpOverItsWholeRange) {
  auto m = script("x", "    return torch.exp(x), torch.sigmoid(x), torch.silu(x), torch.softmax(x[:64], 0)");
  at::Tensor x = at::linspace(-105.0, 90.0, 1 << 20, at::kFloat);
  const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 88.72283172607422f, 88.72283935546875f,
                            -87.33654f, -103.97208f, -103.9721f, -104.0f, 1e-30f, -1e-45f, 0.34657359f, -0.34657359f};
  for (size_t i = 0; i < std::size(specials); ++i) x[static_cast<int64_t>(i) * 997 + 64] = specials[i];
  auto r = run_and_compare(m, {x}, "exp over the float32 range");
  ASSERT_NE(r.plan, nullptr);
  ASSERT_FALSE(r.plan->kernels.empty()) << r.plan->explain();
  const at::Tensor got = r.fused[0].contiguous(), want = x.to(at::kDouble).exp().to(at::kFloat);
  const float* g = got.data_ptr<float>();
  const float* w = want.data_ptr<float>();
  int64_t worst = 0, at_i = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::isnan(w[i]) || std::isinf(w[i]) || w[i] == 0.0f) {
      EXPECT_TRUE(std::isnan(w[i]) ? std::isnan(g[i]) : g[i] == w[i]) << "exp(" << x[i].item<float>() << ") = " << g[i];
      continue;
    }
    int32_t a, b;
    std::memcpy(&a, &g[i], 4);
    std::memcpy(&b, &w[i], 4);
    if (std::abs(int64_t{a} - b) > worst) worst = std::abs(int64_t{a} - b), at_i = i;
  }
  EXPECT_LE(worst, 1) << "ulps at exp(" << x[at_i].item<float>() << "): " << g[at_i] << " against " << w[at_i];
  EXPECT_TRUE(at::equal(r.fused[0].isinf(), r.eager[0].isinf()));
  EXPECT_TRUE(at::equal(r.fused[0] == 0, r.eager[0] == 0));
}

torch::jit::Module batch_norm_module() {
  return script("x, w, b, mean, var",
                "    y = torch.batch_norm(x, w, b, mean, var, False, 0.1, 1e-5, False)\n    return torch.relu(y)");
}

std::vector<c10::IValue> batch_norm_inputs(at::ScalarType t) {
  at::manual_seed(0);
  return {at::randn({2, 3, 4, 5}, t), at::randn({3}, t), at::randn({3}, t), at::randn({3}, t), at::rand({3}, t) + 0.5};
}

TEST(BatchNorm, InferenceIsFusedAndMatchesEager) {
  auto m = batch_norm_module();
  for (at::ScalarType t : {at::kFloat, at::kDouble}) {
    std::vector<c10::IValue> in = batch_norm_inputs(t);
    auto r = run_and_compare(m, in, "batch_norm");
    ASSERT_NE(r.plan, nullptr);
    EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
    EXPECT_EQ(r.plan->fused_ops, 2);
  }
  // channels-last input
  at::Tensor x = at::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  auto r = run_and_compare(m, {x, at::randn({3}), at::randn({3}), at::randn({3}), at::rand({3}) + 0.5}, "batch_norm NHWC");
  ASSERT_NE(r.plan, nullptr) << "the NHWC signature ran eagerly";
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
  EXPECT_EQ(r.plan->fused_ops, 2) << r.plan->explain();
}

// Note [batch_norm's formulas]: eager's CPU batch_norm computes x * alpha + beta for operands contiguous in
// some memory format and ((x - mean) * invstd) * w + b otherwise (an expanded, permuted or sliced input, a
// strided weight). Channel 0 tells the two apart: with w = b = -inf and mean 0.5, beta is NaN (first
// formula) where the second gives -inf (relu: 0).
TEST(BatchNorm, FollowsEagersFormulaForEachLayout) {
  const double inf = std::numeric_limits<double>::infinity();
  auto stats = [](std::vector<double> v, at::ScalarType t) { return at::tensor(v, at::kDouble).to(t); };
  struct Case {
    const char* name;
    const char* body;
    bool expanded_input, strided_weight;
  };
  const Case cases[] = {
      {"contiguous", "    return torch.relu(torch.batch_norm(x, w, b, mean, var, False, 0.1, 1e-5, False))", false, false},
      {"expanded input", "    return torch.relu(torch.batch_norm(x, w, b, mean, var, False, 0.1, 1e-5, False))", true, false},
      {"strided weight", "    return torch.relu(torch.batch_norm(x, w, b, mean, var, False, 0.1, 1e-5, False))", false, true},
      {"permuted intermediate",
       "    y = (x.transpose(2, 3) * 1.0).transpose(2, 3)\n"
       "    return torch.relu(torch.batch_norm(y.transpose(2, 3), w, b, mean, var, False, 0.1, 1e-5, False))",
       false, false},
      {"sliced", "    return torch.relu(torch.batch_norm(x[:, :, :, ::2], w, b, mean, var, False, 0.1, 1e-5, False))", false,
       false},
  };
  for (const Case& c : cases)
    for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf}) {
      auto m = script("x, w, b, mean, var", c.body);
      at::Tensor x = at::full({2, 3, 4, 6}, 2.0, t);
      if (c.expanded_input) x = at::full({1, 3, 4, 1}, 2.0, t).expand({2, 3, 4, 6});
      at::Tensor w = stats({-inf, 1, 0.75}, t), b = stats({-inf, 0.5, 0.25}, t);
      if (c.strided_weight) w = at::stack({w, w}, 1).select(1, 0);
      std::vector<c10::IValue> in{x, w, b, stats({0.5, 1, -1}, t), stats({1, 3, 2}, t)};
      std::string what = fmt::format("{} {}", c.name, c10::toString(t));
      auto r = run_and_compare(m, in, what);
      ASSERT_NE(r.plan, nullptr) << what;
      EXPECT_EQ(r.plan->explain().find("aten: aten::batch_norm"), std::string::npos) << what << "\n" << r.plan->explain();
    }
}

// Note [Max pooling as loads]: max_pool2d as one kernel of strided loads, against eager over window shapes
// (padding at both ends, ceil_mode, dilation, stride 1, a rectangular window), a pointwise producer, NaN,
// +-inf and +-0 in the windows, every floating dtype, and NCHW, channels-last and sliced inputs. Pools whose
// indices are used stay ATen's.
TEST(MaxPool, IsOneKernelOfStridedLoadsAndMatchesEager) {
  auto m = script("x", R"(    a = torch.max_pool2d(x, [3, 3], [2, 2], [1, 1], [1, 1], False)
    b = torch.max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], True)
    c = torch.max_pool2d(x, [3, 2], [1, 2], [1, 1], [2, 1], False)
    d = torch.max_pool2d(x * 2.0 - 1.0, [3, 3], [1, 1], [1, 1], [1, 1], True)
    e, i = torch.max_pool2d_with_indices(x, [2, 2], [2, 2], [1, 1], [1, 1], False)
    return (a, b, c, d, e, i))");
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf})
    for (const char* layout : {"nchw", "channels_last", "sliced"}) {
      if (t != at::kFloat && std::strcmp(layout, "sliced") == 0) continue;
      at::manual_seed(1);
      at::Tensor x = at::randn({2, 3, 9, 11}, at::kDouble);
      x.index_put_({0, 0, 0, 0}, nan);   // a corner window
      x.index_put_({1, 2, 4, 5}, nan);   // an interior one
      x.index_put_({0, 1, 8, 10}, inf);
      x.index_put_({1, 1}, -inf);        // a whole channel of -inf
      x.index_put_({0, 2, 3}, 0.0);      // +0 beside -0
      x.index_put_({0, 2, 3, at::indexing::Slice(0, at::indexing::None, 2)}, -0.0);
      x = x.to(t);
      if (std::strcmp(layout, "channels_last") == 0) x = x.contiguous(at::MemoryFormat::ChannelsLast);
      if (std::strcmp(layout, "sliced") == 0) x = at::cat({x, x}, 3).slice(3, 3, 14);
      const std::string what = fmt::format("max_pool2d {} {}", c10::toString(t), layout);
      auto r = run_and_compare(m, {x}, what);
      ASSERT_NE(r.plan, nullptr) << what;
      const std::string text = r.plan->explain();
      EXPECT_NE(text.find("decompose.max_pool2d x4"), std::string::npos) << what << "\n" << text;
      size_t aten_pools = 0;
      for (size_t at = text.find("aten: aten::max_pool2d"); at != std::string::npos; at = text.find("aten: aten::max_pool2d", at + 1))
        ++aten_pools;
      EXPECT_EQ(aten_pools, 1u) << what << ": only the pool whose indices are returned runs through ATen\n" << text;
      for (int k = 0; k < 4; ++k)
        EXPECT_EQ(r.fused[k].strides(), r.eager[k].strides()) << what << ": output " << k;
    }
}

// Note [Gathered loads]: embedding is read inside the kernel of its consumers, as eager computes it, in
// every kernel form, table dtype and layout of the gather corpus, with int64 and int32 indices.
TEST(Gather, EmbeddingIsReadInsideItsConsumersKernel) {
  for (const GatherCase& c : kGatherCases) {
    auto m = script(c.args, c.body);
    for (at::ScalarType t : gather_table_types(c))
      for (at::ScalarType it : {at::kLong, at::kInt}) {
        if (it == at::kInt && t != at::kFloat) continue;
        std::string what = fmt::format("{} {} table, {} indices", c.name, c10::toString(t), c10::toString(it));
        auto r = run_and_compare(m, gather_inputs(t, it), what);
        ASSERT_NE(r.plan, nullptr) << what;
        const std::string text = r.plan->explain();
        EXPECT_EQ(r.plan->kernels.size(), c.kernels) << what << "\n" << text;
        EXPECT_EQ(text.find("aten: aten::embedding"), std::string::npos) << what << "\n" << text;
        EXPECT_EQ(text.find("aten: aten::gather"), std::string::npos) << what << "\n" << text;
        EXPECT_TRUE(text.find("aten::embedding") != std::string::npos || text.find("aten::gather") != std::string::npos)
            << what << "\n" << text;
      }
  }
}

// An index outside the table raises what eager raises (embedding's IndexError, gather's error naming
// the index, dim and size) before the kernel writes anything, in int64 and int32, past either end; the
// compiled plan runs on afterwards.
TEST(Gather, AnIndexOutsideTheTableRaisesAsEager) {
  for (bool embedding : {true, false}) {
    auto m = script("w, idx, x", embedding ? "    return torch.embedding(w, idx) * 2 + x"
                                           : "    return torch.gather(w, 0, idx) * 2 + x[:, :, 0]");
    for (at::ScalarType it : {at::kLong, at::kInt}) {
      auto in = gather_inputs(at::kFloat, it);
      CompiledModule fused = compile(m);
      fused(in);  // the plan of this signature, then wrong indices of the same signature
      for (int64_t bad : {int64_t{37}, int64_t{-1}, int64_t{1} << 40}) {
        if (it == at::kInt && bad > INT32_MAX) continue;
        at::Tensor idx = in[1].toTensor().clone();
        idx[2][5] = bad;
        std::vector<c10::IValue> args{in[0], idx, in[2]};
        const std::string want = embedding ? "index out of range in self"
                                           : fmt::format("index {} is out of bounds for dimension 0 with size 37", bad);
        try {
          m.forward(args);
          ADD_FAILURE() << "eager took index " << bad;
        } catch (const std::exception& e) {
          EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        }
        try {
          fused(args);
          ADD_FAILURE() << "index " << bad << " did not raise";
        } catch (const c10::IndexError& e) {
          EXPECT_TRUE(embedding) << e.what();
          EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        } catch (const c10::Error& e) {
          EXPECT_FALSE(embedding) << e.what();
          EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        }
      }
      auto r = run_and_compare(m, in, "after the errors");
      ASSERT_NE(r.plan, nullptr);
      EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
    }
  }
}

// Indices computed in the graph are stored by their own kernel and read from memory by the gather's.
TEST(Gather, ComputedIndicesAreReadFromMemory) {
  auto m = script("w, idx, x", "    return torch.embedding(w, (idx + 1) % 37) * x");
  auto r = run_and_compare(m, gather_inputs(at::kFloat, at::kLong), "computed indices");
  ASSERT_NE(r.plan, nullptr);
  const std::string text = r.plan->explain();
  EXPECT_EQ(r.plan->kernels.size(), 2u) << text;
  EXPECT_NE(text.find("reads its indices from memory"), std::string::npos) << text;
}

// The schemas of the table ops the fuser sees when `m` runs on `inputs`: the graph after capture and the
// passes (a decomposed op counts through the ops it becomes). The module is frozen first, as compile()
// freezes it (which folds torch.tensor(...) into a constant).
// `int_refused`, when given, says whether the fuser refuses one of them for an integer reason (an integer
// division that could raise, integer pow).
std::set<std::string> table_ops_run_by(torch::jit::Module& m, const std::vector<c10::IValue>& inputs,
                                       bool* int_refused = nullptr) {
  torch::jit::Module source = m.clone();
  torch::jit::Inline(*source.get_method("forward").graph());
  torch::jit::Module frozen = torch::jit::freeze_module(source);
  auto graph = frozen.get_method("forward").graph()->copy();
  prepare_torchscript_graph(graph);
  CaptureResult cap = capture_graph(graph, inputs, /*skip_self=*/true);
  optimize_captured(cap.captured);
  std::set<std::string> out;
  for (const Node* n : cap.captured.graph->nodes()) {
    if (!n->op()) continue;
    out.insert(n->schema());
    if (int_refused && (n->op()->has(OpFlag::kIntegerDivision) || n->op()->has(OpFlag::kIntegerRaises)) &&
        !can_fuse_node(*n, nullptr))
      *int_refused = true;
  }
  return out;
}

// Every op of the table is run by a case of the corpus (op_corpus.h, reduction_corpus.h), where the
// tests above compare it with eager in every dtype and layout; the exceptions say why. A new op without
// a case fails here, by name (docs/howto.md: "Adding an elementwise op").
TEST(OpTableCoverage, EveryOpHasACorpusCase) {
  std::map<std::string, std::string> covered_by;  // schema -> the first case that runs it
  for (const OpCase& c : kCases) {
    // Integer dtypes first when the case has them: the case's ints_via_aten must match the table.
    auto dtypes = dtypes_of(c.dtypes);
    at::ScalarType t = (c.dtypes & kI) ? at::kInt : dtypes.at(0);
    auto m = corpus_module(c);
    bool ints_raise = false;
    std::set<std::string> ops = table_ops_run_by(m, corpus_inputs(c, t), &ints_raise);
    for (const auto& s : ops) covered_by.emplace(s, c.name);
    if (c.dtypes & kI) {
      EXPECT_EQ(c.ints_via_aten, ints_raise)
          << c.name << ": ints_via_aten must say whether the table sends its integer ops to ATen";
    }
  }
  for (const ReductionCase& c : kReductionCases) {
    auto ins = inputs_for(c);
    auto m = reduction_module(c, ins.size());
    for (const auto& s : table_ops_run_by(m, reduction_case_inputs(ins, reduction_dtypes(c.dtypes).at(0))))
      covered_by.emplace(s, c.name);
  }
  for (const GatherCase& c : kGatherCases) {  // Gather.EmbeddingIsReadInsideItsConsumersKernel
    auto m = script(c.args, c.body);
    for (const auto& s : table_ops_run_by(m, gather_inputs(at::kFloat, at::kLong))) covered_by.emplace(s, c.name);
  }
  {
    auto m = batch_norm_module();  // per-channel arguments: a test of its own above
    for (const auto& s : table_ops_run_by(m, batch_norm_inputs(at::kFloat))) covered_by.emplace(s, "BatchNorm");
  }
  // Ops no TorchScript expression reaches, with the reason.
  const std::map<std::string, std::string> exempt = {
      {"aten::rsub.Tensor",
       "TorchScript writes torch.rsub(x, y) as aten::sub(y, x) before capture; FX graphs (the torch.compile "
       "backend) bring it"},
  };
  std::string missing;
  for (const OpInfo& op : all_ops()) {
    // Views are in the table for their category only: ATen runs them, no kernel computes them.
    if (op.category == OpCategory::kView) continue;
    if (exempt.count(op.schema)) {
      EXPECT_FALSE(covered_by.count(op.schema)) << op.schema << " is exempt, yet case " << covered_by[op.schema]
                                                << " runs it: drop the exemption";
      continue;
    }
    if (!covered_by.count(op.schema)) missing += " " + op.schema;
  }
  EXPECT_EQ(missing, "") << "ops of the table that no corpus case runs (add a case to tests/torch/op_corpus.h or "
                            "reduction_corpus.h):"
                         << missing;
}

}  // namespace
}  // namespace fusion_jit::testing
