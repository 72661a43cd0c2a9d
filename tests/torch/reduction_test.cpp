// Reductions and normalizations against eager PyTorch: the reduction corpus (every op, axis set, layout
// and size of tests/torch/reduction_corpus.h, in its first dtype and a daily sample of the others: sampling.h), the fused patterns of the issue each as one kernel,
// the plan's explanation of a row too long for one kernel, and eager's errors for empty max reductions.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "reduction_corpus.h"
#include "sampling.h"
#include "runtime/plan.h"

namespace fusion_jit::testing {
namespace {

class ReductionCorpus : public ::testing::TestWithParam<ReductionCase> {};

TEST_P(ReductionCorpus, MatchesEagerInEveryDtypeLayoutAndSize) {
  const ReductionCase& c = GetParam();
  auto ins = inputs_for(c);
  auto m = reduction_module(c, ins.size());
  for (at::ScalarType t : sample_of(std::string("reductions/") + c.name, reduction_dtypes(c.dtypes))) {
    int empty = 0;
    std::vector<c10::IValue> inputs = reduction_case_inputs(ins, t, &empty);
    std::string what = std::string(c.name) + " " + c10::toString(t);
    auto r = run_and_compare(m, inputs, what);
    ASSERT_NE(r.plan, nullptr) << what;
    EXPECT_FALSE(r.plan->kernels.empty()) << what << ": nothing fused\n" << r.plan->explain();
    if (*c.schema) {
      // Only the inputs with an empty reduced extent may leave the op to ATen.
      auto it = r.plan->aten_ops.find(c.schema);
      int aten = it == r.plan->aten_ops.end() ? 0 : it->second;
      EXPECT_LE(aten, empty) << what << ": " << c.schema << " ran through ATen\n" << r.plan->explain();
    }
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(AllReductions, ReductionCorpus, ::testing::ValuesIn(kReductionCases),
                         [](const ::testing::TestParamInfo<ReductionCase>& i) { return std::string(i.param.name); });

// The patterns of the issue: each one kernel, no ATen step, matching eager.
struct Pattern {
  const char* name;
  const char* args;
  const char* body;
  int inputs;  // x, then [4096]-shaped parameters are made of the same rows
};

const Pattern kPatterns[] = {
    {"softmax_scaled_masked", "x, mask", "    return torch.softmax(x * 0.125 + mask, -1)", 2},
    {"layer_norm_bias_residual", "x, r, bias, w, b",
     "    return torch.layer_norm(x + bias + r, [x.size(-1)], w, b, 1e-5)", 5},
    {"rms_norm_weight", "x, w", "    return torch.rms_norm(x, [x.size(-1)], None, None) * w", 2},
    {"log_softmax", "x", "    return torch.log_softmax(x, -1)", 1},
    {"mean_and_var", "x", "    return torch.mean(x, -1), torch.var(x, -1)", 1},
    {"gelu_mean", "x", "    return torch.gelu(x).mean(-1)", 1},
};

std::vector<c10::IValue> pattern_inputs(const Pattern& p, at::ScalarType t, int64_t rows, int64_t cols) {
  std::vector<c10::IValue> in;
  std::string args = p.args;
  for (int i = 0; i < p.inputs; ++i) {
    // Arguments after the residual (bias, weights) are vectors over the row.
    bool vec = (std::string(p.name) == "layer_norm_bias_residual" && i >= 2) || (std::string(p.name) == "rms_norm_weight" && i == 1);
    at::Tensor v = vec ? at::rand({cols}, at::kDouble) + 0.5 : at::randn({rows, cols}, at::kDouble);
    if (std::string(p.name) == "softmax_scaled_masked" && i == 1)
      v = at::where(at::rand({rows, cols}, at::kDouble).lt(0.2), at::full({}, -INFINITY, at::kDouble), at::zeros({}, at::kDouble));
    in.emplace_back(v.to(t));
  }
  return in;
}

class FusedPatterns : public ::testing::TestWithParam<Pattern> {};

TEST_P(FusedPatterns, EachIsOneKernelAndMatchesEager) {
  const Pattern& p = GetParam();
  auto m = script(p.args, p.body);
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{64, 1024}, {33, 257}, {5, 4099}}) {
      at::manual_seed(3);
      auto inputs = pattern_inputs(p, t, rows, cols);
      std::string what = fmt::format("{} {} [{},{}]", p.name, c10::toString(t), rows, cols);
      auto r = run_and_compare(m, inputs, what);
      ASSERT_NE(r.plan, nullptr);
      EXPECT_EQ(r.plan->kernels.size(), 1u) << what << "\n" << r.plan->explain();
      EXPECT_EQ(r.plan->steps.size(), r.plan->kernels.size()) << what << ": ATen steps left\n" << r.plan->explain();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Issue, FusedPatterns, ::testing::ValuesIn(kPatterns),
                         [](const ::testing::TestParamInfo<Pattern>& i) { return std::string(i.param.name); });

TEST(Reductions, SoftmaxOfAFullyMaskedRowIsNaNAsInEager) {
  auto m = script("x, mask", "    return torch.softmax(x + mask, -1)");
  at::Tensor x = at::randn({4, 40});
  at::Tensor mask = at::zeros({4, 40});
  mask[1].fill_(-INFINITY);
  auto r = run_and_compare(m, {x, mask}, "masked softmax");
  ASSERT_NE(r.plan, nullptr) << "ran eagerly";
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
  EXPECT_EQ(r.plan->steps.size(), 1u) << "ATen steps left\n" << r.plan->explain();
  EXPECT_TRUE(r.fused.at(0)[1].isnan().all().item<bool>());
}

TEST(Reductions, EmptyMaxRaisesEagersError) {
  auto m = script("x", "    return torch.amax(x, 1)");
  at::Tensor x = at::zeros({3, 0});
  std::string eager_msg, fused_msg;
  try {
    m.forward({x});
  } catch (const std::exception& e) {
    eager_msg = e.what();
  }
  ASSERT_FALSE(eager_msg.empty());
  auto compiled = compile(m);
  try {
    compiled({x});
  } catch (const std::exception& e) {
    fused_msg = e.what();
  }
  EXPECT_NE(fused_msg.find("Expected reduction dim 1 to have non-zero size"), std::string::npos) << fused_msg;
}

TEST(Reductions, EmptySumIsZeroAndEmptyVarIsNaN) {
  auto m = script("x", "    return torch.sum(x, 1), torch.var(x, 1), torch.prod(x, 1), torch.mean(x, 1)");
  auto r = run_and_compare(m, {at::zeros({3, 0})}, "empty reductions");
  EXPECT_TRUE(r.fused.at(0).eq(0).all().item<bool>());
  EXPECT_TRUE(r.fused.at(1).isnan().all().item<bool>());
  EXPECT_TRUE(r.fused.at(2).eq(1).all().item<bool>());
  EXPECT_TRUE(r.fused.at(3).isnan().all().item<bool>());
  EXPECT_FALSE(r.plan->kernels.empty()) << r.plan->explain();
}

TEST(Reductions, MaxWithUsedIndicesRunsThroughATen) {
  auto m = script("x", "    v, i = torch.max(x, 1)\n    return v * 2, i");
  auto r = run_and_compare(m, {at::randn({5, 9})}, "max with indices");
  EXPECT_EQ(r.plan->aten_ops.count("aten::max.dim"), 1u) << r.plan->explain();
}

TEST(Reductions, NativeLayerNormReturnsMeanAndRstd) {
  auto m = script("x, w, b", "    return torch.native_layer_norm(x, [x.size(-1)], w, b, 1e-5)");
  for (at::ScalarType t : {at::kFloat, at::kHalf}) {
    auto r = run_and_compare(m, {at::randn({6, 50}).to(t), at::rand({50}).to(t), at::randn({50}).to(t)},
                             "native_layer_norm");
    EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
  }
}

// A layer norm over a strided dim of 16385 elements (the CPU column schedule), half of them zeros and
// the rest doubled (a dropout's output): within 2x eager's error against float64. Found by the fuzzer
// (seed 61): a float32 Welford over the whole row lost 1e-4 of the variance, 200x eager's error.
TEST(Reductions, ALongColumnLayerNormIsAsAccurateAsEager) {
  auto m = script("x", "    return torch.layer_norm(x, [x.size(-1)], None, None, 1e-3)");
  at::manual_seed(1);
  at::Tensor base = at::randn({16385, 2});
  at::Tensor x = (base * (at::rand({16385, 2}) > 0.5) * 2).t();
  auto r = run_and_compare(m, {x}, "column layer norm");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_NE(r.plan->code.at(0).source.find("column tiles"), std::string::npos) << "not the column schedule";
  at::Tensor ref = at::layer_norm(x.to(at::kDouble), {16385}, {}, {}, 1e-3);
  const double fused = (r.fused[0].to(at::kDouble) - ref).abs().max().item<double>();
  const double eager = (r.eager[0].to(at::kDouble) - ref).abs().max().item<double>();
  EXPECT_LE(fused, 2 * eager + 1e-7) << "fused " << fused << ", eager " << eager;
}

TEST(Reductions, ReductionsOverDifferentDimsAreSeparateKernelsWithAReason) {
  auto m = script("x", "    return torch.softmax(x, -1).sum(0)");
  auto r = run_and_compare(m, {at::randn({16, 24})}, "two reductions");
  EXPECT_EQ(r.plan->kernels.size(), 2u) << r.plan->explain();
  EXPECT_NE(r.plan->explain().find("the group reduces"), std::string::npos) << r.plan->explain();
}

TEST(Reductions, ExplainShowsPersistentRows) {
  auto m = script("x", "    return torch.softmax(x, -1)");
  auto r = run_and_compare(m, {at::randn({8, 1000})}, "softmax");
  EXPECT_NE(r.plan->explain().find("persistent row: 3 passes"), std::string::npos) << r.plan->explain();
}

TEST(Reductions, RowsTooLongForTheChipAreReadOncePerPassAndSaySo) {
  // 2M floats per row (8 MB): larger than the CPU's on-chip row budget.
  auto m = script("x", "    return torch.softmax(x, -1)");
  auto r = run_and_compare(m, {at::randn({2, 1 << 21})}, "long softmax");
  EXPECT_NE(r.plan->explain().find("larger than the"), std::string::npos) << r.plan->explain();
}

}  // namespace
}  // namespace fusion_jit::testing

namespace fusion_jit::testing {
namespace {

// Variants the corpus does not reach: affine group_norm over [N, C, H, W], layer_norm with a weight only,
// rms_norm with eps, softmax to another dtype, the ATen-level overloads FX graphs carry.
TEST(Reductions, NormalizationVariantsMatchEager) {
  auto m = script("x, w, b, y",
                  "    g = torch.group_norm(x, 3, w, b, 1e-5)\n"
                  "    l = torch.layer_norm(y, [y.size(-1)], y[0], None, 1e-6)\n"
                  "    r = torch.rms_norm(y, [y.size(-1)], None, 1e-3)\n"
                  "    s = torch.softmax(y, -1, 7)\n"
                  "    a = torch._softmax(y, 0, False)\n"
                  "    z = torch._log_softmax(y, 1, False)\n"
                  "    return g, l, r, s, a, z");
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    at::manual_seed(5);
    std::vector<c10::IValue> in{at::randn({2, 6, 5, 7}).to(t), (at::rand({6}) + 0.5).to(t), at::randn({6}).to(t),
                                at::randn({9, 37}).to(t)};
    auto r = run_and_compare(m, in, std::string("variants ") + c10::toString(t));
    for (const auto& [schema, n] : r.plan->aten_ops)
      EXPECT_TRUE(schema.find("norm") == std::string::npos && schema.find("softmax") == std::string::npos)
          << schema << " ran through ATen\n" << r.plan->explain();
  }
}

// batch_norm (inference) with its per-channel arguments inside reduction kernels: an EfficientNet block's
// batch_norm, SiLU and squeeze-excitation mean (one kernel writing both), a batch_norm after a squeezed
// mean (its channels are the frame's dim 1), one whose channels are the reduced dim, and a batch_norm of a
// lower rank than the group it joins by broadcasting (its channels are the group's last dim: this one
// read its per-channel arguments along the group's dim 1 before, a wrong result). Each in NCHW and
// channels-last, float32/64, float16 and bfloat16, against eager.
// Per-channel arguments computed in the graph, by an elementwise op ([C] broadcasts to [N, C]) or by a
// reduction: the fuser keeps each producer out of its batch_norm's kernel (the kernel reads them from
// memory). The fuzzer's batch_norm draws found the second while batch_norm was first let into reduction
// kernels: the kernel read the mean as an input no step had written ("Expected Tensor but got None").
TEST(Reductions, PerChannelArgumentsMadeInTheGraphAreReadFromMemory) {
  auto m = script("x, w, y",
                  "    a = torch.batch_norm(x, torch.sin(w), None, w * 0.5, torch.exp(w), False, 0.1, 1e-5, False)\n"
                  "    s = torch.sin(y)\n"
                  "    v = s.mean([0])\n"
                  "    return a, torch.batch_norm(s, v, v, v, v.abs(), False, 0.1, 1e-5, False)");
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    at::manual_seed(3);
    std::vector<c10::IValue> in{at::randn({2, 6}).to(t), at::randn({6}).to(t), at::randn({4, 5}).to(t)};
    const std::string what = std::string("per-channel arguments made in the graph ") + c10::toString(t);
    auto r = run_and_compare(m, in, what);
    ASSERT_NE(r.plan, nullptr) << what;
    EXPECT_NE(r.plan->explain().find("as a per-channel argument, from memory"), std::string::npos) << r.plan->explain();
  }
}

TEST(Reductions, BatchNormJoinsReductionKernelsAndMatchesEager) {
  const std::string bn = "w, b, mu, var, False, 0.1, 1e-5, False)";
  auto block = script("x, w, b, mu, var, y, z",
                      "    h = torch.silu(torch.batch_norm(x, " + bn + ")\n"
                      "    return h, h.mean([2, 3], keepdim=True)");
  auto others = script("x, w, b, mu, var, y, z",
                       "    p = torch.batch_norm(x.mean([2, 3]), " + bn + " * 2.0\n"
                       "    c = torch.batch_norm(x, " + bn + ".sum(1)\n"
                       "    q = torch.batch_norm(y, " + bn + " + z\n"
                       "    return p, c, q");
  for (auto* m : {&block, &others}) {
    for (at::ScalarType t : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
      for (bool cl : {false, true}) {
        at::manual_seed(11);
        at::Tensor x = at::randn({2, 6, 5, 7});
        if (cl) x = x.contiguous(at::MemoryFormat::ChannelsLast);
        std::vector<c10::IValue> in{x.to(t), (at::rand({6}) + 0.5).to(t), at::randn({6}).to(t), at::randn({6}).to(t),
                                    (at::rand({6}) + 0.5).to(t), at::randn({3, 6}).to(t), at::randn({4, 3, 6}).to(t)};
        const std::string what = std::string(m == &block ? "block " : "others ") + c10::toString(t) +
                                 (cl ? " channels-last" : "");
        auto r = run_and_compare(*m, in, what);
        ASSERT_NE(r.plan, nullptr) << what;
        const std::string ex = r.plan->explain();
        EXPECT_EQ(r.plan->aten_ops.count("aten::batch_norm"), 0u) << what << "\n" << ex;
        if (m == &block) EXPECT_EQ(r.plan->kernels.size(), 1u) << what << "\n" << ex;
        else EXPECT_EQ(r.plan->kernels.size(), 3u) << what << "\n" << ex;
      }
    }
  }
}

}  // namespace
}  // namespace fusion_jit::testing

namespace fusion_jit::testing {
namespace {

// Random reduction graphs: a prologue, a reduction over random dims (keepdim or not), an epilogue that
// broadcasts the result back, in random dtypes, shapes (0, 1, primes, around 16 and 256) and layouts.
// FJ_RANDOM_REDUCTIONS=N runs N graphs (default 120; seeds 1..N, each printed on failure).
TEST(Reductions, RandomGraphsMatchEager) {
  const char* env = std::getenv("FJ_RANDOM_REDUCTIONS");
  const int graphs = env ? std::atoi(env) : 120;
  const char* kPrologues[] = {"x", "x * 1.5 - 0.25", "torch.exp(x * 0.1)", "torch.abs(x) + y", "x * y", "torch.sigmoid(x)"};
  const char* kReductions[] = {"torch.sum({}, {}, keepdim={})",  "torch.mean({}, {}, keepdim={})",
                               "torch.amax({}, {}, keepdim={})", "torch.amin({}, {}, keepdim={})",
                               "torch.var({}, {}, keepdim={})",  "torch.std({}, {}, keepdim={})",
                               "torch.logsumexp({}, {}, keepdim={})"};
  const char* kEpilogues[] = {"r", "p - r", "p / (r + 1.0)", "torch.exp(p - r)", "r * 2.0 + 1.0", "torch.sqrt(torch.abs(r))"};
  const std::vector<int64_t> kSizes = {1, 2, 3, 5, 7, 15, 16, 17, 31, 64, 255, 257};
  for (int seed = 1; seed <= graphs; ++seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    const int rank = 1 + pick(4);
    std::vector<int64_t> sizes;
    int64_t numel = 1;
    for (int d = 0; d < rank; ++d) {
      int64_t s = kSizes[pick(static_cast<int>(kSizes.size()))];
      if (numel * s > 20000) s = 1 + pick(3);
      sizes.push_back(s);
      numel *= s;
    }
    if (pick(12) == 0) sizes[pick(rank)] = 0;  // an empty tensor now and then
    // Reduced dims: a non-empty subset, written with negative indices half of the time.
    std::vector<int64_t> dims;
    for (int d = 0; d < rank; ++d)
      if (pick(2)) dims.push_back(pick(2) ? d : d - rank);
    if (dims.empty()) dims.push_back(pick(rank));
    bool empty_reduced = false;
    for (int64_t d : dims) empty_reduced |= sizes[(d + rank) % rank] == 0;
    const int red = pick(7);
    if (empty_reduced && (red == 2 || red == 3)) continue;  // amax/amin over nothing raise (tested elsewhere)
    const bool keepdim = pick(2);
    std::string dims_text = "[";
    for (size_t i = 0; i < dims.size(); ++i) dims_text += (i ? ", " : "") + std::to_string(dims[i]);
    dims_text += "]";
    const std::string pro = kPrologues[pick(6)];
    // Epilogues that broadcast r back need keepdim.
    std::string epi = kEpilogues[pick(6)];
    if (!keepdim && epi.find('p') != std::string::npos) epi = "r";
    std::string body = "    p = " + pro + "\n    r = " + fmt::format(fmt::runtime(kReductions[red]), "p", dims_text,
                                                                      keepdim ? "True" : "False") +
                       "\n    return " + epi;
    auto m = script("x, y", body);
    const at::ScalarType types[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
    at::ScalarType t = types[pick(4)];
    at::manual_seed(seed);
    at::Tensor x = at::randn(sizes, at::kDouble);
    const int layout = pick(3);
    if (layout == 1 && rank > 1) x = at::randn(std::vector<int64_t>(sizes.rbegin(), sizes.rend()), at::kDouble).permute(
                                      [&] { std::vector<int64_t> p; for (int d = rank - 1; d >= 0; --d) p.push_back(d); return p; }());
    if (layout == 2) {
      std::vector<int64_t> big = sizes;
      big.back() = big.back() * 2 + 1;
      x = at::randn(big, at::kDouble).slice(rank - 1, 1, c10::nullopt, 2);
    }
    at::Tensor y = at::randn({sizes.back()}, at::kDouble);
    std::string what = fmt::format("seed {}: {} {}{} layout {}\n{}", seed, c10::toString(t), c10::str(x.sizes()),
                                   c10::str(x.strides()), layout, body);
    auto r = run_and_compare(m, {x.to(t), y.to(t)}, what);
    // Fused, as ReductionCorpus requires: a plan with kernels, every op in one of them (an empty tensor
    // may leave its ops to ATen).
    ASSERT_NE(r.plan, nullptr) << what << ": ran eagerly";
    if (std::find(sizes.begin(), sizes.end(), 0) == sizes.end()) {
      EXPECT_FALSE(r.plan->kernels.empty()) << what << ": nothing fused\n" << r.plan->explain();
      EXPECT_TRUE(r.plan->aten_ops.empty()) << what << ": an op ran through ATen\n" << r.plan->explain();
    }
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace fusion_jit::testing
