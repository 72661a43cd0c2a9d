// The rules around convolutions (passes/conv_rules.cpp, Note [Convolution rules]) on printed IR: each
// fires where it should, and near misses are left alone. Results against eager: tests/torch/conv_rules_test.cpp.
#include <gtest/gtest.h>

#include "passes/passes.h"

namespace fusion_jit {
namespace {

// Runs `set` on `ir`; returns the printed, renumbered graph and the rules that fired.
std::string run(const RuleSet& set, const std::string& ir, std::string* fired = nullptr) {
  auto g = parse_graph(ir);
  std::vector<RuleApplication> log;
  run_rules(*g, set, {}, &log);
  verify_graph(*g);
  g->renumber();
  if (fired) *fired = summarize(log);
  return print_graph(*g);
}

// conv2d -> batch_norm (inference) over frozen constants; `tail` ends the graph (uses of %8 and %9).
std::string conv_bn(const std::string& dtype, const std::string& weight, const std::string& training,
                    const std::string& tail) {
  return "graph(%0 : " + dtype + "[2,8,10,10]" + (weight == "input" ? ", %10 : " + dtype + "[16,8,3,3]" : "") +
         "):\n"
         "  %1 : " + dtype + "[16,8,3,3] = fj::constant(0)\n"
         "  %2 : " + dtype + "[16] = fj::constant(1)\n"
         "  %3 : " + dtype + "[16] = fj::constant(2)\n"
         "  %4 : " + dtype + "[16] = fj::constant(3)\n"
         "  %5 : " + dtype + "[16] = fj::constant(4)\n"
         "  %6 : " + dtype + "[16] = fj::constant(5)\n"
         "  %8 : " + dtype + "[2,16,10,10] = aten::conv2d(%0, " + (weight == "input" ? "%10" : "%1") +
         ", %2, [1, 1], [1, 1], [1, 1], 1)\n"
         "  %9 : " + dtype + "[2,16,10,10] = aten::batch_norm(%8, %3, %4, %5, %6, " + training +
         ", 0.1, 1e-05, False)\n" + tail;
}

TEST(ConvRules, BatchNormFoldsIntoAFrozenConv) {
  std::string fired;
  const std::string out = run(fold_rules(), conv_bn("f32", "constant", "False", "  return (%9)\n"), &fired);
  EXPECT_EQ(fired, "fold.conv_bn x1");
  EXPECT_EQ(out.find("aten::batch_norm"), std::string::npos) << out;
  // W' = W * reshape(gamma * rsqrt(var + eps), [16,1,1,1]); b' = (b - mean) * s + beta: ops on constants,
  // which constant_fold evaluates.
  EXPECT_NE(out.find("aten::rsqrt"), std::string::npos) << out;
  EXPECT_NE(out.find("aten::reshape(%"), std::string::npos) << out;
  EXPECT_NE(out.find("[16,1,1,1]"), std::string::npos) << out;
  EXPECT_NE(out.find("= aten::conv2d(%0, %"), std::string::npos) << out;
}

// In a channels-last plan the frozen weight is channels-last; the folded weight must be typed so (its
// constant takes its type's strides, and a contiguous weight would make the convolution write NCHW where
// the plan expects NHWC). Failed before the fix: the product was typed contiguous.
TEST(ConvRules, AFoldedWeightKeepsTheWeightsLayout) {
  std::string ir = conv_bn("f32", "constant", "False", "  return (%9)\n");
  ir.replace(ir.find("%1 : f32[16,8,3,3]"), 18, "%1 : f32[16,8,3,3]{72,1,24,8}");
  std::string fired;
  std::string out = run(fold_rules(), ir, &fired);
  EXPECT_EQ(fired, "fold.conv_bn x1") << out;
  EXPECT_NE(out.find("f32[16,8,3,3]{72,1,24,8} = aten::mul.Tensor(%1, "), std::string::npos) << out;
  const std::string scaled = "graph(%0 : f32[2,8,10,10]):\n"
                             "  %1 : f32[16,8,3,3]{72,1,24,8} = fj::constant(0)\n"
                             "  %2 : f32[2,16,10,10] = aten::conv2d(%0, %1, None, [1, 1], [1, 1], [1, 1], 1)\n"
                             "  %3 : f32[2,16,10,10] = aten::mul.Scalar(%2, 0.5)\n"
                             "  return (%3)\n";
  out = run(fold_rules(), scaled, &fired);
  EXPECT_EQ(fired, "fold.conv_mul x1") << out;
  EXPECT_NE(out.find("f32[16,8,3,3]{72,1,24,8} = aten::mul.Scalar(%1, 0.5)"), std::string::npos) << out;
}

TEST(ConvRules, BatchNormIsNotFoldedInNearMisses) {
  const char* keep = "  return (%9)\n";
  struct Case {
    const char* what;
    std::string ir;
  } cases[] = {
      {"the conv's output is also returned", conv_bn("f32", "constant", "False", "  return (%9, %8)\n")},
      {"the conv's weight is an input, not frozen", conv_bn("f32", "input", "False", keep)},
      {"batch_norm in training mode", conv_bn("f32", "constant", "True", keep)},
      {"bfloat16 (the folded weight would round once more than eager)", conv_bn("bf16", "constant", "False", keep)},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(fold_rules(), c.ir, &fired);
    EXPECT_EQ(fired, "") << c.what;
    EXPECT_NE(out.find("aten::batch_norm"), std::string::npos) << c.what << "\n" << out;
  }
}

// The strides of a [2,16,10,10] result: channels-last (a plan captured with channels-last weights, Note
// [Channels-last plans]) or NCHW.
const std::string kNhwc = "{1600,1,160,16}";
const std::string kNchw = "";

std::string conv_act(const std::string& x_type, const std::string& act, const std::string& tail = "  return (%4)\n",
                     const std::string& dtype = "f32", const std::string& layout = kNhwc) {
  return "graph(%0 : " + x_type + "):\n"
         "  %1 : " + dtype + "[16,8,3,3] = fj::constant(0)\n"
         "  %2 : " + dtype + "[16] = fj::constant(1)\n"
         "  %3 : " + dtype + "[2,16,10,10]" + layout + " = aten::conv2d(%0, %1, %2, [1, 1], [1, 1], [1, 1], 1)\n"
         "  %4 : " + dtype + "[2,16,10,10]" + layout + " = " + act + "\n" + tail;
}

TEST(ConvRules, ConvAndActivationBecomeOneOneDnnCall) {
  struct Case {
    const char* act;
    const char* rule;
    const char* call;  // the post-op and its algorithm as printed
  } cases[] = {
      {"aten::relu(%3)", "epilogue.conv_relu x1", "\"relu\", [], None)"},
      {"aten::sigmoid(%3)", "epilogue.conv_sigmoid x1", "\"sigmoid\", [], None)"},
      {"aten::tanh(%3)", "epilogue.conv_tanh x1", "\"tanh\", [], None)"},
      {"aten::hardswish(%3)", "epilogue.conv_hardswish x1", "\"hardswish\", [], None)"},
      {"aten::silu(%3)", "epilogue.conv_silu x1", "\"swish\", [], None)"},
      {"aten::hardsigmoid(%3)", "epilogue.conv_hardsigmoid x1", "\"hardsigmoid\", [], None)"},
      {"aten::gelu(%3, \"none\")", "epilogue.conv_gelu x1", "\"gelu\", [], \"none\")"},
      {"aten::gelu(%3, \"tanh\")", "epilogue.conv_gelu x1", "\"gelu\", [], \"tanh\")"},
      {"aten::leaky_relu(%3, 0.2)", "epilogue.conv_leaky_relu x1", "\"leaky_relu\", [0.2], None)"},
      {"aten::leaky_relu(%3)", "epilogue.conv_leaky_relu x1", "\"leaky_relu\", [0.01], None)"},
      {"aten::hardtanh(%3, 0.0, 6.0)", "epilogue.conv_hardtanh x1", "\"hardtanh\", [0.0,6.0], None)"},
      {"aten::relu6(%3)", "epilogue.conv_relu6 x1", "\"hardtanh\", [0.0,6.0], None)"},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(epilogue_rules(), conv_act("f32[2,8,10,10]", c.act), &fired);
    EXPECT_EQ(fired, c.rule) << out;
    // The weight reordered once for this input shape (a node on constants: constant_fold evaluates it) and
    // the call, whose channels-last result is the plan's layout: no copy.
    EXPECT_NE(out.find("%3 : f32[16,8,3,3] = mkldnn::_reorder_convolution_weight(%1, [1,1], [1,1], [1,1], 1, [2,8,10,10])"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("%4 : f32[2,16,10,10]{1600,1,160,16} = mkldnn::_convolution_pointwise(%0, %3, %2, [1,1], [1,1], "
                       "[1,1], 1, " + std::string(c.call)),
              std::string::npos)
        << c.act << "\n" << out;
    EXPECT_EQ(out.find("aten::contiguous"), std::string::npos) << out;
    EXPECT_EQ(out.find("aten::conv2d"), std::string::npos) << out;
  }
  std::string fired;
  run(epilogue_rules(), conv_act("bf16[2,8,10,10]", "aten::relu(%3)", "  return (%4)\n", "bf16"), &fired);
  EXPECT_EQ(fired, "epilogue.conv_relu x1") << "bfloat16 has the post-op too";
  const std::string out = run(epilogue_rules(), conv_act("f32[2,8,10,10]{800,1,80,8}", "aten::relu(%3)"), &fired);
  EXPECT_EQ(fired, "epilogue.conv_relu x1") << "a channels-last input\n" << out;
  // The reorder's input-size hint takes the batch by octave (size_octave): batch 3 folds batch 4's reorder,
  // which the plans of batch sizes 3 and 4 then share (Note [Folded constants shared across signatures]).
  std::string batch3 = conv_act("f32[3,8,10,10]", "aten::relu(%3)");
  for (size_t at = batch3.find("[2,16"); at != std::string::npos; at = batch3.find("[2,16", at + 1))
    batch3.replace(at, 5, "[3,16");
  const std::string out3 = run(epilogue_rules(), batch3, &fired);
  EXPECT_NE(out3.find("mkldnn::_reorder_convolution_weight(%1, [1,1], [1,1], [1,1], 1, [4,8,10,10])"), std::string::npos)
      << out3;
}

// On a CPU where oneDNN takes no bfloat16 (set_onednn_bf16_probe: eager's own check), the bfloat16 conv
// and linear rules decline and say why, float32 is unchanged. Before, they rewrote into oneDNN's bfloat16
// ops, which throw on such a CPU (an AMD EPYC with AVX2 only: ConvRules and LinearRules failed there).
TEST(ConvRules, BFloat16RulesDeclineWhereOneDnnTakesNoBFloat16) {
  set_onednn_bf16_probe([] { return false; });
  for (const RuleSet* set : {&epilogue_rules(), &prepack_rules()}) {
    auto g = parse_graph(conv_act("bf16[2,8,10,10]", "aten::relu(%3)", "  return (%4)\n", "bf16"));
    std::vector<RuleApplication> log;
    run_rules(*g, *set, {}, &log);
    EXPECT_EQ(summarize(log), "") << set->name;
    bool said = false;
    for (const auto& a : log) said = said || a.declined.find("oneDNN takes no bfloat16 on this CPU") != std::string::npos;
    EXPECT_TRUE(said) << set->name << ": no reason given";
    EXPECT_EQ(print_graph(*g).find("mkldnn::"), std::string::npos) << print_graph(*g);
  }
  std::string fired;
  run(epilogue_rules(), conv_act("f32[2,8,10,10]", "aten::relu(%3)"), &fired);
  EXPECT_EQ(fired, "epilogue.conv_relu x1") << "float32 is unchanged";
  set_onednn_bf16_probe([] { return true; });
  run(epilogue_rules(), conv_act("bf16[2,8,10,10]", "aten::relu(%3)", "  return (%4)\n", "bf16"), &fired);
  EXPECT_EQ(fired, "epilogue.conv_relu x1") << "where oneDNN takes bfloat16";
  set_onednn_bf16_probe(nullptr);
}

TEST(ConvRules, ConvAndActivationStayApartInNearMisses) {
  struct Case {
    const char* what;
    std::string ir;
  } cases[] = {
      {"the conv's output is also returned", conv_act("f32[2,8,10,10]", "aten::relu(%3)", "  return (%4, %3)\n")},
      {"an NCHW result (oneDNN's channels-last one would be copied back; FUSION_JIT_ENABLE=onednn_nchw)",
       conv_act("f32[2,8,10,10]", "aten::relu(%3)", "  return (%4)\n", "f32", kNchw)},
      {"float16 (no post-op kernel)", conv_act("f16[2,8,10,10]", "aten::relu(%3)", "  return (%4)\n", "f16")},
      {"gelu with an approximation oneDNN does not have", conv_act("f32[2,8,10,10]", "aten::gelu(%3, \"erf\")")},
      {"an activation with no post-op", conv_act("f32[2,8,10,10]", "aten::exp(%3)")},
      {"hardtanh with bounds the wrong way round", conv_act("f32[2,8,10,10]", "aten::hardtanh(%3, 1.0, -1.0)")},
      {"a weight given at each call (it would be reordered at each call)",
       "graph(%0 : f32[2,8,10,10], %1 : f32[16,8,3,3]):\n"
       "  %3 : f32[2,16,10,10]{1600,1,160,16} = aten::conv2d(%0, %1, None, [1, 1], [1, 1], [1, 1], 1)\n"
       "  %4 : f32[2,16,10,10]{1600,1,160,16} = aten::relu(%3)\n  return (%4)\n"},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(epilogue_rules(), c.ir, &fired);
    EXPECT_EQ(fired, "") << c.what;
    EXPECT_NE(out.find("aten::conv2d"), std::string::npos) << c.what << "\n" << out;
  }
}

// conv2d -> add(conv, other) or add(other, conv) [-> relu].
std::string conv_add_ir(bool conv_first, bool relu, const std::string& other_type = "f32[2,16,10,10]" + kNhwc,
                        const std::string& alpha = "1") {
  const std::string y = "f32[2,16,10,10]" + kNhwc;
  std::string ir = "graph(%0 : f32[2,8,10,10], %5 : " + other_type + "):\n"
                   "  %1 : f32[16,8,3,3] = fj::constant(0)\n"
                   "  %2 : f32[16] = fj::constant(1)\n"
                   "  %3 : " + y + " = aten::conv2d(%0, %1, %2, [1, 1], [1, 1], [1, 1], 1)\n";
  ir += "  %4 : " + y + " = aten::add.Tensor(" + (conv_first ? "%3, %5" : "%5, %3") + ", " + alpha + ")\n";
  if (relu) ir += "  %6 : " + y + " = aten::relu(%4)\n  return (%6)\n";
  else ir += "  return (%4)\n";
  return ir;
}

TEST(ConvRules, ConvAddAndReluBecomeOneOneDnnCallInEitherOperandOrder) {
  for (bool conv_first : {true, false}) {
    std::string fired;
    std::string out = run(epilogue_rules(), conv_add_ir(conv_first, true), &fired);
    EXPECT_EQ(fired, "epilogue.conv_add_relu x1") << out;
    EXPECT_NE(out.find("= mkldnn::_convolution_pointwise.binary(%0, %1, %4, %3, [1,1], [1,1], [1,1], 1, \"add\", "
                       "None, \"relu\", [], None)"),
              std::string::npos)
        << out;
    out = run(epilogue_rules(), conv_add_ir(conv_first, false), &fired);
    EXPECT_EQ(fired, "epilogue.conv_add x1") << out;
    EXPECT_NE(out.find("\"add\", None, None, [], None)"), std::string::npos) << out;
  }
  std::string fired;
  run(epilogue_rules(), conv_add_ir(true, true, "f32[2,16,10,10]" + kNhwc, "1.0"), &fired);
  EXPECT_EQ(fired, "epilogue.conv_add_relu x1") << "alpha 1.0";
}

TEST(ConvRules, ConvAddStaysApartInNearMisses) {
  struct Case {
    const char* what;
    std::string ir;
  } cases[] = {
      {"a broadcast operand", conv_add_ir(true, true, "f32[16,1,1]")},
      {"alpha 2", conv_add_ir(true, true, "f32[2,16,10,10]" + kNhwc, "2")},
      {"an NCHW operand", conv_add_ir(true, false, "f32[2,16,10,10]")},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(epilogue_rules(), c.ir, &fired);
    EXPECT_EQ(fired, "") << c.what << "\n" << out;
  }
}

TEST(ConvRules, AConvolutionOfAnotherRankOrTransposedIsLeftAlone) {
  const std::string conv1d = R"(graph(%0 : f32[2,8,10]):
  %1 : f32[16,8,3] = fj::constant(0)
  %2 : f32[2,16,10] = aten::convolution(%0, %1, None, [1], [1], [1], False, [0], 1)
  %3 : f32[2,16,10] = aten::relu(%2)
  return (%3)
)";
  std::string fired;
  run(epilogue_rules(), conv1d, &fired);
  EXPECT_EQ(fired, "") << "1-d";
  const std::string transposed = R"(graph(%0 : f32[2,8,10,10]):
  %1 : f32[8,16,3,3] = fj::constant(0)
  %2 : f32[2,16,12,12]{2304,1,192,16} = aten::convolution(%0, %1, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1)
  %3 : f32[2,16,12,12]{2304,1,192,16} = aten::relu(%2)
  return (%3)
)";
  run(epilogue_rules(), transposed, &fired);
  EXPECT_EQ(fired, "") << "transposed";
  const std::string convolution = R"(graph(%0 : f32[2,8,10,10]):
  %1 : f32[16,8,3,3] = fj::constant(0)
  %2 : f32[2,16,10,10]{1600,1,160,16} = aten::convolution(%0, %1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
  %3 : f32[2,16,10,10]{1600,1,160,16} = aten::relu(%2)
  return (%3)
)";
  const std::string out = run(epilogue_rules(), convolution, &fired);
  EXPECT_EQ(fired, "epilogue.conv_relu x1") << "aten::convolution, as FX graphs have it";
  EXPECT_NE(out.find("mkldnn::_convolution_pointwise(%0, %2, None, [1,1], [1,1], [1,1], 1, \"relu\""),
            std::string::npos)
      << out;
}

TEST(ConvRules, AFrozenConvWithoutPostOpIsPrepackedAlone) {
  std::string fired;
  std::string out = run(prepack_rules(), conv_act("f32[2,8,10,10]", "aten::exp(%3)"), &fired);
  EXPECT_EQ(fired, "prepack.conv x1");
  EXPECT_NE(out.find("mkldnn::_convolution_pointwise(%0, %3, %2, [1,1], [1,1], [1,1], 1, \"none\", [], None)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("aten::exp(%4)"), std::string::npos) << "the exp reads the call's result\n" << out;
  out = run(prepack_rules(), conv_act("f16[2,8,10,10]", "aten::exp(%3)", "  return (%4)\n", "f16"), &fired);
  EXPECT_EQ(fired, "") << "float16\n" << out;
}

// Note [A convolution's NCHW input copied by our kernel]: a channels-last call on an NCHW image of 3
// channels takes our channels-last copy of it; near misses keep the input as it is.
TEST(ConvRules, AChannelsLastCallsNchwImageIsCopiedByOurKernel) {
  auto call = [](const std::string& x, const std::string& y, const std::string& w = "f32[16,3,3,3]") {
    return "graph(%0 : " + x + ", %1 : " + w + "):\n  %2 : " + y +
           " = mkldnn::_convolution_pointwise(%0, %1, None, [1, 1], [1, 1], [1, 1], 1, \"none\", [], None)\n"
           "  return (%2)\n";
  };
  std::string fired;
  std::string out = run(layout_rules(), call("f32[2,3,8,8]", "f32[2,16,8,8]{1024,1,128,16}"), &fired);
  EXPECT_EQ(fired, "layout.conv_input x1") << out;
  EXPECT_NE(out.find("%2 : f32[2,3,8,8]{192,1,24,3} = aten::clone(%0, 2)"), std::string::npos) << out;
  EXPECT_NE(out.find("mkldnn::_convolution_pointwise(%2, %1, None"), std::string::npos) << out;
  struct Case {
    const char* what;
    std::string ir;
  } misses[] = {
      {"16 channels: ATen's copy was faster", call("f32[2,16,8,8]", "f32[2,16,8,8]{1024,1,128,16}", "f32[16,16,3,3]")},
      {"a channels-last input", call("f32[2,3,8,8]{192,1,24,3}", "f32[2,16,8,8]{1024,1,128,16}")},
      {"an NCHW result (the call's weight is NCHW)", call("f32[2,3,8,8]", "f32[2,16,8,8]")},
      {"one channel: both layouts at once", call("f32[2,1,8,8]", "f32[2,16,8,8]{1024,1,128,16}", "f32[16,1,3,3]")},
  };
  for (const Case& c : misses) {
    out = run(layout_rules(), c.ir, &fired);
    EXPECT_EQ(fired, "") << c.what << "\n" << out;
  }
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

// conv2d (frozen W [16,8,3,3] and b [16]) then `tail_op` over its output %3; %5 a frozen constant of type
// `c_type` when given; `extra_return` adds outputs.
std::string conv_then(const std::string& tail_op, const std::string& c_type = "", const std::string& extra_return = "",
                      const std::string& dtype = "f32", const std::string& input = "") {
  std::string ir = "graph(%0 : " + dtype + "[2,8,10,10]" + input + "):\n"
                   "  %1 : " + dtype + "[16,8,3,3] = fj::constant(0)\n"
                   "  %2 : " + dtype + "[16] = fj::constant(1)\n";
  if (!c_type.empty()) ir += "  %5 : " + c_type + " = fj::constant(2)\n";
  ir += "  %3 : " + dtype + "[2,16,10,10] = aten::conv2d(%0, %1, %2, [1, 1], [1, 1], [1, 1], 1)\n";
  ir += "  %4 : " + dtype + "[2,16,10,10] = " + tail_op + "\n";
  ir += "  return (%4" + extra_return + ")\n";
  return ir;
}

TEST(ConvRules, ConstantScalesAndShiftsFoldIntoTheConv) {
  struct Case {
    std::string what, ir, rule;
  } cases[] = {
      {"times a per-channel constant", conv_then("aten::mul.Tensor(%3, %5)", "f32[16,1,1]"), "fold.conv_mul x1"},
      {"a per-channel constant times", conv_then("aten::mul.Tensor(%5, %3)", "f32[1,16,1,1]"), "fold.conv_mul x1"},
      {"times a one-element constant", conv_then("aten::mul.Tensor(%3, %5)", "f32[1]"), "fold.conv_mul x1"},
      {"times a number", conv_then("aten::mul.Scalar(%3, 0.5)"), "fold.conv_mul x1"},
      {"divided by a number", conv_then("aten::div.Scalar(%3, 4.0)"), "fold.conv_div x1"},
      {"plus a per-channel constant", conv_then("aten::add.Tensor(%3, %5, 1)", "f32[16,1,1]"), "fold.conv_add x1"},
      {"minus a number", conv_then("aten::sub.Scalar(%3, 1.5, 1)"), "fold.conv_sub x1"},
      {"minus a constant", conv_then("aten::sub.Tensor(%3, %5, 1)", "f32[16,1,1]"), "fold.conv_sub x1"},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(fold_rules(), c.ir, &fired);
    EXPECT_EQ(fired, c.rule) << c.what << "\n" << out;
    // One convolution left, its weight and bias computed from constants, and it is the graph's output.
    const size_t conv = out.find("= aten::conv2d(%0, ");
    ASSERT_NE(conv, std::string::npos) << c.what << "\n" << out;
    EXPECT_EQ(out.find("aten::conv2d", conv + 3), std::string::npos) << c.what << "\n" << out;
    const size_t line = out.rfind('\n', conv);
    const std::string name = out.substr(line + 3, out.find(' ', line + 3) - line - 3);  // "%N"
    EXPECT_NE(out.find("return (" + name + ")"), std::string::npos) << c.what << "\n" << out;
  }
}

TEST(ConvRules, ScalesAndShiftsStayInNearMisses) {
  struct Case {
    std::string what, ir;
  } cases[] = {
      {"divided by a constant tensor (a zero in it: eager's inf or nan per element)",
       conv_then("aten::div.Tensor(%3, %5)", "f32[16,1,1]")},
      {"divided by zero", conv_then("aten::div.Scalar(%3, 0.0)")},
      {"times inf", conv_then("aten::mul.Scalar(%3, inf)")},
      {"times a tensor given at each call", conv_then("aten::mul.Tensor(%3, %9)", "", "", "f32", ", %9 : f32[16,1,1]")},
      {"times a constant along the width", conv_then("aten::mul.Tensor(%3, %5)", "f32[10]")},
      {"times a constant per batch and channel", conv_then("aten::mul.Tensor(%3, %5)", "f32[2,16,1,1]")},
      {"plus a constant, alpha 2", conv_then("aten::add.Tensor(%3, %5, 2)", "f32[16,1,1]")},
      {"a constant minus the conv", conv_then("aten::sub.Tensor(%5, %3, 1)", "f32[16,1,1]")},
      {"the conv's output returned too", conv_then("aten::mul.Scalar(%3, 0.5)", "", ", %3")},
      {"float16 (one more rounding than eager's)", conv_then("aten::mul.Scalar(%3, 0.5)", "", "", "f16")},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(fold_rules(), c.ir, &fired);
    EXPECT_EQ(fired, "") << c.what << "\n" << out;
  }
}

// Where only the cost rule declines a CPU epilogue, explain says so (a linear with too little work, a
// convolution whose result is NCHW).
TEST(ConvRules, TheCostRuleSaysWhyItKeepsOurKernel) {
  const std::string small_linear =
      "graph(%0 : f32[4,6,32]):\n"
      "  %1 : f32[64,32] = fj::constant(0)\n"
      "  %2 : f32[64] = fj::constant(1)\n"
      "  %3 : f32[4,6,64] = aten::linear(%0, %1, %2)\n"
      "  %4 : f32[4,6,64] = aten::relu(%3)\n"
      "  return (%4)\n";
  const std::string nchw_conv = conv_act("f32[2,8,10,10]", "aten::relu(%3)", "  return (%4)\n", "f32", "");
  struct Case {
    const char* what;
    std::string ir;
    const char* rule;
    const char* reason;
  } cases[] = {
      {"a small linear", small_linear, "epilogue.linear_relu",
       "49152 multiply-adds, under the 2^21 from which oneDNN's call beats ATen's GEMM and our kernel"},
      {"an NCHW convolution", nchw_conv, "epilogue.conv_relu", "the result is NCHW"},
  };
  for (const auto& c : cases) {
    auto g = parse_graph(c.ir);
    std::vector<RuleApplication> log;
    run_rules(*g, epilogue_rules(), {}, &log);
    EXPECT_EQ(summarize(log), "") << c.what;
    ASSERT_EQ(log.size(), 1u) << c.what;
    EXPECT_EQ(log[0].rule, c.rule) << c.what;
    EXPECT_NE(log[0].declined.find(c.reason), std::string::npos) << c.what << ": " << log[0].declined;
  }
}

// ---- CUDA epilogues (epilogue.cuda_*) ----

const std::string kCuda = "@cuda:0";

// x [4,6,32] @ W [64,32]^T + b, then `act` over the [4,6,64] result; `linear`: TorchScript's aten::linear,
// else torch.compile's addmm on t(W) viewed back.
std::string cuda_linear(const std::string& act, bool linear, const std::string& dtype = "f32", bool bias = true) {
  const std::string t = dtype;
  std::string ir = "graph(%0 : " + t + "[4,6,32]" + kCuda + ", %1 : " + t + "[64,32]" + kCuda + ", %2 : " + t + "[64]" +
                   kCuda + "):\n";
  if (linear) {
    ir += "  %5 : " + t + "[4,6,64]" + kCuda + " = aten::linear(%0, %1, " + (bias ? "%2" : "None") + ")\n";
  } else {
    ir += "  %3 : " + t + "[24,32]" + kCuda + " = aten::view(%0, [24, 32])\n"
          "  %4 : " + t + "[32,64]{1,32}" + kCuda + " = aten::t(%1)\n"
          "  %6 : " + t + "[24,64]" + kCuda + " = aten::addmm(%2, %3, %4, 1, 1)\n"
          "  %5 : " + t + "[4,6,64]" + kCuda + " = aten::view(%6, [4, 6, 64])\n";
  }
  ir += "  %7 : " + t + "[4,6,64]" + kCuda + " = " + act + "\n  return (%7)\n";
  return ir;
}

TEST(ConvRules, CudaLinearAndActivationBecomeOneCublasLtCall) {
  struct Case {
    const char* what;
    std::string ir;
    const char* rule;
    const char* call;
  } cases[] = {
      {"linear + relu", cuda_linear("aten::relu(%5)", true), "epilogue.cuda_linear_relu x1",
       "aten::_addmm_activation(%2, %3, %4, 1, 1, False)"},
      {"addmm viewed + relu", cuda_linear("aten::relu(%5)", false), "epilogue.cuda_linear_relu x1",
       "aten::_addmm_activation(%2, %3, %4, 1, 1, False)"},
      {"linear + gelu(tanh) in bfloat16", cuda_linear("aten::gelu(%5, \"tanh\")", true, "bf16"),
       "epilogue.cuda_linear_gelu x1", "aten::_addmm_activation(%2, %3, %4, 1, 1, True)"},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(epilogue_rules(), c.ir, &fired);
    EXPECT_EQ(fired, c.rule) << c.what << "\n" << out;
    EXPECT_NE(out.find(c.call), std::string::npos) << c.what << "\n" << out;
    EXPECT_NE(out.find("[4,6,64]@cuda:0 = aten::reshape("), std::string::npos) << c.what << "\n" << out;
    EXPECT_EQ(out.find("aten::relu"), std::string::npos) << c.what << "\n" << out;
  }
  // The transposed weight is typed as the view it is.
  const std::string out = run(epilogue_rules(), cuda_linear("aten::relu(%5)", true));
  EXPECT_NE(out.find("f32[32,64]{1,32}@cuda:0 = aten::t(%1)"), std::string::npos) << out;
}

TEST(ConvRules, CudaLinearEpiloguesDeclineNearMisses) {
  struct Case {
    const char* what;
    std::string ir;
    const char* reason;  // "" : left alone silently
  } cases[] = {
      {"exact gelu", cuda_linear("aten::gelu(%5, \"none\")", true), "cuBLASLt's GELU epilogue is the tanh approximation"},
      {"no bias", cuda_linear("aten::relu(%5)", true, "f32", false), "a linear without bias"},
      {"on the CPU (oneDNN's rules take it, from 2^21 multiply-adds)",
       [] {
         std::string ir = cuda_linear("aten::relu(%5)", true);
         for (size_t i; (i = ir.find(kCuda)) != std::string::npos;) ir.erase(i, kCuda.size());
         return ir;
       }(),
       ""},
  };
  for (const auto& c : cases) {
    auto g = parse_graph(c.ir);
    std::vector<RuleApplication> log;
    run_rules(*g, epilogue_rules(), {}, &log);
    EXPECT_EQ(summarize(log), "") << c.what;
    std::string declined;
    for (const auto& a : log) declined += a.declined;
    if (*c.reason) EXPECT_NE(declined.find(c.reason), std::string::npos) << c.what << ": " << declined;
    else EXPECT_EQ(declined, "") << c.what;
  }
}

// ---- gemm: linears on a weight given at each call (Note [GEMM backend measured on this machine]) ----

// x [64,48,32] @ W [128,32]^T + b (2^21 * 1.5 multiply-adds), W an input; `linear`: TorchScript's
// aten::linear, else torch.compile's addmm on t(W) viewed back; `tail` reads %5 and returns.
std::string cpu_linear(const std::string& tail, bool linear = false, const std::string& t = "f32",
                       const std::string& x_type = "f32[64,48,32]") {
  std::string ir = "graph(%0 : " + x_type + ", %1 : " + t + "[128,32], %2 : " + t + "[128]):\n";
  if (linear) {
    ir += "  %5 : " + t + "[64,48,128] = aten::linear(%0, %1, %2)\n";
  } else {
    ir += "  %3 : " + t + "[3072,32] = aten::view(%0, [3072, 32])\n"
          "  %4 : " + t + "[32,128]{1,32} = aten::t(%1)\n"
          "  %6 : " + t + "[3072,128] = aten::addmm(%2, %3, %4, 1, 1)\n"
          "  %5 : " + t + "[64,48,128] = aten::view(%6, [64, 48, 128])\n";
  }
  return ir + tail;
}

// The probe the torch adapter sets, replaced for a test: oneDNN at `onednn_us`, ATen at 100 us.
struct FakeGemmProbe {
  static inline double onednn_us = 0;
  static inline int calls = 0;
  GemmProbe saved;
  explicit FakeGemmProbe(double us) : saved(set_gemm_probe(&time)) {
    onednn_us = us;
    calls = 0;
  }
  ~FakeGemmProbe() { set_gemm_probe(saved); }
  static inline bool prepacked = false;  // the last call's
  static std::optional<GemmTiming> time(int64_t rows, int64_t k, int64_t n, bool bias, bool packed) {
    ++calls;
    prepacked = packed;
    EXPECT_EQ(rows, 4096);  // 3072 rows, timed at the next power of two
    EXPECT_EQ(k, 32);
    EXPECT_EQ(n, 128);
    EXPECT_TRUE(bias);
    return GemmTiming{100, onednn_us};
  }
};

const char* kGelu = "  %7 : f32[64,48,128] = aten::gelu(%5, \"none\")\n  return (%7)\n";

TEST(GemmRules, ALinearBecomesOneDnnsWhereMeasuredFasterWithItsActivation) {
  FakeGemmProbe probe(80);
  for (bool linear : {false, true}) {
    std::string fired;
    std::string out = run(gemm_rules(), cpu_linear(kGelu, linear), &fired);
    EXPECT_EQ(fired, "gemm.linear x1, gemm.linear_gelu x1") << out;
    EXPECT_NE(out.find("mkldnn::_linear_pointwise(%" + std::string(linear ? "0, %1, %2" : "3, %1, %2") +
                       ", \"gelu\", [], \"none\")"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("aten::gelu"), std::string::npos) << out;
    EXPECT_EQ(out.find("aten::addmm"), std::string::npos) << out;
    // Without an activation the call has no post-op; a relu6 is hardtanh's with its bounds.
    out = run(gemm_rules(), cpu_linear("  %7 : f32[64,48,128] = aten::exp(%5)\n  return (%7)\n", linear), &fired);
    EXPECT_EQ(fired, "gemm.linear x1") << out;
    EXPECT_NE(out.find("\"none\", [], None)"), std::string::npos) << out;
    out = run(gemm_rules(), cpu_linear("  %7 : f32[64,48,128] = aten::relu6(%5)\n  return (%7)\n", linear), &fired);
    EXPECT_EQ(fired, "gemm.linear x1, gemm.linear_relu6 x1") << out;
    EXPECT_NE(out.find("\"hardtanh\", [0.0,6.0], None)"), std::string::npos) << out;
  }
  EXPECT_GT(FakeGemmProbe::calls, 0);
  EXPECT_FALSE(FakeGemmProbe::prepacked);
}

// A frozen float32 linear: MKL's packed GEMM unless oneDNN's reordered weight was measured faster here.
TEST(GemmRules, AFrozenLinearTakesTheLibraryMeasuredFaster) {
  std::string ir = cpu_linear("  %7 : f32[64,48,128] = aten::exp(%5)\n  return (%7)\n", true);
  ir.replace(ir.find(", %1 : f32[128,32], %2 : f32[128])"), 34, ")");
  ir.replace(ir.find("  %5 :"), 0, "  %1 : f32[128,32] = fj::constant(0)\n  %2 : f32[128] = fj::constant(1)\n");
  {
    FakeGemmProbe probe(80);
    std::string fired;
    const std::string out = run(prepack_rules(), ir, &fired);
    EXPECT_EQ(fired, "prepack.linear x1") << out;
    EXPECT_NE(out.find("mkldnn::_reorder_linear_weight(%1, 4096)"), std::string::npos) << out;
    EXPECT_TRUE(FakeGemmProbe::prepacked);
  }
  {
    FakeGemmProbe probe(96);
    std::string fired;
    const std::string out = run(prepack_rules(), ir, &fired);
    EXPECT_EQ(fired, "prepack.linear_mkl x1") << out;
    EXPECT_NE(out.find("mkl::_mkl_linear("), std::string::npos) << out;
  }
  // Its gelu: oneDNN's post-op where oneDNN was measured faster, else MKL's GEMM and our kernel, and why.
  ir.replace(ir.find("aten::exp(%5)"), 13, "aten::gelu(%5, \"none\")");
  {
    FakeGemmProbe probe(80);
    std::string fired;
    const std::string out = run(epilogue_rules(), ir, &fired);
    EXPECT_EQ(fired, "epilogue.linear_gelu x1") << out;
  }
  {
    FakeGemmProbe probe(96);
    auto g = parse_graph(ir);
    std::vector<RuleApplication> log;
    run_rules(*g, epilogue_rules(), {}, &log);
    EXPECT_EQ(summarize(log), "");
    ASSERT_FALSE(log.empty());
    EXPECT_NE(log[0].declined.find("(measured here: [3072, 32] x [32, 128] (timed at [4096, 32]): MKL's packed GEMM 100 us, oneDNN's 96 us"),
              std::string::npos)
        << log[0].declined;
  }
}

TEST(GemmRules, ATieOrAtenFasterKeepsAtensGemmAndSaysWhy) {
  FakeGemmProbe probe(96);  // within 5% of ATen's 100 us: ATen's
  auto g = parse_graph(cpu_linear(kGelu));
  std::vector<RuleApplication> log;
  run_rules(*g, gemm_rules(), {}, &log);
  EXPECT_EQ(summarize(log), "");
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log[0].declined,
            "[3072, 32] x [32, 128] (timed at [4096, 32]): ATen's GEMM 100 us, oneDNN's 96 us on this machine");
}

// Rows are timed by octave: every row count from 2049 to 4096 asks the probe for 4096 rows, so that the
// lengths of a dynamic dimension share one measurement and one decision; a power of two is timed as is.
TEST(GemmRules, RowsAreTimedAtTheNextPowerOfTwo) {
  EXPECT_EQ(size_octave(1), 1);
  EXPECT_EQ(size_octave(3), 4);
  EXPECT_EQ(size_octave(2049), 4096);
  EXPECT_EQ(size_octave(4096), 4096);
  EXPECT_EQ(size_octave(4097), 8192);
  for (const char* rows : {"43", "48", "64"}) {  // x [rows, 48, 32]: 2064, 2304 and 3072 rows
    FakeGemmProbe probe(80);
    std::string ir = cpu_linear(kGelu, true);
    for (size_t at = ir.find("64,48"); at != std::string::npos; at = ir.find("64,48", at + 1))
      ir.replace(at, 2, rows);
    std::string fired;
    const std::string out = run(gemm_rules(), ir, &fired);
    EXPECT_EQ(fired, "gemm.linear x1, gemm.linear_gelu x1") << out;
    EXPECT_EQ(FakeGemmProbe::calls, 1) << rows;
  }
}

TEST(GemmRules, NearMissesAreLeftAlone) {
  FakeGemmProbe probe(10);
  struct Case {
    const char* what;
    std::string ir;
  } cases[] = {
      {"bfloat16", cpu_linear("  return (%5)\n", true, "bf16", "bf16[64,48,32]")},
      {"a non-contiguous input", cpu_linear("  return (%5)\n", true, "f32", "f32[64,48,32]{32,2048,1}")},
      {"too little work (2^21 multiply-adds from)", cpu_linear("  return (%5)\n", true, "f32", "f32[4,48,32]")},
      {"on CUDA (cuBLASLt's epilogue rules)",
       "graph(%0 : f32[64,48,32]@cuda:0, %1 : f32[128,32]@cuda:0, %2 : f32[128]@cuda:0):\n"
       "  %5 : f32[64,48,128]@cuda:0 = aten::linear(%0, %1, %2)\n  return (%5)\n"},
      {"addmm with beta 2", [] {
         std::string ir = cpu_linear("  return (%5)\n");
         ir.replace(ir.find("%4, 1, 1)"), 9, "%4, 2, 1)");
         return ir;
       }()},
  };
  for (const auto& c : cases) {
    std::string fired;
    const std::string out = run(gemm_rules(), c.ir, &fired);
    EXPECT_EQ(fired, "") << c.what << "\n" << out;
  }
  // The activation stays our kernel's where the call's result is also returned.
  std::string fired;
  const std::string out =
      run(gemm_rules(), cpu_linear("  %7 : f32[64,48,128] = aten::relu(%5)\n  return (%7, %5)\n"), &fired);
  EXPECT_EQ(fired, "gemm.linear x1") << out;
  EXPECT_NE(out.find("aten::relu"), std::string::npos) << out;
}

TEST(ConvRules, CudaConvReluAndConvAddReluBecomeOneCudnnCall) {
  const std::string y = "f32[2,16,10,10]" + kCuda;
  const std::string head = "graph(%0 : f32[2,8,10,10]" + kCuda + ", %1 : f32[16,8,3,3]" + kCuda + ", %2 : f32[16]" +
                           kCuda + ", %5 : " + y + "):\n"
                           "  %3 : " + y + " = aten::conv2d(%0, %1, %2, [1, 1], [1, 1], [1, 1], 1)\n";
  std::string fired;
  std::string out = run(epilogue_rules(), head + "  %4 : " + y + " = aten::relu(%3)\n  return (%4)\n", &fired);
  EXPECT_EQ(fired, "epilogue.cuda_conv_relu x1") << out;
  EXPECT_NE(out.find("= aten::cudnn_convolution_relu(%0, %1, %2, [1,1], [1,1], [1,1], 1)"), std::string::npos) << out;
  for (const char* add : {"aten::add.Tensor(%3, %5, 1)", "aten::add.Tensor(%5, %3, 1)"}) {
    out = run(epilogue_rules(),
              head + "  %4 : " + y + " = " + add + "\n  %6 : " + y + " = aten::relu(%4)\n  return (%6)\n", &fired);
    EXPECT_EQ(fired, "epilogue.cuda_conv_add_relu x1") << add << "\n" << out;
    EXPECT_NE(out.find("= aten::cudnn_convolution_add_relu(%0, %1, %3, 1, %2, [1,1], [1,1], [1,1], 1)"),
              std::string::npos)
        << out;
  }
  // Near misses: a residual that broadcasts, a conv whose result is also returned, float64.
  const std::string bcast = "graph(%0 : f32[2,8,10,10]" + kCuda + ", %1 : f32[16,8,3,3]" + kCuda + ", %5 : f32[16,1,1]" +
                            kCuda + "):\n  %3 : " + y + " = aten::conv2d(%0, %1, None, [1, 1], [1, 1], [1, 1], 1)\n"
                            "  %4 : " + y + " = aten::add.Tensor(%3, %5, 1)\n  %6 : " + y + " = aten::relu(%4)\n"
                            "  return (%6)\n";
  const std::string returned = head + "  %4 : " + y + " = aten::relu(%3)\n  return (%4, %3)\n";
  std::string f64 = head + "  %4 : " + y + " = aten::relu(%3)\n  return (%4)\n";
  for (size_t i; (i = f64.find("f32[")) != std::string::npos;) f64.replace(i, 3, "f64");
  for (const std::string& ir : {bcast, returned, f64}) {
    out = run(epilogue_rules(), ir, &fired);
    EXPECT_EQ(fired, "") << out;
    EXPECT_EQ(out.find("cudnn_convolution"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace fusion_jit
