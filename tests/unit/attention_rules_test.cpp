// The attention rule (passes/attention_rules.cpp, Note [Attention rule]) on printed IR: the pattern a
// model's own attention has becomes one scaled_dot_product_attention call; near misses are left alone.
// Results against eager: tests/torch/attention_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <regex>

#include "passes/passes.h"

namespace fusion_jit {
namespace {

std::string run(const std::string& ir, std::string* fired) {
  auto g = parse_graph(ir);
  std::vector<RuleApplication> log;
  run_rules(*g, attention_rules(), {}, &log);
  verify_graph(*g);
  g->renumber();
  *fired = summarize(log);
  return print_graph(*g);
}

struct Attn {
  std::string dtype = "f32";
  std::string scale = "  %6 : f32[2,4,8,8] = aten::div.Scalar(%5, 4.0)\n";  // "" for none
  std::string mask_type = "f32[2,1,1,8]";                                      // "" for none
  bool mask_first = false;
  std::string softmax_dim = "-1";
  std::string ret = "%9";
  std::string transpose = "-2, -1";
};

// An Attn with one change.
Attn with(const std::function<void(Attn&)>& change) {
  Attn a;
  change(a);
  return a;
}

// q, k, v [2,4,8,16]; scores [2,4,8,8].
std::string attention(const Attn& a) {
  const std::string t = a.dtype;
  std::string ir = "graph(%0 : " + t + "[2,4,8,16], %1 : " + t + "[2,4,8,16], %2 : " + t + "[2,4,8,16]" +
                   (a.mask_type.empty() ? "" : ", %3 : " + a.mask_type) + "):\n";
  ir += "  %4 : " + t + "[2,4,16,8]{512,128,1,16} = aten::transpose.int(%1, " + a.transpose + ")\n";
  ir += "  %5 : " + t + "[2,4,8,8] = aten::matmul(%0, %4)\n";
  std::string scores = "%5";
  if (!a.scale.empty()) {
    std::string s = a.scale;
    for (size_t i = s.find("f32"); i != std::string::npos; i = s.find("f32", i + t.size())) s.replace(i, 3, t);
    ir += s;
    scores = "%6";
  }
  if (!a.mask_type.empty()) {
    const std::string operands = a.mask_first ? "%3, " + scores : scores + ", %3";
    ir += "  %7 : " + t + "[2,4,8,8] = aten::add.Tensor(" + operands + ", 1)\n";
    scores = "%7";
  }
  ir += "  %8 : " + t + "[2,4,8,8] = aten::softmax.int(" + scores + ", " + a.softmax_dim + ", None)\n";
  ir += "  %9 : " + t + "[2,4,8,16] = aten::matmul(%8, %2)\n";
  ir += "  return (" + a.ret + ")\n";
  return ir;
}

TEST(AttentionRule, TheWrittenOutAttentionBecomesOneSdpaCall) {
  struct Case {
    const char* what;
    Attn a;
    const char* call;
  } cases[] = {
      {"divided by 4, additive mask", Attn(), "(%0, %1, %2, %3, 0.0, False, 0.25, False)"},
      {"mask first", with([](Attn& a) { a.mask_first = true; }), "(%0, %1, %2, %3, 0.0, False, 0.25, False)"},
      {"multiplied by 0.125", with([](Attn& a) { a.scale = "  %6 : f32[2,4,8,8] = aten::mul.Scalar(%5, 0.125)\n"; }),
       "(%0, %1, %2, %3, 0.0, False, 0.125, False)"},
      {"no scale, no mask", with([](Attn& a) { a.scale = ""; a.mask_type = ""; }),
       "(%0, %1, %2, None, 0.0, False, 1.0, False)"},
      {"a [T, S] mask", with([](Attn& a) { a.mask_type = "f32[8,8]"; }), "(%0, %1, %2, %3, 0.0, False, 0.25, False)"},
      {"softmax over dim 3, transpose(2, 3)", with([](Attn& a) { a.softmax_dim = "3"; a.transpose = "2, 3"; }),
       "(%0, %1, %2, %3, 0.0, False, 0.25, False)"},
      {"bfloat16", with([](Attn& a) { a.dtype = "bf16"; a.mask_type = "bf16[2,1,1,8]"; }),
       "(%0, %1, %2, %3, 0.0, False, 0.25, False)"},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(attention(c.a), &fired);
    EXPECT_EQ(fired, "attention.sdpa x1") << c.what << "\n" << out;
    EXPECT_NE(out.find(std::string("aten::scaled_dot_product_attention") + c.call), std::string::npos)
        << c.what << "\n" << out;
    EXPECT_NE(out.find("= aten::contiguous("), std::string::npos) << c.what << "\n" << out;
    EXPECT_EQ(out.find("aten::softmax"), std::string::npos) << c.what << "\n" << out;
    EXPECT_EQ(out.find("aten::matmul"), std::string::npos) << c.what << "\n" << out;
  }
}

TEST(AttentionRule, NearMissesAreLeftAlone) {
  const std::string scale_after_mask =
      "graph(%0 : f32[2,4,8,16], %1 : f32[2,4,8,16], %2 : f32[2,4,8,16], %3 : f32[2,1,1,8]):\n"
      "  %4 : f32[2,4,16,8]{512,128,1,16} = aten::transpose.int(%1, -2, -1)\n"
      "  %5 : f32[2,4,8,8] = aten::matmul(%0, %4)\n"
      "  %6 : f32[2,4,8,8] = aten::add.Tensor(%5, %3, 1)\n"
      "  %7 : f32[2,4,8,8] = aten::div.Scalar(%6, 4.0)\n"
      "  %8 : f32[2,4,8,8] = aten::softmax.int(%7, -1, None)\n"
      "  %9 : f32[2,4,8,16] = aten::matmul(%8, %2)\n"
      "  return (%9)\n";
  const std::string mask_promotes =
      "graph(%0 : bf16[2,4,8,16], %1 : bf16[2,4,8,16], %2 : f32[2,4,8,16], %3 : f32[2,1,1,8]):\n"
      "  %4 : bf16[2,4,16,8]{512,128,1,16} = aten::transpose.int(%1, -2, -1)\n"
      "  %5 : bf16[2,4,8,8] = aten::matmul(%0, %4)\n"
      "  %7 : f32[2,4,8,8] = aten::add.Tensor(%5, %3, 1)\n"
      "  %8 : f32[2,4,8,8] = aten::softmax.int(%7, -1, None)\n"
      "  %9 : f32[2,4,8,16] = aten::matmul(%8, %2)\n"
      "  return (%9)\n";
  struct Case {
    const char* what;
    std::string ir;
  } cases[] = {
      {"the probabilities are returned too", attention(with([](Attn& a) { a.ret = "%9, %8"; }))},
      {"the scores are returned too", attention(with([](Attn& a) { a.ret = "%9, %5"; }))},
      {"softmax over another dim", attention(with([](Attn& a) { a.softmax_dim = "2"; }))},
      {"a transpose of other dims", attention(with([](Attn& a) { a.transpose = "1, 3"; }))},
      {"the scale applied after the mask", scale_after_mask},
      {"a float32 mask promoting bfloat16 scores", mask_promotes},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(c.ir, &fired);
    EXPECT_EQ(fired, "") << c.what << "\n" << out;
    EXPECT_EQ(out.find("scaled_dot_product_attention"), std::string::npos) << c.what << "\n" << out;
  }
}

// torch.compile's spelling (AOT autograd): 4-d operands expanded and viewed 3-d for bmm, the scores a view
// back to 4-d, _softmax, dropout's clone; T5's two masks (position bias, padding) and a boolean mask.
std::string fx_attention(const std::string& k_expand, const std::string& masks, const std::string& last_mask) {
  return "graph(%0 : f32[2,2,8,16], %1 : f32[2,2,8,16], %2 : f32[2,2,8,16], %3 : f32[1,2,8,8], %4 : f32[2,1,1,8], "
         "%5 : b8[8,8]):\n"
         "  %10 : f32[2,2,16,8]{256,128,1,16} = aten::transpose.int(%1, 2, 3)\n"
         "  %11 : f32[2,2,8,16] = aten::expand(%0, [2, 2, 8, 16], False)\n"
         "  %12 : f32[4,8,16] = aten::view(%11, [4, 8, 16])\n" +
         k_expand +
         "  %15 : f32[4,8,8] = aten::bmm(%12, %14)\n"
         "  %16 : f32[2,2,8,8] = aten::view(%15, [2, 2, 8, 8])\n"
         "  %17 : f32[2,2,8,8] = aten::mul.Scalar(%16, 0.25)\n" +
         masks +
         "  %20 : f32[2,2,8,8] = aten::_softmax(" + last_mask + ", -1, False)\n"
         "  %21 : f32[2,2,8,8] = aten::clone(%20, None)\n"
         "  %22 : f32[2,2,8,8] = aten::expand(%21, [2, 2, 8, 8], False)\n"
         "  %23 : f32[4,8,8] = aten::view(%22, [4, 8, 8])\n"
         "  %24 : f32[2,2,8,16] = aten::expand(%2, [2, 2, 8, 16], False)\n"
         "  %25 : f32[2,2,8,16] = aten::clone(%24, 0)\n"
         "  %26 : f32[4,8,16] = aten::_unsafe_view(%25, [4, 8, 16])\n"
         "  %27 : f32[4,8,16] = aten::bmm(%23, %26)\n"
         "  return (%27)\n";
}

const char* kKt =
    "  %13 : f32[2,2,16,8] = aten::clone(%10, 0)\n"
    "  %14 : f32[4,16,8] = aten::_unsafe_view(%13, [4, 16, 8])\n";
const char* kTwoMasks =
    "  %18 : f32[2,2,8,8] = aten::add.Tensor(%17, %3, 1)\n"
    "  %19 : f32[2,2,8,8] = aten::add.Tensor(%4, %18, 1)\n";

TEST(AttentionRule, TorchCompilesSpellingBecomesOneSdpaCall) {
  struct Case {
    const char* what;
    std::string ir;
    const char* call;
  } cases[] = {
      {"position bias + padding mask", fx_attention(kKt, kTwoMasks, "%19"),
       "(%0, %1, %2, %6, 0.0, False, 0.25, False)"},
      {"a boolean mask", fx_attention(kKt, "  %19 : f32[2,2,8,8] = aten::masked_fill.Scalar(%17, %5, -inf)\n", "%19"),
       "(%0, %1, %2, %6, 0.0, False, 0.25, False)"},
      {"no mask", fx_attention(kKt, "", "%17"), "(%0, %1, %2, None, 0.0, False, 0.25, False)"},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(c.ir, &fired);
    EXPECT_EQ(fired, "attention.sdpa x1") << c.what << "\n" << out;
    EXPECT_NE(out.find(std::string("aten::scaled_dot_product_attention") + c.call), std::string::npos)
        << c.what << "\n" << out;
    EXPECT_EQ(out.find("aten::bmm"), std::string::npos) << c.what << "\n" << out;
    EXPECT_NE(out.find("f32[4,8,16] = aten::reshape("), std::string::npos) << c.what << ": the bmm's 3-d result\n" << out;
  }
  // The masks are summed once; rows they remove entirely become NaN (eager's softmax of all -inf).
  std::string fired;
  const std::string out = run(fx_attention(kKt, kTwoMasks, "%19"), &fired);
  EXPECT_NE(out.find("f32[2,2,8,8] = aten::add.Tensor(%3, %4, 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("= aten::amax(%6, [3], True)"), std::string::npos) << out;
  EXPECT_NE(out.find("= aten::masked_fill.Scalar(%8, %10, nan)"), std::string::npos) << out;
}

// The rule on a shape class whose sequence length is a symbol (Note [Symbolic sizes]): it fires, and reads
// no size as a number, so the class keeps every length (it took "s0 == 8" comparing the scores' sizes as
// numbers and typing the call's result with them, so each new length of a TorchScript model planned on its
// own, Note [Shape classes of captured graphs]).
TEST(AttentionRule, ASymbolicLengthKeepsTheClass) {
  auto symbolic = [](std::string ir, const std::string& strides, const std::string& by) {
    ir = std::regex_replace(ir, std::regex(R"((^|[\[,\s])8(?=[\],]))"), "$1s0");
    ir.replace(ir.find(strides), strides.size(), by);
    return "graph[s0=8](" + ir.substr(6);
  };
  const struct {
    const char* what;
    std::string ir;
  } cases[] = {
      {"an additive mask", symbolic(attention(Attn()), "{512,128,1,16}", "{64*s0,16*s0,1,16}")},
      {"a 1-d mask", symbolic(attention(with([](Attn& a) { a.mask_type = "f32[8]"; })), "{512,128,1,16}",
                              "{64*s0,16*s0,1,16}")},
      {"torch.compile's spelling", symbolic(fx_attention(kKt, kTwoMasks, "%19"), "{256,128,1,16}", "{32*s0,16*s0,1,16}")},
  };
  for (const auto& c : cases) {
    ShapeGuards guards;
    std::string fired, out;
    {
      GuardScope scope(guards);
      out = run(c.ir, &fired);
    }
    EXPECT_EQ(fired, "attention.sdpa x1") << c.what << "\n" << c.ir << out;
    EXPECT_FALSE(guards.specializes("s0")) << c.what << ": " << guards.guards().front().str() << "\n" << out;
  }
}

// Note [The layout of SDPA's result]: the call's type has the strides ATen's CPU kernels give its result,
// so that a plan's types hold at run time (a shape class is refused where they do not).
TEST(AttentionRule, SdpasResultIsTypedWithTheLayoutTheLibraryGives) {
  const std::string transposed = "%0 : f32[2,4,8,16], %1 :";
  const std::string heads = "%0 : f32[2,4,8,16]{512,16,64,1}, %1 :";  // q: a [B, T, H, D] tensor's transpose
  std::string ir = attention(Attn());
  ir.replace(ir.find(transposed), transposed.size(), heads);
  const struct {
    const char* what;
    std::string ir;
    const char* type;
  } cases[] = {
      {"a contiguous query: contiguous", attention(Attn()), "f32[2,4,8,16] = aten::scaled_dot_product_attention("},
      {"a query that is [B, T, H, D] transposed: that layout", ir,
       "f32[2,4,8,16]{512,16,64,1} = aten::scaled_dot_product_attention("},
      {"on a GPU: contiguous (the kernel depends on the card)",
       std::regex_replace(ir, std::regex(R"(f32\[[^\]]*\](\{[^}]*\})?)"), "$&@cuda:0"),
       "= aten::scaled_dot_product_attention("},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(c.ir, &fired);
    ASSERT_EQ(fired, "attention.sdpa x1") << c.what << "\n" << out;
    EXPECT_NE(out.find(c.type), std::string::npos) << c.what << "\n" << out;
  }
  // A symbolic length: the strides are expressions of it.
  std::string sym = std::regex_replace(ir, std::regex(R"((^|[\[,\s])8(?=[\],]))"), "$1s0");
  sym = std::regex_replace(sym, std::regex(R"(\{512,16,64,1\})"), "{64*s0,16,64,1}");
  sym = std::regex_replace(sym, std::regex(R"(\{512,128,1,16\})"), "{64*s0,16*s0,1,16}");
  std::string fired;
  const std::string out = run("graph[s0=8](" + sym.substr(6), &fired);
  ASSERT_EQ(fired, "attention.sdpa x1") << sym << out;
  EXPECT_NE(out.find("f32[2,4,s0,16]{64*s0,16,64,1} = aten::scaled_dot_product_attention("), std::string::npos) << out;
}

TEST(AttentionRule, TorchCompilesNearMissesDeclineWithAReason) {
  // k^T expanded over a broadcast head dim: what bmm reads is not a transpose of a [B, H, S, D] k.
  const std::string broadcast_k =
      "  %30 : f32[2,1,16,8] = aten::slice.Tensor(%10, 1, 0, 1, 1)\n"
      "  %13 : f32[2,2,16,8] = aten::expand(%30, [2, 2, 16, 8], False)\n"
      "  %31 : f32[2,2,16,8] = aten::clone(%13, 0)\n"
      "  %14 : f32[4,16,8] = aten::_unsafe_view(%31, [4, 16, 8])\n";
  struct Case {
    const char* what;
    std::string ir;
    const char* reason;
  } cases[] = {
      {"a broadcast k", fx_attention(broadcast_k, kTwoMasks, "%19"), "k^T is not a transpose of k's last two dims"},
      {"the probabilities (dropout's clone) also returned",
       [] {
         std::string ir = fx_attention(kKt, kTwoMasks, "%19");
         ir.replace(ir.find("return (%27)"), 12, "return (%27, %21)");
         return ir;
       }(),
       "the probabilities are also used elsewhere"},
      {"a finite masked_fill",
       fx_attention(kKt, "  %19 : f32[2,2,8,8] = aten::masked_fill.Scalar(%17, %5, -10000.0)\n", "%19"),
       "a masked_fill with a value other than -inf"},
  };
  for (const auto& c : cases) {
    auto g = parse_graph(c.ir);
    std::vector<RuleApplication> log;
    run_rules(*g, attention_rules(), {}, &log);
    EXPECT_EQ(summarize(log), "") << c.what;
    ASSERT_EQ(log.size(), 1u) << c.what;
    EXPECT_EQ(log[0].rule, "attention.sdpa");
    EXPECT_NE(log[0].replaced.find("= aten::bmm"), std::string::npos) << c.what;
    EXPECT_NE(log[0].declined.find(c.reason), std::string::npos) << c.what << ": " << log[0].declined;
  }
}

}  // namespace
}  // namespace fusion_jit
