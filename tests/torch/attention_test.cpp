// The attention rule (passes/attention_rules.cpp, Note [Attention rule]) against eager: a model's own
// attention compiled through fusion_jit runs as one scaled_dot_product_attention call and computes eager's
// result (by the tolerance rule, against the fp64 reference); near misses keep eager's ops and results.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

TEST(Attention, NearMissesKeepEagersOps) {
  at::manual_seed(0);
  auto q = at::randn({2, 4, 8, 16}), k = at::randn({2, 4, 8, 16}), v = at::randn({2, 4, 8, 16});
  struct Case {
    std::string what;
    torch::jit::Module m;
    std::vector<c10::IValue> in;
  } cases[] = {
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
  for (auto& c : cases) {
    auto r = run_and_compare(c.m, c.in, c.what);
    ASSERT_NE(r.plan, nullptr) << c.what;
    EXPECT_EQ(sdpa_calls(r), 0) << c.what << "\n" << r.plan->explain();
  }
}

}  // namespace
}  // namespace fusion_jit::testing
