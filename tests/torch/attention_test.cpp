// The attention rule (passes/attention_rules.cpp, Note [Attention rule]) against eager: a model's own
// attention compiled through fusion_jit runs as one scaled_dot_product_attention call and computes eager's
// result (by the tolerance rule, against the fp64 reference); near misses keep eager's ops and results.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "test_util.h"

namespace fusion_jit::testing {
namespace {

// softmax(q @ k^T `scale` [+ mask]) @ v, with `extra` returned too when given.
torch::jit::Module attention(const std::string& scale, bool mask, const std::string& extra = "") {
  std::string body = "    s = torch.matmul(q, k.transpose(-2, -1))" + scale + "\n";
  if (mask) body += "    s = s + mask\n";
  body += "    p = torch.softmax(s, -1)\n    o = torch.matmul(p, v)\n";
  body += extra.empty() ? "    return o\n" : "    return (o, " + extra + ")\n";
  return script(mask ? "q, k, v, mask" : "q, k, v", body);
}

int sdpa_calls(const RunResult& r) {
  auto it = r.plan->aten_ops.find("aten::scaled_dot_product_attention");
  return it == r.plan->aten_ops.end() ? 0 : it->second;
}

struct Case {
  std::string what;
  torch::jit::Module m;
  std::vector<c10::IValue> in;
};

// Each case against eager, with `calls` SDPA calls in its plan.
void expect_sdpa_calls(std::vector<Case>& cases, int calls) {
  for (auto& c : cases) {
    auto r = run_and_compare(c.m, c.in, c.what);
    ASSERT_NE(r.plan, nullptr) << c.what;
    EXPECT_EQ(sdpa_calls(r), calls) << c.what << "\n" << r.plan->explain();
  }
}

TEST(Attention, WrittenOutAttentionIsOneSdpaCallAndMatchesEager) {
  at::manual_seed(0);
  const int64_t B = 2, H = 4, T = 16, D = 32;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    auto q = at::randn({B, H, T, D}).to(dtype);
    auto k = at::randn({B, H, T, D}).to(dtype);
    auto v = at::randn({B, H, T, D}).to(dtype);
    struct Case {
      std::string what, scale;
      bool mask;
      at::Tensor m;
    } cases[] = {
        {"/ sqrt(D), padding mask [B,1,1,T]", " / 5.656854249492381", true,
         at::where(at::rand({B, 1, 1, T}) > 0.2, 0.0, -10000.0).to(dtype)},
        {"* 0.125, mask [T,T]", " * 0.125", true, at::randn({T, T}).to(dtype)},
        {"no scale, no mask", "", false, {}},
    };
    for (const auto& c : cases) {
      const std::string what = c.what + " in " + c10::toString(dtype);
      auto m = attention(c.scale, c.mask);
      std::vector<c10::IValue> in = {q, k, v};
      if (c.mask) in.emplace_back(c.m);
      auto r = run_and_compare(m, in, what);
      ASSERT_NE(r.plan, nullptr) << what;
      EXPECT_EQ(sdpa_calls(r), 1) << what << "\n" << r.plan->explain();
      EXPECT_NE(r.plan->explain().find("attention.sdpa x1"), std::string::npos) << what;
      EXPECT_TRUE(r.fused.at(0).is_contiguous()) << what << ": eager's layout";
    }
  }
}

// A self-attention block as models write it: projections, heads split by view + transpose (q, k and v
// reach SDPA as transposed views), heads merged back, output projection.
TEST(Attention, ASelfAttentionBlockMatchesEager) {
  torch::jit::setGraphExecutorOptimize(false);
  at::manual_seed(0);
  torch::jit::Module m("SelfAttention");
  const int64_t E = 64;
  for (const char* w : {"wq", "wk", "wv", "wo"}) m.register_parameter(w, at::randn({E, E}) * 0.1, false);
  m.define(R"(
def forward(self, x, mask):
    B, T, E = x.shape
    q = torch.linear(x, self.wq).view(B, T, 4, 16).transpose(1, 2)
    k = torch.linear(x, self.wk).view(B, T, 4, 16).transpose(1, 2)
    v = torch.linear(x, self.wv).view(B, T, 4, 16).transpose(1, 2)
    s = torch.matmul(q, k.transpose(-2, -1)) / 4.0 + mask
    o = torch.matmul(torch.softmax(s, -1), v)
    return torch.linear(o.transpose(1, 2).reshape(B, T, E), self.wo)
)");
  m.eval();
  auto x = at::randn({2, 12, E});
  auto mask = at::triu(at::full({12, 12}, -1e9), 1);  // causal, additive
  auto r = run_and_compare(m, {x, mask}, "self-attention block");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(sdpa_calls(r), 1) << r.plan->explain();
}

// A causal block as GPT writes it (the mask from torch.triu, masked_fill with -inf, softmax @ v, a layer
// norm), captured by TorchScript over lengths and batch sizes: after the captures a class is made from,
// every signature is an instance of its shape class's plan. SDPA's CPU result is laid out as the query's
// [B, T, H, D] source (Note [The layout of SDPA's result]); while its type said contiguous, the class's
// first run refused it and each signature was captured, planned and compiled on its own.
TEST(Attention, ACausalBlockOverLengthsAndBatchesIsOneShapeClass) {
  torch::jit::setGraphExecutorOptimize(false);
  at::manual_seed(0);
  torch::jit::Module m("CausalBlock");
  m.register_parameter("wqkv", at::randn({96, 32}) * 0.2, false);
  m.register_parameter("g", at::rand({32}) + 0.5, false);
  m.define(R"(
def forward(self, x):
    B, T, C = x.shape
    q, k, v = torch.linear(torch.layer_norm(x, [C], self.g), self.wqkv).split(C, 2)
    q = q.view(B, T, 4, 8).transpose(1, 2)
    k = k.view(B, T, 4, 8).transpose(1, 2)
    v = v.view(B, T, 4, 8).transpose(1, 2)
    mask = torch.triu(torch.ones(T, T), 1) > 0.5
    att = torch.softmax((torch.matmul(q, k.transpose(-2, -1)) * 0.35).masked_fill(mask, float('-inf')), -1)
    return x + torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
)");
  m.eval();
  auto fused = compile(m);
  int instances = 0, signatures = 0;
  for (int64_t b : {2, 3})
    for (int64_t t : {5, 9, 12, 7, 16}) {
      const std::string what = fmt::format("[{},{},32]", b, t);
      auto r = compare_with_eager(fused, m, {at::randn({b, t, 32})}, what);
      ASSERT_NE(r.plan, nullptr) << what;
      EXPECT_EQ(sdpa_calls(r), 1) << what << "\n" << r.plan->explain();
      ++signatures;
      if (!r.plan->bindings.empty()) ++instances;
    }
  // The first two captures of each batch size make a class; the rest are its instances.
  EXPECT_GE(fused.stats().class_plans, 1);
  EXPECT_GE(instances, signatures - 4) << fused.stats().class_plans << " class plans";
}

TEST(Attention, NearMissesKeepEagersOps) {
  at::manual_seed(0);
  auto q = at::randn({2, 4, 8, 16}), k = at::randn({2, 4, 8, 16}), v = at::randn({2, 4, 8, 16});
  std::vector<Case> cases = {
      {"the probabilities are returned too", attention(" / 4.0", false, "p"), {q, k, v}},
      {"the scale after the mask", script("q, k, v, mask",
                                          "    s = (torch.matmul(q, k.transpose(-2, -1)) + mask) / 4.0\n"
                                          "    return torch.matmul(torch.softmax(s, -1), v)\n"),
       {q, k, v, at::randn({8, 8})}},
      {"a mask with more dims than the scores (5-d scores)", attention(" / 4.0", true),
       {q, k, v, at::randn({3, 1, 1, 8, 8})}},
      {"softmax over the queries", script("q, k, v", "    s = torch.matmul(q, k.transpose(-2, -1))\n"
                                                       "    return torch.matmul(torch.softmax(s, 2), v)\n"),
       {q, k, v}},
  };
  expect_sdpa_calls(cases, 0);
}

// Boolean masks (masked_fill with -inf: padding, causal triu), masks summed (T5's position bias plus the
// padding mask), dropout in inference: one SDPA call, eager's result.
TEST(Attention, BooleanCausalAndSummedMasksAreOneSdpaCall) {
  at::manual_seed(0);
  const int64_t B = 2, H = 2, T = 12, D = 16;
  auto q = at::randn({B, H, T, D}), k = at::randn({B, H, T, D}), v = at::randn({B, H, T, D});
  auto pad = at::rand({B, 1, 1, T}) > 0.7;
  pad.index_put_({at::indexing::Slice(), 0, 0, 0}, false);  // no row removed entirely
  std::vector<Case> cases = {
      {"masked_fill(padding, -inf)",
       script("q, k, v, pad", "    s = torch.matmul(q, k.transpose(-2, -1)) / 4.0\n"
                              "    s = s.masked_fill(pad, float('-inf'))\n"
                              "    return torch.matmul(torch.softmax(s, -1), v)\n"),
       {q, k, v, pad}},
      {"causal triu computed in the graph",
       script("q, k, v", "    s = torch.matmul(q, k.transpose(-2, -1)) * 0.25\n"
                         "    c = torch.triu(torch.ones([12, 12]), 1) > 0.5\n"
                         "    s = torch.masked_fill(s, c, float('-inf'))\n"
                         "    return torch.matmul(torch.softmax(s, -1), v)\n"),
       {q, k, v}},
      {"bias + padding mask + dropout(p, train=False)",
       script("q, k, v, bias, mask", "    s = torch.matmul(q, k.transpose(3, 2))\n"
                                     "    s = s + bias\n"
                                     "    s = s + mask\n"
                                     "    p = torch.dropout(torch.softmax(s, -1), 0.1, False)\n"
                                     "    return torch.matmul(p, v)\n"),
       {q, k, v, at::randn({1, H, T, T}), at::where(pad, -1e9, 0.0).to(at::kFloat)}},
      {"k^T by permute, additive and boolean masks",
       script("q, k, v, mask, pad", "    s = torch.matmul(q, k.permute([0, 1, 3, 2])) * 0.25 + mask\n"
                                    "    s = s.masked_fill(pad, float('-inf'))\n"
                                    "    return torch.matmul(torch.softmax(s, -1), v)\n"),
       {q, k, v, at::randn({T, T}), pad}},
  };
  expect_sdpa_calls(cases, 1);
}

// Rows a mask removes entirely: eager's softmax gives NaN there, SDPA's kernels 0; the rule gives eager's.
TEST(Attention, RowsTheMaskRemovesEntirelyAreNanAsInEager) {
  at::manual_seed(0);
  const int64_t B = 2, H = 2, T = 8, D = 16;
  auto q = at::randn({B, H, T, D}), k = at::randn({B, H, T, D}), v = at::randn({B, H, T, D});
  auto additive = at::zeros({B, 1, T, T});
  additive.index_put_({1, 0, 3}, -INFINITY);  // batch 1, query 3: every key removed
  auto removed = at::zeros({T, T}, at::kBool);
  removed.index_put_({5}, true);  // query 5: every key removed
  auto scalar = at::full({}, -INFINITY);  // a 0-d mask removing everything
  struct Case {
    std::string what;
    torch::jit::Module m;
    std::vector<c10::IValue> in;
  } cases[] = {
      {"additive -inf row", attention(" * 0.25", true), {q, k, v, additive}},
      {"boolean row", script("q, k, v, m", "    s = torch.matmul(q, k.transpose(-2, -1)).masked_fill(m, float('-inf'))\n"
                                           "    return torch.matmul(torch.softmax(s, -1), v)\n"),
       {q, k, v, removed}},
      {"0-d -inf mask", attention(" * 0.25", true), {q, k, v, scalar}},
  };
  for (auto& c : cases) {
    auto r = run_and_compare(c.m, c.in, c.what);
    ASSERT_NE(r.plan, nullptr) << c.what;
    EXPECT_EQ(sdpa_calls(r), 1) << c.what << "\n" << r.plan->explain();
    auto nan = at::isnan(r.fused.at(0));
    EXPECT_TRUE(at::equal(nan, at::isnan(r.eager.at(0)))) << c.what;
    EXPECT_GT(nan.sum().item<int64_t>(), 0) << c.what << ": eager's NaN rows";
  }
}

// Near misses the rule names in explain: what the user changes to get one SDPA call.
TEST(Attention, DeclinesSayWhy) {
  at::manual_seed(0);
  auto q = at::randn({2, 4, 8, 16}), k = at::randn({2, 4, 8, 16}), v = at::randn({2, 4, 8, 16});
  auto pad = at::rand({2, 1, 1, 8}) > 0.5;
  struct Case {
    std::string what, reason;
    torch::jit::Module m;
    std::vector<c10::IValue> in;
  } cases[] = {
      {"masked_fill with a finite value", "a masked_fill with a value other than -inf",
       script("q, k, v, pad", "    s = torch.matmul(q, k.transpose(-2, -1)).masked_fill(pad, -10000.0)\n"
                              "    return torch.matmul(torch.softmax(s, -1), v)\n"),
       {q, k, v, pad}},
      {"a float16 mask on float32 scores", "an added mask is f16 where the scores are f32",
       attention(" / 4.0", true), {q, k, v, at::randn({8, 8}, at::kHalf)}},
      {"the scale after the mask", "a mask is applied before the scale",
       script("q, k, v, mask", "    s = (torch.matmul(q, k.transpose(-2, -1)) + mask) / 4.0\n"
                               "    return torch.matmul(torch.softmax(s, -1), v)\n"),
       {q, k, v, at::randn({8, 8})}},
      {"the probabilities returned", "the probabilities are also used elsewhere", attention(" / 4.0", false, "p"),
       {q, k, v}},
      {"softmax over the queries", "the softmax is not over the last dim",
       script("q, k, v", "    s = torch.matmul(q, k.transpose(-2, -1))\n"
                         "    return torch.matmul(torch.softmax(s, 2), v)\n"),
       {q, k, v}},
  };
  for (auto& c : cases) {
    auto r = run_and_compare(c.m, c.in, c.what);
    ASSERT_NE(r.plan, nullptr) << c.what;
    EXPECT_EQ(sdpa_calls(r), 0) << c.what;
    const std::string text = r.plan->explain();
    EXPECT_NE(text.find("declined: attention.sdpa at "), std::string::npos) << c.what << "\n" << text;
    EXPECT_NE(text.find(c.reason), std::string::npos) << c.what << "\n" << text;
  }
}

}  // namespace
}  // namespace fusion_jit::testing
