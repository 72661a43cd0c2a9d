// The rules around convolutions (passes/conv_rules.cpp) against eager: conv + batch_norm + activation
// modules compiled through fusion_jit compute eager's results (by the tolerance rule), and the plan is
// the one the rules promise.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <iostream>

#include <fmt/format.h>

#include "cost/cost_model.h"
#include "kernels_cache/kernels_cache.h"
#include "torch/executor.h"
#include "torch/graph_function.h"
#include "torch/module_access.h"
#include "passes/passes.h"
#include "runtime/profile.h"
#include "support/options.h"
#include "test_util.h"

namespace fusion_jit::testing {
namespace {

at::Tensor input(at::ScalarType dtype) { return at::randn({2, 8, 20, 20}).to(dtype); }

// Two settings, each a process (options are read once): torch_tests runs these tests with the defaults
// (Note [Channels-last plans]: conv weights channels-last at capture, oneDNN's channels-last results are
// the plan's layout, the outputs get eager's layout back at the end); the ctest entry conv_rules runs them
// with FUSION_JIT_DISABLE=channels_last and FUSION_JIT_ENABLE=onednn_nchw (NCHW plans, each oneDNN result
// copied back to NCHW). The plans' steps are the same but where a test says otherwise.
bool nchw_plans() { return Options::get().disabled.count("channels_last") > 0; }
// The kernels a channels-last plan adds for a convolution's NCHW input of 8 channels: its channels-last copy
// (layout.conv_input, Note [A convolution's NCHW input copied by our kernel]), which oneDNN's call made
// itself before.
size_t input_copies() { return nchw_plans() ? 0 : 1; }
#define REQUIRE_ONEDNN_RULES()                                                                                  \
  if (nchw_plans() && !Options::get().is_enabled("onednn_nchw"))                                               \
  GTEST_SKIP() << "NCHW plans without FUSION_JIT_ENABLE=onednn_nchw: the oneDNN rules decline (unit tests)"

// Whether oneDNN takes bfloat16 on this CPU (eager's own check). Where it does not (a CPU without AVX512BW,
// VL and DQ or AVX-NE-CONVERT), the rules leave bfloat16 convolutions and linears to eager's ops and
// explain says why: before, the plan called oneDNN's bfloat16 ops, which throw there.
bool onednn_bf16() {
  return c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_is_mkldnn_bf16_supported", "").typed<bool()>().call();
}
constexpr const char* kNoBf16 = "oneDNN takes no bfloat16 on this CPU";

TEST(ConvRules, ConvBatchNormReluIsOneOneDnnCallAndMatchesEager) {
  REQUIRE_ONEDNN_RULES();
  auto m = conv_block("torch.relu(y)", /*bn=*/true, at::kFloat);
  auto r = run_and_compare(m, {input(at::kFloat)}, "conv + batch_norm + relu");
  ASSERT_NE(r.plan, nullptr);
  const std::string ex = r.plan->explain();
  EXPECT_TRUE(r.plan->kernels.empty()) << ex;
  // One step (the issue's acceptance for the demo's conv_bn_relu): the call on the folded weight made NCHW
  // writes eager's NCHW layout itself (prepack.nchw_result), where a reordered weight would make oneDNN write
  // channels-last and a copy give NCHW back.
  EXPECT_EQ(r.plan->aten_ops, (std::map<std::string, int>{{"mkldnn::_convolution_pointwise", 1}})) << ex;
  EXPECT_TRUE(r.fused.at(0).is_contiguous()) << "eager's layout";
  EXPECT_NE(ex.find("fold.conv_bn x1"), std::string::npos) << ex;
  EXPECT_NE(ex.find("epilogue.conv_relu x1"), std::string::npos) << ex;
}

// CompileOptions::disable leaves rules out for one module, beside FUSION_JIT_DISABLE's process-wide names.
TEST(ConvRules, DisableOptionLeavesRulesOutForOneModule) {
  REQUIRE_ONEDNN_RULES();
  auto m = conv_block("torch.relu(y)", /*bn=*/true, at::kFloat);
  CompileOptions o;
  o.disable = {"epilogue.conv_relu"};
  auto r = run_and_compare(m, {input(at::kFloat)}, "conv + batch_norm + relu, epilogue.conv_relu disabled", o);
  ASSERT_NE(r.plan, nullptr);
  std::string ex = r.plan->explain();
  EXPECT_NE(ex.find("fold.conv_bn x1"), std::string::npos) << ex;
  EXPECT_EQ(ex.find("epilogue.conv_relu"), std::string::npos) << ex;
  EXPECT_EQ(r.plan->kernels.size(), 1u + input_copies()) << "relu in our kernel\n" << ex;
  if (input_copies()) {
    EXPECT_NE(ex.find("layout.conv_input x1"), std::string::npos) << ex;
  }
  o.disable = {"fold", "epilogue", "prepack"};
  r = run_and_compare(m, {input(at::kFloat)}, "conv + batch_norm + relu, three rule sets disabled", o);
  ASSERT_NE(r.plan, nullptr);
  ex = r.plan->explain();
  EXPECT_EQ(ex.find("fold."), std::string::npos) << ex;
  EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_convolution_pointwise"), 0u) << ex;
  // The module compiled without the option still gets every rule.
  r = run_and_compare(m, {input(at::kFloat)}, "conv + batch_norm + relu");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_NE(r.plan->explain().find("epilogue.conv_relu x1"), std::string::npos);
  for (const char* bad : {"no_such_rule", "fusion"}) {
    o.disable = {bad};
    try {
      compile(m, o);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("fold.conv_bn"), std::string::npos) << "lists the names it takes: " << msg;
      if (std::string(bad) == "fusion") {
        EXPECT_NE(msg.find("FUSION_JIT_DISABLE"), std::string::npos) << msg;
      }
    }
  }
}

TEST(ConvRules, EveryPostOpMatchesEagerInFloat32AndBFloat16) {
  REQUIRE_ONEDNN_RULES();
  const char* acts[] = {"torch.relu(y)",
                        "torch.sigmoid(y)",
                        "torch.tanh(y)",
                        "torch.hardswish(y)",
                        "torch.silu(y)",
                        "torch.hardsigmoid(y)",
                        "torch.gelu(y)",
                        "torch.gelu(y, approximate='tanh')",
                        "torch.leaky_relu(y, 0.2)",
                        "torch.hardtanh(y, -0.5, 0.75)",
                        "torch.relu6(y)"};
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const char* act : acts) {
      for (bool bn : {false, true}) {
        const std::string what = std::string(act) + (bn ? " after batch_norm" : "") + " in " + c10::toString(dtype);
        auto m = conv_block(act, bn, dtype);
        auto r = run_and_compare(m, {input(dtype)}, what);
        ASSERT_NE(r.plan, nullptr) << what;
        const std::string ex = r.plan->explain();
        if (dtype == at::kBFloat16 && !onednn_bf16()) {
          EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_convolution_pointwise"), 0u) << what << "\n" << ex;
          EXPECT_NE(ex.find(kNoBf16), std::string::npos) << what << "\n" << ex;
          continue;
        }
        // bfloat16's batch_norm is not folded: the conv is prepacked alone, the rest is our kernel.
        const bool post_op = dtype == at::kFloat || !bn;
        EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_convolution_pointwise"), 1u) << what << "\n" << ex;
        EXPECT_NE(ex.find(post_op ? "epilogue.conv_" : "prepack.conv x1"), std::string::npos) << what << "\n" << ex;
        // With a post-op the call is the plan's output and writes NCHW itself (prepack.nchw_result): its
        // NCHW input is not copied.
        EXPECT_EQ(r.plan->kernels.size(), post_op ? 0u : 1u + input_copies()) << what << "\n" << ex;
      }
    }
  }
}

// Note [Channels-last plans]: a TorchScript model's plan is channels-last where the cost model says the
// layout pays (decide_channels_last): the conv block returning its conv output as well copies two 4-d
// outputs back to NCHW; with 16 output channels what the convolution writes does not pay for that (with
// the default constants: gain 0.75 ns x 12800 against 0.3 ns x 32000), with 32 it does. The plan follows
// the estimate explain prints, and its results are eager's either way.
TEST(ConvRules, ATorchScriptPlanIsChannelsLastWhereTheCostModelSaysItPays) {
  REQUIRE_ONEDNN_RULES();
  for (int64_t channels : {16, 32}) {
    const std::string what = fmt::format("conv block of {} channels returning its conv", channels);
    auto m = conv_block("torch.relu(y)", /*bn=*/true, at::kFloat, /*return_conv=*/true, channels);
    auto r = run_and_compare(m, {input(at::kFloat)}, what);
    ASSERT_NE(r.plan, nullptr) << what;
    const std::string ex = r.plan->explain();
    if (nchw_plans()) {  // FUSION_JIT_DISABLE=channels_last: nothing to decide
      EXPECT_EQ(ex.find("layout:"), std::string::npos) << what << "\n" << ex;
      continue;
    }
    const int64_t written = 2 * channels * 20 * 20, edges = 2 * 8 * 20 * 20 + 2 * written;
    const LayoutEstimate e = channels_last_estimate(host_cpu_description(), written, 0, 0, edges);
    const bool pays = e.gain_us > e.cost_us;
    if (DeviceDescription().cl_gain_ns_per_written == 0.75 && DeviceDescription().cl_ns_per_edge == 0.3) {
      EXPECT_EQ(pays, channels == 32) << what << ": the default constants";
    }
    const std::string line = fmt::format("est. gain {:.1f} us ({} elements written by 1 convolution(s)), cost {:.1f} us "
                                         "({} copied at the edges; the weights copied once)",
                                         e.gain_us, written, e.cost_us, edges);
    EXPECT_NE(ex.find((pays ? "layout: channels-last activations: " : "layout: NCHW kept, channels-last activations "
                                                                      "would not pay: ") + line),
              std::string::npos) << what << "\n" << ex;
    // Channels-last: oneDNN's call on the channels-last weight; NCHW: ATen's convolution.
    EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_convolution_pointwise"), pays ? 1u : 0u) << what << "\n" << ex;
    EXPECT_EQ(r.plan->aten_ops.count("aten::conv2d"), pays ? 0u : 1u) << what << "\n" << ex;
  }
}

// A conv probe of given times (Note [Convolutions timed on this machine]): ATen's on NCHW, oneDNN's on
// channels-last, oneDNN's on NCHW, the copy to NCHW.
struct ForcedConvProbe {
  static inline ConvTiming times;
  static inline int calls = 0;
  ConvProbe saved;
  explicit ForcedConvProbe(ConvTiming t) : saved(set_conv_probe(&time)) {
    times = t;
    calls = 0;
  }
  ~ForcedConvProbe() { set_conv_probe(saved); }
  static std::optional<ConvTiming> time(const ConvShape& s) {
    EXPECT_EQ(s.x.size(), 4u);
    EXPECT_EQ(s.w.size(), 4u);
    calls++;
    return times;
  }
};

// The layout follows the convolution's times where they were taken: the block that the estimate makes
// channels-last (32 channels, ATorchScriptPlanIsChannelsLastWhereTheCostModelSaysItPays) stays NCHW where
// ATen's convolution timed faster than oneDNN's channels-last one, and either way computes eager's results.
TEST(ConvRules, TheLayoutFollowsTheConvolutionsTimes) {
  if (nchw_plans()) GTEST_SKIP() << "FUSION_JIT_DISABLE=channels_last: no layout to decide";
  for (const bool cl_faster : {false, true}) {
    ForcedConvProbe probe(cl_faster ? ConvTiming{5000, 100, 6000, 50} : ConvTiming{100, 5000, 6000, 50});
    const std::string what = cl_faster ? "channels-last timed faster" : "ATen's NCHW timed faster";
    auto m = conv_block("torch.relu(y)", /*bn=*/true, at::kFloat, /*return_conv=*/true, 32);
    auto r = run_and_compare(m, {input(at::kFloat)}, what);
    ASSERT_NE(r.plan, nullptr) << what;
    const std::string ex = r.plan->explain();
    EXPECT_GT(ForcedConvProbe::calls, 0) << what;
    const std::string line = fmt::format("{}gain {:.1f} us (1 of 1 convolution(s) timed here: ATen's on NCHW {:.1f} us, "
                                         "oneDNN's on channels-last {:.1f} us), cost ",
                                         cl_faster ? "layout: channels-last activations: " : "layout: NCHW kept, channels-last "
                                                                                          "activations would not pay: ",
                                         ForcedConvProbe::times.aten_us - ForcedConvProbe::times.onednn_cl_us,
                                         ForcedConvProbe::times.aten_us, ForcedConvProbe::times.onednn_cl_us);
    EXPECT_NE(ex.find(line), std::string::npos) << what << "\n" << ex;
    EXPECT_EQ(r.plan->aten_ops.count("aten::conv2d"), cl_faster ? 0u : 1u) << what << "\n" << ex;
  }
}

// prepack.nchw_result takes the call on the plain weight only where it timed faster than the call on the
// reordered weight plus the copy to NCHW; otherwise the copy stays, and explain gives the times.
TEST(ConvRules, AnNchwResultIsWrittenByOneDnnOnlyWhereThatTimedFaster) {
  REQUIRE_ONEDNN_RULES();
  for (const bool nchw_faster : {true, false}) {
    ForcedConvProbe probe(nchw_faster ? ConvTiming{5000, 100, 120, 50} : ConvTiming{5000, 100, 400, 50});
    const std::string what = nchw_faster ? "oneDNN's NCHW call timed faster" : "the call and copy timed faster";
    auto m = conv_block("torch.relu(y)", /*bn=*/true, at::kFloat);
    auto r = run_and_compare(m, {input(at::kFloat)}, what);
    ASSERT_NE(r.plan, nullptr) << what;
    const std::string ex = r.plan->explain();
    EXPECT_EQ(ex.find("prepack.nchw_result x1") != std::string::npos, nchw_faster) << what << "\n" << ex;
    EXPECT_EQ(ex.find("declined: prepack.nchw_result at") != std::string::npos, !nchw_faster) << what << "\n" << ex;
    if (!nchw_faster) {
      EXPECT_NE(ex.find("timed here: oneDNN on the plain weight 400 us, on the reordered weight 100 us and the copy "
                        "to NCHW 50 us"),
                std::string::npos)
          << ex;
    }
    EXPECT_TRUE(r.fused.at(0).is_contiguous()) << what << ": eager's layout";
  }
}

// The adapter's conv probe times every form on this machine, draws no random numbers, and keeps the times
// in the kernel cache as text read back only when it is four positive finite numbers.
TEST(ConvRules, TheConvProbeTimesEveryFormAndKeepsTheTimes) {
  if (!at::hasMKLDNN()) GTEST_SKIP() << "no oneDNN in this build of torch";
  const ConvShape shape{{2, 8, 12, 12}, {16, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, DType::kFloat32, true};
  at::manual_seed(7);
  const at::Tensor expected = at::randn({8});
  at::manual_seed(7);
  const std::optional<ConvTiming> t = time_convolution(shape);
  EXPECT_TRUE(at::equal(at::randn({8}), expected));
  ASSERT_TRUE(t.has_value());
  for (double us : {t->aten_us, t->onednn_cl_us, t->onednn_nchw_us, t->copy_us}) EXPECT_GT(us, 0);
  auto entry = KernelsCache::instance().get(conv_timing_key(shape, at::get_num_threads()));
  ASSERT_TRUE(entry.has_value());
  const std::optional<ConvTiming> back = parse_conv_timing(*entry);
  ASSERT_TRUE(back.has_value()) << *entry;
  EXPECT_NEAR(back->aten_us, t->aten_us, 1e-3);
  EXPECT_NEAR(back->copy_us, t->copy_us, 1e-3);
  // The suite runs with FUSION_JIT_DISABLE=conv_timing (CMakeLists.txt): the registered probe then times
  // nothing, and the decisions take the estimates.
  const ConvProbe real = set_conv_probe(nullptr);
  set_conv_probe(real);
  ASSERT_NE(real, nullptr);
  if (Options::get().is_disabled("conv_timing")) {
    EXPECT_FALSE(real(shape).has_value());
  }
  for (const char* bad : {"", "1 2 3\n", "1 2 3 4 5\n", "nan 2 3 4\n", "1 2 3 inf\n", "-1 2 3 4\n", "0 2 3 4\n",
                          "1 2 3 4\nrm -rf /\n", "1e300 2 3 4\n"})
    EXPECT_FALSE(parse_conv_timing(bad).has_value()) << bad;
  ConvShape other = shape;
  other.dtype = DType::kBFloat16;
  EXPECT_NE(conv_timing_key(shape, 2), conv_timing_key(other, 2));
  EXPECT_NE(conv_timing_key(shape, 2), conv_timing_key(shape, 1));
}

TEST(ConvRules, NearMissesComputeEagerResultsWithoutTheRules) {
  REQUIRE_ONEDNN_RULES();
  {  // the conv's output is returned too: not folded, no post-op; the conv alone is prepacked. 32 output
     // channels: with two 4-d outputs copied back to NCHW, 16 would not pay for a channels-last plan
     // (decide_channels_last, Note [Channels-last plans]).
    auto m = conv_block("torch.relu(y)", /*bn=*/true, at::kFloat, /*return_conv=*/true, /*channels=*/32);
    auto r = run_and_compare(m, {input(at::kFloat)}, "conv output returned");
    ASSERT_NE(r.plan, nullptr);
    const std::string ex = r.plan->explain();
    EXPECT_EQ(ex.find("fold.conv_bn"), std::string::npos) << ex;
    EXPECT_EQ(ex.find("epilogue."), std::string::npos) << ex;
    EXPECT_NE(ex.find("prepack.conv x1"), std::string::npos) << ex;
    EXPECT_TRUE(r.fused.at(1).is_contiguous()) << "the returned conv output has eager's layout";
  }
  {  // a channels-last input: eager's result is channels-last, oneDNN's too: no copy in either setting
    auto m = conv_block("torch.relu(y)", /*bn=*/true, at::kFloat);
    at::Tensor x = input(at::kFloat).contiguous(at::MemoryFormat::ChannelsLast);
    auto r = run_and_compare(m, {x}, "channels-last input");
    ASSERT_NE(r.plan, nullptr);
    EXPECT_EQ(r.plan->aten_ops, (std::map<std::string, int>{{"mkldnn::_convolution_pointwise", 1}}))
        << r.plan->explain();
    EXPECT_TRUE(r.fused.at(0).is_contiguous(at::MemoryFormat::ChannelsLast)) << "eager's layout";
  }
  {  // float16: no post-op kernel, no folding
    auto m = conv_block("torch.relu(y)", /*bn=*/true, at::kHalf);
    auto r = run_and_compare(m, {input(at::kHalf)}, "float16");
    ASSERT_NE(r.plan, nullptr);
    EXPECT_EQ(r.plan->aten_ops.count("aten::conv2d"), 1u) << r.plan->explain();
  }
}

// A ResNet block's tail: relu(bn(conv(x)) + x), in both operand orders.
TEST(ConvRules, ResidualAddAndReluAreTheConvsPostOps) {
  REQUIRE_ONEDNN_RULES();
  for (const char* sum : {"y + x", "x + y"}) {
    torch::jit::setGraphExecutorOptimize(false);
    at::manual_seed(0);
    torch::jit::Module m("Residual");
    m.register_parameter("w", at::randn({8, 8, 3, 3}) * 0.2, false);
    m.register_buffer("gamma", at::rand({8}) + 0.5);
    m.register_buffer("beta", at::randn({8}) * 0.1);
    m.register_buffer("mean", at::randn({8}) * 0.1);
    m.register_buffer("var", at::rand({8}) + 0.5);
    m.define(std::string("def forward(self, x):\n"
                         "    c = torch.conv2d(x, self.w, None, [1, 1], [1, 1], [1, 1], 1)\n"
                         "    y = torch.batch_norm(c, self.gamma, self.beta, self.mean, self.var, False, 0.1, 1e-05, False)\n"
                         "    return torch.relu(") + sum + ")\n");
    m.eval();
    // A channels-last x (in a ResNet, the block's input is the previous block's channels-last result): the
    // sum's operands and result all channels-last, as eager's; the call gives eager's layout.
    at::Tensor x = input(at::kFloat).contiguous(at::MemoryFormat::ChannelsLast);
    auto r = run_and_compare(m, {x}, std::string(sum) + ", channels-last x");
    ASSERT_NE(r.plan, nullptr);
    std::string ex = r.plan->explain();
    EXPECT_EQ(r.plan->aten_ops, (std::map<std::string, int>{{"mkldnn::_convolution_pointwise.binary", 1}})) << ex;
    EXPECT_NE(ex.find("epilogue.conv_add_relu x1"), std::string::npos) << ex;
    // An NCHW x: in NCHW plans the call on the plain weight writes NCHW; in channels-last plans the residual's
    // layout differs from the conv's, the add is not a post-op, and the sum and relu are our kernel.
    r = run_and_compare(m, {input(at::kFloat)}, std::string(sum) + ", NCHW x");
    ASSERT_NE(r.plan, nullptr);
    ex = r.plan->explain();
    if (nchw_plans()) {
      EXPECT_EQ(r.plan->aten_ops, (std::map<std::string, int>{{"mkldnn::_convolution_pointwise.binary", 1}})) << ex;
      EXPECT_NE(ex.find("prepack.nchw_result x1"), std::string::npos) << ex;
    } else {
      EXPECT_NE(ex.find("prepack.conv x1"), std::string::npos) << ex;
      EXPECT_EQ(r.plan->kernels.size(), 1u + input_copies()) << ex;
    }
  }
}

// Three residual blocks in a row (a = block(x, x), b = block(a, a), c = block(b, b), each block two
// convolutions, the second with the residual added) and then `tail`.
torch::jit::Module residual_chain(const std::string& tail) {
  torch::jit::setGraphExecutorOptimize(false);
  at::manual_seed(0);
  torch::jit::Module m("ResidualChain");
  for (const char* w : {"w1", "w2"}) m.register_parameter(w, at::randn({8, 8, 3, 3}) * 0.2, false);
  m.register_parameter("b", at::randn({8}) * 0.1, false);
  m.define(R"(
def block(self, x, residual):
    h = torch.relu(torch.conv2d(x, self.w1, self.b, [1, 1], [1, 1], [1, 1], 1))
    return torch.relu(torch.conv2d(h, self.w2, self.b, [1, 1], [1, 1], [1, 1], 1) + residual)

def forward(self, x):
    a = self.block(x, x)
    b = self.block(a, a)
    c = self.block(b, b)
)" + tail);
  m.eval();
  return m;
}

// The number in explain's "results written into a dying argument's storage: N step(s)" line, 0 without it.
int steps_in_place(const std::string& explain) {
  const std::string line = "results written into a dying argument's storage: ";
  const auto at = explain.find(line);
  return at == std::string::npos ? 0 : std::stoi(explain.substr(at + line.size()));
}

// Note [Results written into a dying argument]: a residual that dies at its block's last convolution takes
// the block's result (the in-place form of the call). The input (the first block's residual) is never
// written, nor a residual that is returned, read later, or reaches the call through an op that returns
// its input. Each case against eager, the input checked unchanged.
TEST(ConvRules, DeadResidualTakesTheBlocksResultAndNothingLiveIsWritten) {
  REQUIRE_ONEDNN_RULES();
  const at::Tensor x = input(at::kFloat).contiguous(at::MemoryFormat::ChannelsLast);
  struct Case {
    const char* tail;
    int in_place;  // steps
  } cases[] = {
      {"    return c\n", 2},            // a and b die at their blocks: written in place; x is the input
      {"    return c, a\n", 1},         // a is returned: only b is written
      {"    return c * 2.0 + a\n", 1},  // a is read after its block: only b is written
      {"    return c, b[:, :4]\n", 1},  // a view of b is returned: only a is written
  };
  for (const Case& k : cases) {
    auto m = residual_chain(k.tail);
    auto r = run_and_compare(m, {x}, k.tail);
    ASSERT_NE(r.plan, nullptr) << k.tail;
    const std::string ex = r.compiled->explain({x});
    EXPECT_EQ(r.plan->aten_ops.at("mkldnn::_convolution_pointwise.binary"), 3) << k.tail << ex;
    EXPECT_EQ(steps_in_place(ex), k.in_place) << k.tail << ex;
    // A second call through the same plan: the writes left nothing behind that the next call reads.
    auto again = flatten((*r.compiled)({x}));
    ASSERT_EQ(again.size(), r.fused.size());
    for (size_t i = 0; i < again.size(); ++i) EXPECT_TRUE(at::equal(again[i], r.fused[i])) << k.tail;
  }
  {  // the disable option turns it off for one module
    auto m = residual_chain(cases[0].tail);
    CompileOptions o;
    o.disable = {"in_place"};
    auto r = run_and_compare(m, {x}, "in_place disabled", o);
    ASSERT_NE(r.plan, nullptr);
    EXPECT_EQ(steps_in_place(r.compiled->explain({x})), 0) << r.compiled->explain({x});
  }
  // The residual through an op that shares its input's storage although its schema has no alias annotation
  // (_unsafe_view): to the plan a new value, so the step is planned in place; at run time it shares the
  // caller's input, which the call must not write (the run-time check).
  auto m = residual_chain("    return self.block(c, torch._unsafe_view(x, [2, 8, 20, 20]))\n");
  const at::Tensor before = x.clone();
  auto r = run_and_compare(m, {x}, "residual _unsafe_view(x)");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(r.plan->aten_ops.at("aten::_unsafe_view"), 1) << r.plan->explain();
  EXPECT_EQ(steps_in_place(r.compiled->explain({x})), 3) << r.compiled->explain({x});
  EXPECT_TRUE(at::equal(x, before)) << "the input was written";
}

// A 1x1 spatial result (a squeeze-excite block's conv): oneDNN's channels-last [2,16,1,1] has strides
// [16,1,16,16], and contiguous() keeps them (the tensor is contiguous), where the plan types [16,1,1,1].
// The kernel after it reads it as it is (size-1 dims are never indexed); the executor's layout check
// once stopped MobileNetV3 there with an internal error.
TEST(ConvRules, ASizeOneSpatialResultFeedsOurKernel) {
  REQUIRE_ONEDNN_RULES();
  auto m = conv_block("torch.exp(y) * 0.5", /*bn=*/false, at::kFloat);
  auto r = run_and_compare(m, {at::randn({2, 8, 1, 1})}, "1x1 spatial");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_NE(r.plan->explain().find("prepack.conv x1"), std::string::npos) << r.plan->explain();
  EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
}

// Binary folding: a per-channel scale (a layer-scale parameter), a number added, a number divided by, all
// folded into the conv's weight and bias; the result matches eager's.
TEST(ConvRules, ConstantScalesAndShiftsFoldIntoTheConvAndMatchEager) {
  torch::jit::setGraphExecutorOptimize(false);
  at::manual_seed(0);
  torch::jit::Module m("ScaledConv");
  m.register_parameter("w", at::randn({16, 8, 3, 3}) * 0.2, false);
  m.register_parameter("b", at::randn({16}) * 0.1, false);
  m.register_parameter("scale", at::rand({16, 1, 1}) + 0.5, false);
  m.register_buffer("shift", at::randn({1, 16, 1, 1}));
  m.define(R"(
def forward(self, x):
    c = torch.conv2d(x, self.w, self.b, [1, 1], [1, 1], [1, 1], 1)
    y = (c * self.scale - self.shift) / 2.0 + 0.25
    return torch.relu(y)
)");
  m.eval();
  auto r = run_and_compare(m, {input(at::kFloat)}, "conv * scale - shift, / 2, + 0.25, relu");
  ASSERT_NE(r.plan, nullptr);
  const std::string ex = r.plan->explain();
  for (const char* rule : {"fold.conv_mul x1", "fold.conv_sub x1", "fold.conv_div x1", "fold.conv_add x1"})
    EXPECT_NE(ex.find(rule), std::string::npos) << rule << "\n" << ex;
  EXPECT_EQ(r.plan->kernels.size(), 0u) << "the relu is the conv's post-op\n" << ex;
}

// c = relu(conv2d(x, w)) with a frozen w [16, 8, 3, 3] and no bias, then `tail` (which returns).
torch::jit::Module relu_conv_module(const char* name, const std::string& tail) {
  torch::jit::setGraphExecutorOptimize(false);
  at::manual_seed(0);
  torch::jit::Module m(name);
  m.register_parameter("w", at::randn({16, 8, 3, 3}) * 0.2, false);
  m.define("def forward(self, x):\n    c = torch.relu(torch.conv2d(x, self.w, None, [1, 1], [1, 1], [1, 1], 1))\n" +
           tail);
  m.eval();
  return m;
}

// A view that a channels-last result cannot give (flattening NHWC memory as NCHW needs a copy): the
// channels-last capture fails there, and the model is compiled as captured in NCHW instead of running
// eagerly. Ran eagerly before (the second capture's error reached the compile).
TEST(ConvRules, AViewThatRefusesChannelsLastKeepsTheNchwCapture) {
  auto m = relu_conv_module("ConvView", "    return c.view(2, -1) * 2.0\n");
  auto r = run_and_compare(m, {input(at::kFloat)}, "conv, relu, view");
  ASSERT_NE(r.plan, nullptr) << "compiled, not run eagerly";
  EXPECT_EQ(r.plan->aten_ops.count("aten::view"), 1u) << r.plan->explain();
}

// Outputs that share storage in eager (a conv's activation and a view of it) share it in the plan too: the
// channels-last plan would copy each back to NCHW apart, so the graph keeps the NCHW capture. Returned two
// unrelated tensors before.
TEST(ConvRules, OutputsThatShareStorageStaySharing) {
  auto m = relu_conv_module("ConvSlice", "    return (c, c[:1])\n");
  auto r = run_and_compare(m, {input(at::kFloat)}, "conv, relu, and its first batch item");
  ASSERT_NE(r.plan, nullptr);
  ASSERT_TRUE(r.eager.at(1).storage().is_alias_of(r.eager.at(0).storage()));
  EXPECT_TRUE(r.fused.at(1).storage().is_alias_of(r.fused.at(0).storage())) << r.plan->explain();
}

// Turning a rule off by name (FUSION_JIT_DISABLE=epilogue.conv_relu), and NCHW plans without the opt-in
// (the conv stays eager's, batch_norm folded into it), are CLI tests (tests/cli_test.py): the options are
// read once per process.

// ---- Linear rules (epilogue.linear_<act>, prepack.linear) ----

// The gemm rules' probe replaced for a test: oneDNN measured faster (or slower) than ATen for every shape.
struct ForcedGemmProbe {
  static inline double onednn_us = 0;
  GemmProbe saved;
  explicit ForcedGemmProbe(double us) : saved(set_gemm_probe(&time)) { onednn_us = us; }
  ~ForcedGemmProbe() { set_gemm_probe(saved); }
  static std::optional<GemmTiming> time(int64_t, int64_t, int64_t, bool, bool) { return GemmTiming{100, onednn_us}; }
};


// `body` over x [4, 64, 256] with frozen w [512, 256], wt = w.t() as its own [256, 512] parameter, b [512].
torch::jit::Module linear_block(const std::string& body) {
  torch::jit::setGraphExecutorOptimize(false);
  at::manual_seed(0);
  torch::jit::Module m("LinearBlock");
  at::Tensor w = at::randn({512, 256}) * 0.05;
  m.register_parameter("w", w, false);
  m.register_parameter("wt", w.t().contiguous(), false);
  m.register_parameter("b", at::randn({512}) * 0.1, false);
  m.register_buffer("gamma", at::rand({512}) + 0.5);
  m.register_buffer("beta", at::randn({512}) * 0.1);
  m.register_buffer("mean", at::randn({512}) * 0.1);
  m.register_buffer("var", at::rand({512}) + 0.5);
  m.define("def forward(self, x):\n" + body);
  m.eval();
  return m;
}

at::Tensor linear_input() { return at::randn({4, 64, 256}); }

TEST(LinearRules, LinearActivationsAreOneOneDnnCallAndMatchEager) {
  ForcedGemmProbe probe(150);  // MKL measured faster here: the rules as on this project's Intel machines
  const std::pair<std::string, std::string> acts[] = {
      {"torch.relu(y)", "epilogue.linear_relu"},
      {"torch.gelu(y)", "epilogue.linear_gelu"},
      {"torch.gelu(y, approximate='tanh')", "epilogue.linear_gelu"},
      {"torch.silu(y)", "epilogue.linear_silu"},
      {"torch.sigmoid(y)", "epilogue.linear_sigmoid"},
      {"torch.tanh(y)", "epilogue.linear_tanh"},
      {"torch.hardswish(y)", "epilogue.linear_hardswish"},
      {"torch.hardsigmoid(y)", "epilogue.linear_hardsigmoid"},
      {"torch.leaky_relu(y, 0.2)", "epilogue.linear_leaky_relu"},
      {"torch.hardtanh(y, -0.5, 0.75)", "epilogue.linear_hardtanh"},
      {"torch.relu6(y)", "epilogue.linear_relu6"}};
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& [act, rule] : acts) {
      const std::string what = act + " in " + c10::toString(dtype);
      auto m = linear_block("    y = torch.linear(x, self.w, self.b)\n    return " + act + "\n");
      m.to(dtype);
      auto r = run_and_compare(m, {linear_input().to(dtype)}, what);
      ASSERT_NE(r.plan, nullptr) << what;
      const std::string ex = r.plan->explain();
      if (rule == "epilogue.linear_gelu" && dtype == at::kFloat) {
        // A float32 gelu is MKL's GEMM and our kernel, as Inductor's freezing makes it (faster than the
        // post-op on this project's machine), and explain says why the rule declined.
        EXPECT_EQ(r.plan->kernels.size(), 1u) << what << "\n" << ex;
        EXPECT_EQ(r.plan->aten_ops, (std::map<std::string, int>{{"mkl::_mkl_linear", 1}})) << what << "\n" << ex;
        EXPECT_NE(ex.find("declined: epilogue.linear_gelu"), std::string::npos) << what << "\n" << ex;
        continue;
      }
      if (dtype == at::kBFloat16 && !onednn_bf16()) {
        EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_linear_pointwise"), 0u) << what << "\n" << ex;
        EXPECT_NE(ex.find(kNoBf16), std::string::npos) << what << "\n" << ex;
        continue;
      }
      EXPECT_TRUE(r.plan->kernels.empty()) << what << "\n" << ex;
      EXPECT_EQ(r.plan->aten_ops, (std::map<std::string, int>{{"mkldnn::_linear_pointwise", 1}})) << what << "\n" << ex;
      EXPECT_NE(ex.find(rule + " x1"), std::string::npos) << what << "\n" << ex;
    }
  }
}

// torch.compile's form: a 2-d addmm on the transposed weight, viewed back to 3-d, then the activation.
TEST(LinearRules, ViewedAddmmWithActivationIsOneCall) {
  auto m = linear_block(
      "    y = torch.addmm(self.b, x.reshape([256, 256]), self.wt).view([4, 64, 512])\n"
      "    return torch.silu(y)\n");
  auto r = run_and_compare(m, {linear_input()}, "silu(view(addmm))");
  ASSERT_NE(r.plan, nullptr);
  const std::string ex = r.plan->explain();
  EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_linear_pointwise"), 1u) << ex;
  EXPECT_EQ(r.plan->aten_ops.count("aten::addmm"), 0u) << ex;
  EXPECT_NE(ex.find("epilogue.linear_silu x1"), std::string::npos) << ex;
}

// A float32 linear without activation is MKL's packed sgemm, whatever its size (prepack.linear_mkl); one
// whose result is also returned keeps its activation in our kernel; a small one (under kLinearMinMacs) with
// an activation is MKL's call and our kernel. In bfloat16 (no MKL sgemm) a large one gets oneDNN's
// reordered weight (prepack.linear) and a small one stays eager's linear.
TEST(LinearRules, PrepackOtherUsersAndSmallLinears) {
  ForcedGemmProbe probe(150);  // MKL measured faster here: the rules as on this project's Intel machines
  {
    auto m = linear_block("    return torch.exp(torch.linear(x, self.w, self.b))\n");
    auto r = run_and_compare(m, {linear_input()}, "exp(linear)");
    ASSERT_NE(r.plan, nullptr);
    EXPECT_NE(r.plan->explain().find("prepack.linear_mkl x1"), std::string::npos) << r.plan->explain();
    EXPECT_EQ(r.plan->aten_ops.count("mkl::_mkl_linear"), 1u) << r.plan->explain();
    EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
  }
  {
    auto m = linear_block("    y = torch.linear(x, self.w, self.b)\n    return torch.relu(y), y\n");
    auto r = run_and_compare(m, {linear_input()}, "relu(y), y");
    ASSERT_NE(r.plan, nullptr);
    EXPECT_EQ(r.plan->explain().find("epilogue.linear_relu"), std::string::npos) << r.plan->explain();
  }
  {
    auto m = linear_block("    return torch.relu(torch.linear(x, self.w, self.b))\n");
    auto r = run_and_compare(m, {at::randn({8, 256})}, "small linear");  // 8*256*512 = 2^20
    ASSERT_NE(r.plan, nullptr);
    EXPECT_EQ(r.plan->aten_ops.count("aten::linear"), 0u) << r.plan->explain();
    EXPECT_EQ(r.plan->aten_ops.count("mkl::_mkl_linear"), 1u) << r.plan->explain();
    EXPECT_EQ(r.plan->kernels.size(), 1u) << r.plan->explain();
  }
  {
    auto m = linear_block("    return torch.exp(torch.linear(x, self.w, self.b))\n");
    m.to(at::kBFloat16);
    auto r = run_and_compare(m, {linear_input().to(at::kBFloat16)}, "bfloat16 exp(linear)");
    ASSERT_NE(r.plan, nullptr);
    EXPECT_NE(r.plan->explain().find(onednn_bf16() ? "prepack.linear x1" : kNoBf16), std::string::npos)
        << r.plan->explain();
    EXPECT_EQ(r.plan->aten_ops.count("mkl::_mkl_linear"), 0u) << r.plan->explain();
    auto r2 = run_and_compare(m, {at::randn({8, 256}).to(at::kBFloat16)}, "small bfloat16 linear");
    ASSERT_NE(r2.plan, nullptr);
    EXPECT_EQ(r2.plan->aten_ops.count("aten::linear"), 1u) << r2.plan->explain();
  }
}

// ---- gemm: linears whose weight comes with each call (Note [GEMM backend measured on this machine]) ----


// `body` over x [4, 64, 256], w [512, 256] and b [512], all given at each call.
torch::jit::Module linear_inputs_block(const std::string& body) {
  torch::jit::setGraphExecutorOptimize(false);
  torch::jit::Module m("LinearInputsBlock");
  m.define("def forward(self, x, w, b):\n" + body);
  m.eval();
  return m;
}

std::vector<c10::IValue> linear_inputs() {
  return {at::randn({4, 64, 256}), at::randn({512, 256}) * 0.05, at::randn({512}) * 0.1};
}

TEST(GemmRules, EveryActivationOnOneDnnsGemmMatchesEager) {
  ForcedGemmProbe probe(50);
  const std::pair<std::string, std::string> acts[] = {
      {"torch.relu(y)", "gemm.linear_relu"},
      {"torch.gelu(y)", "gemm.linear_gelu"},
      {"torch.gelu(y, approximate='tanh')", "gemm.linear_gelu"},
      {"torch.silu(y)", "gemm.linear_silu"},
      {"torch.sigmoid(y)", "gemm.linear_sigmoid"},
      {"torch.tanh(y)", "gemm.linear_tanh"},
      {"torch.hardswish(y)", "gemm.linear_hardswish"},
      {"torch.hardsigmoid(y)", "gemm.linear_hardsigmoid"},
      {"torch.leaky_relu(y, 0.2)", "gemm.linear_leaky_relu"},
      {"torch.hardtanh(y, -0.5, 0.75)", "gemm.linear_hardtanh"},
      {"torch.relu6(y)", "gemm.linear_relu6"},
      // Not a post-op of oneDNN's: the product, then our kernel. (exp here made the test flaky: oneDNN's
      // GEMM rounds otherwise than MKL's, which eager calls, and exp magnifies the difference past the
      // tolerance rule's 2x of eager's error for about a third of random inputs; bench/RESULTS.md, "GEMM
      // rounding: oneDNN against MKL".)
      {"torch.abs(y) * 0.5", ""}};
  for (const auto& [act, rule] : acts) {
    auto m = linear_inputs_block("    y = torch.linear(x, w, b)\n    return " + act + "\n");
    auto r = run_and_compare(m, linear_inputs(), act);
    ASSERT_NE(r.plan, nullptr) << act;
    const std::string ex = r.plan->explain();
    EXPECT_EQ(r.plan->aten_ops, (std::map<std::string, int>{{"mkldnn::_linear_pointwise", 1}})) << act << "\n" << ex;
    EXPECT_NE(ex.find("gemm.linear x1"), std::string::npos) << act << "\n" << ex;
    if (!rule.empty()) {
      EXPECT_NE(ex.find(rule + " x1"), std::string::npos) << act << "\n" << ex;
      EXPECT_TRUE(r.plan->kernels.empty()) << act << "\n" << ex;
    }
  }
}

// The weight is read at each call: new values in the same tensor (an optimizer step in place), or another
// tensor, give eager's new result. torch.compile's form (addmm on t(W), viewed) too, and no bias.
TEST(GemmRules, AWeightChangedBetweenCallsIsReadAgain) {
  ForcedGemmProbe probe(50);
  for (const char* body : {"    return torch.gelu(torch.linear(x, w, b))\n",
                           "    return torch.relu(torch.addmm(b, x.reshape([256, 256]), w.t()).view([4, 64, 512]))\n",
                           "    return torch.linear(x, w, None) + b\n"}) {
    auto m = linear_inputs_block(body);
    auto in = linear_inputs();
    auto compiled = std::make_shared<CompiledModule>(compile(m));
    auto r = compare_with_eager(*compiled, m, in, body);
    ASSERT_NE(r.plan, nullptr) << body;
    EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_linear_pointwise"), 1u) << body << "\n" << r.plan->explain();
    in[1].toTensor().mul_(-2.0);
    compare_with_eager(*compiled, m, in, std::string(body) + " after w.mul_(-2)");
    in[1] = at::randn({512, 256}) * 0.05;
    compare_with_eager(*compiled, m, in, std::string(body) + " with another w");
  }
}

// Where ATen's GEMM was measured faster the linear stays ATen's; FUSION_JIT_GEMM's default measures, and the
// adapter's probe times both candidates on this machine.
TEST(GemmRules, AtensGemmWhereMeasuredFasterAndTheProbeTimesBoth) {
  {
    ForcedGemmProbe probe(150);
    auto m = linear_inputs_block("    return torch.gelu(torch.linear(x, w, b))\n");
    auto r = run_and_compare(m, linear_inputs(), "gelu(linear), ATen faster");
    ASSERT_NE(r.plan, nullptr);
    EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_linear_pointwise"), 0u) << r.plan->explain();
    EXPECT_NE(r.plan->explain().find("declined: gemm.linear"), std::string::npos) << r.plan->explain();
    EXPECT_NE(r.plan->explain().find("ATen's GEMM 100 us, oneDNN's 150 us on this machine"), std::string::npos)
        << r.plan->explain();
  }
  EXPECT_EQ(Options::get().gemm, GemmChoice::kMeasure);
  const GemmProbe real = set_gemm_probe(nullptr);
  set_gemm_probe(real);
  ASSERT_NE(real, nullptr);
  // Timing draws no random numbers: the user's stream is where it was.
  at::manual_seed(7);
  const at::Tensor expected = at::randn({8});
  at::manual_seed(7);
  const std::optional<GemmTiming> t = real(256, 256, 512, true, false);
  EXPECT_TRUE(at::equal(at::randn({8}), expected));
  ASSERT_TRUE(t.has_value());
  EXPECT_GT(t->mkl_us, 0);
  EXPECT_GT(t->onednn_us, 0);
  // Kept in the kernel cache for the next process, as text that reads back to the same timings.
  auto entry = KernelsCache::instance().get(gemm_timing_key(256, 256, 512, true, false, at::get_num_threads()));
  ASSERT_TRUE(entry.has_value());
  const std::optional<GemmTiming> back = parse_gemm_timing(*entry);
  ASSERT_TRUE(back.has_value()) << *entry;
  EXPECT_NEAR(back->mkl_us, t->mkl_us, 1e-3);
  EXPECT_NEAR(back->onednn_us, t->onednn_us, 1e-3);
  const std::optional<GemmTiming> packed = real(256, 256, 512, true, true);
  ASSERT_TRUE(packed.has_value());
  EXPECT_GT(packed->mkl_us, 0);
  EXPECT_GT(packed->onednn_us, 0);
}

// An entry read back from disk or from the fleet's cache is two positive finite numbers and nothing else;
// anything else is timed again.
TEST(GemmRules, ATimingEntryIsCheckedBeforeItIsBelieved) {
  const std::optional<GemmTiming> ok = parse_gemm_timing("120.500 98.250\n");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->mkl_us, 120.5);
  EXPECT_EQ(ok->onednn_us, 98.25);
  for (const char* bad : {"", "120.5\n", "120.5 98.25 7\n", "nan 98.25\n", "120.5 inf\n", "-1 98.25\n", "0 1\n",
                          "120.5 98.25\nrm -rf /\n", "1e300 1\n", "abc def\n"})
    EXPECT_FALSE(parse_gemm_timing(bad).has_value()) << bad;
  EXPECT_FALSE(parse_gemm_timing(std::string(100, '1') + " 2\n").has_value());
  EXPECT_NE(gemm_timing_key(256, 256, 512, true, false, 2), gemm_timing_key(256, 256, 512, true, false, 1));
  EXPECT_NE(gemm_timing_key(256, 256, 512, true, false, 2), gemm_timing_key(256, 256, 512, false, false, 2));
  EXPECT_NE(gemm_timing_key(256, 256, 512, true, false, 2), gemm_timing_key(256, 256, 512, true, true, 2));
}

// Where oneDNN's reordered weight was measured faster than MKL's packed GEMM (this project's AMD VMs), a
// frozen float32 linear is oneDNN's call (prepack.linear), and its gelu oneDNN's post-op, against eager.
TEST(LinearRules, OneDnnWhereMeasuredFasterThanMklsPackedGemm) {
  ForcedGemmProbe probe(50);
  const std::pair<std::string, std::string> cases[] = {
      {"    return torch.exp(torch.linear(x, self.w, self.b))\n", "prepack.linear x1"},
      {"    return torch.gelu(torch.linear(x, self.w, self.b))\n", "epilogue.linear_gelu x1"},
      {"    return torch.addmm(self.b, x.reshape([256, 256]), self.wt).view([4, 64, 512]) * 2.0\n", "prepack.linear x1"}};
  for (const auto& [body, rule] : cases) {
    auto m = linear_block(body);
    auto r = run_and_compare(m, {linear_input()}, body);
    ASSERT_NE(r.plan, nullptr) << body;
    const std::string ex = r.plan->explain();
    EXPECT_NE(ex.find(rule), std::string::npos) << body << "\n" << ex;
    EXPECT_EQ(r.plan->aten_ops.count("mkl::_mkl_linear"), 0u) << body << "\n" << ex;
    EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_linear_pointwise"), 1u) << body << "\n" << ex;
  }
}

// MKL's packed sgemm on the shapes transformers give it (3-d input, torch.compile's viewed addmm, no
// bias, one row), against eager.
TEST(LinearRules, MklPackedLinearMatchesEager) {
  ForcedGemmProbe probe(150);  // MKL measured faster here: the rules as on this project's Intel machines
  const std::pair<std::string, at::Tensor> cases[] = {
      {"    return torch.linear(x, self.w, None) + 1.0\n", linear_input()},
      {"    return torch.addmm(self.b, x.reshape([256, 256]), self.wt).view([4, 64, 512]) * 2.0\n", linear_input()},
      {"    return torch.sigmoid(torch.linear(x, self.w, self.b))\n", at::randn({1, 256})}};
  for (const auto& [body, x] : cases) {
    auto m = linear_block(body);
    auto r = run_and_compare(m, {x}, body);
    ASSERT_NE(r.plan, nullptr) << body;
    EXPECT_EQ(r.plan->aten_ops.count("mkl::_mkl_linear"), 1u) << body << r.plan->explain();
  }
  // fusion_jit.profile() counts it as ATen compute, as the linears it replaces.
  EXPECT_TRUE(is_compute_schema("mkl::_mkl_linear"));
  EXPECT_TRUE(is_compute_schema("mkldnn::_linear_pointwise"));
  EXPECT_FALSE(is_compute_schema("aten::view"));
}

// A plan whose kernels read their sizes (dynamic "on", or a table's later signatures under auto) takes
// oneDNN's reordered weight where MKL's packed GEMM would be chosen: MKL's packs for one row count, so a
// served model would hold a packed copy of every weight per length (passes_skipped).
TEST(LinearRules, DynamicPlansTakeOneDnnsReorderInsteadOfMklsPackedWeight) {
  ForcedGemmProbe probe(150);  // MKL measured faster
  const std::string body = "    return torch.linear(x, self.w, self.b) * 2.0\n";
  auto m = linear_block(body);
  for (const char* dynamic : {"off", "on"}) {
    CompileOptions o;
    o.dynamic = dynamic;
    auto compiled = std::make_shared<CompiledModule>(compile(m, o));
    for (int64_t rows : {48, 56}) {
      auto r = compare_with_eager(*compiled, m, {at::randn({rows, 256})}, body + " rows " + std::to_string(rows));
      ASSERT_NE(r.plan, nullptr) << dynamic;
      const bool on = std::string(dynamic) == "on";
      EXPECT_EQ(r.plan->aten_ops.count("mkl::_mkl_linear"), on ? 0u : 1u) << dynamic << r.plan->explain();
      EXPECT_EQ(r.plan->aten_ops.count("mkldnn::_linear_pointwise"), on ? 1u : 0u) << dynamic << r.plan->explain();
    }
  }
}

// BatchNorm1d after a frozen linear with a 2-d result folds into it (fold.linear_bn), then takes the relu
// as a post-op; over a 3-d result the batch_norm's channels are not the features: left as written.
TEST(LinearRules, BatchNormAfterALinearFoldsIntoItAndMatchesEager) {
  const std::string bn = "torch.batch_norm(y, self.gamma, self.beta, self.mean, self.var, False, 0.1, 1e-05, False)";
  auto m = linear_block("    y = torch.linear(x, self.w, self.b)\n    return torch.relu(" + bn + ")\n");
  auto r = run_and_compare(m, {at::randn({64, 256})}, "relu(batch_norm(linear))");
  ASSERT_NE(r.plan, nullptr);
  const std::string ex = r.plan->explain();
  EXPECT_NE(ex.find("fold.linear_bn x1"), std::string::npos) << ex;
  EXPECT_EQ(r.plan->aten_ops, (std::map<std::string, int>{{"mkldnn::_linear_pointwise", 1}})) << ex;
  // [2, 512, 512]: batch_norm's 512 channels are dim 1, the linear's features dim 2.
  auto m3 = linear_block("    y = torch.linear(x, self.w, self.b)\n    return " + bn + "\n");
  auto r3 = run_and_compare(m3, {at::randn({2, 512, 256})}, "batch_norm(linear) over [2, 512, 512]");
  ASSERT_NE(r3.plan, nullptr);
  EXPECT_EQ(r3.plan->explain().find("fold.linear_bn"), std::string::npos) << r3.plan->explain();
}

// Constant scales and shifts after a frozen linear fold into its weight and bias (fold.linear_*), also in
// torch.compile's addmm form; a division by a tensor is left as written.
TEST(LinearRules, ConstantScalesAndShiftsFoldIntoTheLinearAndMatchEager) {
  const std::pair<std::string, std::string> cases[] = {
      {"    return torch.linear(x, self.w, self.b) * 0.125\n", "fold.linear_mul x1"},
      {"    return 3.0 * torch.linear(x, self.w, self.b) - self.b\n", "fold.linear_sub x1"},
      {"    return torch.linear(x, self.w, None) / 4.0 + self.b\n", "fold.linear_add x1"},
      {"    return torch.linear(x, self.w, self.b) * self.b.view([1, 1, 512])\n", "fold.linear_mul x1"},
      {"    return torch.addmm(self.b, x.reshape([256, 256]), self.wt).view([4, 64, 512]) * self.b\n",
       "fold.linear_mul x1"}};
  for (const auto& [body, rule] : cases) {
    auto m = linear_block(body);
    auto r = run_and_compare(m, {linear_input()}, body);
    ASSERT_NE(r.plan, nullptr) << body;
    const std::string ex = r.plan->explain();
    EXPECT_NE(ex.find(rule), std::string::npos) << body << ex;
    EXPECT_TRUE(r.plan->kernels.empty()) << body << ex;
  }
  auto m = linear_block("    return torch.linear(x, self.w, self.b) / self.b\n");
  auto r = run_and_compare(m, {linear_input()}, "linear / tensor");
  ASSERT_NE(r.plan, nullptr);
  EXPECT_EQ(r.plan->explain().find("fold.linear_div"), std::string::npos) << r.plan->explain();
}

// Note [Folded constants shared across signatures]: the frozen weight's oneDNN reorder, folded at plan build,
// is one tensor for every row count of an octave (its batch-size hint), made again for another octave or
// once the weight changed in place, and the same values as a plan folding alone.
TEST(FoldedConstants, PrepackedWeightsAreSharedAcrossSignatures) {
  ForcedGemmProbe probe(50);  // oneDNN's GEMM measured faster: prepack.linear
  at::manual_seed(0);
  at::Tensor w = at::randn({512, 256}) * 0.05, b = at::randn({512});
  FoldedConstants shared;
  // The reordered weight the plan for x [rows, 256] reads, folded through `memo`.
  auto reordered = [&](int64_t rows, FoldedConstants* memo) {
    const std::string ir = fmt::format(
        "graph(%0 : f32[{0},256]):\n  %1 : f32[512,256] = fj::constant(0)\n  %2 : f32[512] = fj::constant(1)\n"
        "  %3 : f32[{0},512] = aten::linear(%0, %1, %2)\n  return (%3)\n",
        rows);
    CapturedGraph cap = captured_from_ir("linear", {at::randn({rows, 256})}, ir, {w, b});
    optimize_captured(cap, {}, memo);
    for (const Node* n : cap.graph->nodes())
      if (n->schema() == "mkldnn::_linear_pointwise")
        return cap.constants.at(n->args()[1].value->producer()->constant_index()).toTensor();
    ADD_FAILURE() << print_graph(*cap.graph);
    return at::Tensor();
  };
  const at::Tensor at40 = reordered(40, &shared), at50 = reordered(50, &shared);
  ASSERT_TRUE(at40.defined());
  EXPECT_TRUE(at40.is_same(at50)) << "40 and 50 rows: one octave, one reorder";
  const at::Tensor at100 = reordered(100, &shared);
  EXPECT_FALSE(at100.is_same(at40)) << "100 rows: the next octave";
  auto dense = [](const at::Tensor& t) { return t.to_dense(); };  // oneDNN's tensor, read back
  EXPECT_TRUE(at::equal(dense(reordered(40, nullptr)), dense(at40))) << "the same values as a plan folding alone";
  w.mul_(-2.0);  // changed in place: its version moved, so the reorder is made again from the new values
  const at::Tensor changed = reordered(40, &shared);
  EXPECT_FALSE(changed.is_same(at40));
  EXPECT_TRUE(at::equal(dense(changed), dense(reordered(40, nullptr))));
  EXPECT_TRUE(at::equal(dense(changed), w));
  EXPECT_FALSE(at::equal(dense(changed), dense(at40)));
}

// The same across a module's captures: the conv weight with the batch norm folded into it is one tensor for
// every batch size (here an NCHW plan, whose call takes the folded weight without a reorder); every batch
// size's result is eager's. Before, each signature folded a copy of its own.
TEST(FoldedConstants, AModulesFoldedConvWeightIsOneTensorForEveryBatchSize) {
  auto m = conv_block("torch.relu(y)", true, at::kFloat);
  CompiledModule cm = compile(m);
  auto reordered = [&](int64_t batch) {
    c10::IValue result;
    auto inst = ModuleAccess::prepare(cm, {at::randn({batch, 8, 12, 12})}, {}, &result);
    for (const Node* n : inst->captured.graph->nodes())
      if (n->schema().rfind("mkldnn::_convolution_pointwise", 0) == 0)
        return inst->captured.constants.at(n->args()[1].value->producer()->constant_index()).toTensor();
    ADD_FAILURE() << print_graph(*inst->captured.graph);
    return at::Tensor();
  };
  const at::Tensor b3 = reordered(3), b4 = reordered(4), b9 = reordered(9);
  ASSERT_TRUE(b3.defined());
  EXPECT_TRUE(b3.is_same(b4));
  EXPECT_TRUE(b3.is_same(b9));
  for (int64_t batch : {3, 4, 5, 9}) {
    at::Tensor x = at::randn({batch, 8, 12, 12});
    auto c = check_close(cm({x}).toTensor(), m.forward({x}).toTensor());
    EXPECT_TRUE(c.ok) << batch << ": " << c.message;
  }
}

// A module's channels-last weight copies: one per weight while it is unchanged, made again (and the old one
// dropped) once the weight changed in place.
TEST(FoldedConstants, ChannelsLastCopiesFollowTheWeightsVersion) {
  ChannelsLastCopies copies;
  at::Tensor w = at::randn({16, 8, 3, 3});
  const at::Tensor first = copies.of(w);
  EXPECT_TRUE(first.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(at::equal(first, w));
  EXPECT_TRUE(copies.of(w).is_same(first));
  w.mul_(2.0);
  const at::Tensor again = copies.of(w);
  EXPECT_FALSE(again.is_same(first));
  EXPECT_TRUE(at::equal(again, w));
  EXPECT_TRUE(copies.of(w).is_same(again));
}

// Note [Weights reordered once per content]: the memo gives its result back only for a weight whose bytes,
// dtype, sizes and strides are those it was made from, however the weight was written in between.
TEST(ReorderMemo, KeepsTheReorderWhileTheWeightsBytesAreUnchanged) {
  ReorderMemo memo;
  at::Tensor w = at::randn({16, 8, 3, 3});
  const at::Tensor r = w.clone();
  auto find = [&](const at::Tensor& t) {
    const auto h = ReorderMemo::hash_of(t);
    return h ? memo.find(t, *h) : c10::IValue();
  };
  auto put = [&](const at::Tensor& t) { memo.put(t, *ReorderMemo::hash_of(t), r); };
  EXPECT_TRUE(find(w).isNone());
  put(w);
  ASSERT_TRUE(find(w).isTensor());
  EXPECT_TRUE(find(w).toTensor().is_same(r));
  EXPECT_TRUE(find(w.clone()).isTensor()) << "another tensor with the same bytes";
  // Writes that move no version counter of w: through .data (its own counter), through the raw memory
  // (a numpy or DLPack view).
  const auto version = w._version();
  w.variable_data().mul_(-3.0);
  EXPECT_EQ(w._version(), version);
  EXPECT_TRUE(find(w).isNone()) << "written through .data";
  put(w);
  ASSERT_TRUE(find(w).isTensor());
  static_cast<float*>(w.data_ptr())[17] += 1.0f;
  EXPECT_TRUE(find(w).isNone()) << "one element written through a pointer";
  put(w);
  w.mul_(2.0);
  EXPECT_TRUE(find(w).isNone()) << "changed in place";
  put(w);
  w.set_data(at::randn({16, 8, 3, 3}));
  EXPECT_TRUE(find(w).isNone()) << "new storage (.data =)";
  // The same bytes read as another tensor: other strides, other sizes, another dtype.
  put(w);
  EXPECT_TRUE(find(w.view({8, 16, 3, 3})).isNone());
  EXPECT_TRUE(find(w.view(at::kInt)).isNone());
  const at::Tensor cl = w.contiguous(at::MemoryFormat::ChannelsLast);
  put(cl);
  EXPECT_TRUE(find(cl).isTensor());
  EXPECT_TRUE(find(cl.as_strided(cl.sizes(), w.strides())).isNone()) << "the bytes as NCHW strides";
  // An inference tensor has no version counter: its bytes decide as any tensor's.
  at::Tensor made_in_inference;
  {
    c10::InferenceMode guard;
    made_in_inference = at::randn({16, 8, 3, 3});
  }
  put(made_in_inference);
  EXPECT_TRUE(find(made_in_inference).isTensor());
  {
    c10::InferenceMode guard;
    made_in_inference.add_(1.0);
  }
  EXPECT_TRUE(find(made_in_inference).isNone());
  // A weight larger than two pieces is hashed on the pool: a change in its last piece is seen.
  at::Tensor big = at::randn({256, 256, 3, 3});
  put(big);
  EXPECT_TRUE(find(big).isTensor());
  static_cast<float*>(big.data_ptr())[big.numel() - 1] *= 2.0f;
  EXPECT_TRUE(find(big).isNone());
  // Not dense: never hashed (reordered at every call).
  EXPECT_FALSE(ReorderMemo::hash_of(at::randn({16, 8, 3, 6}).slice(3, 0, 6, 2)).has_value());
}

}  // namespace
}  // namespace fusion_jit::testing
