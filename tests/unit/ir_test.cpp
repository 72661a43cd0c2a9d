#include <gtest/gtest.h>

#include <set>

#include "ir/graph.h"
#include "ir/op_table.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

const char* kGraph = R"(graph(%0 : f32[4,8], %1 : f16[8]{2}, %2 : i64[]):
  %3 : f32[8] = fj::constant(0)
  %4 : f32[4,8] = aten::add.Tensor(%0, %3, 1)
  %5 : f32[4,8] = aten::gelu(%4, "tanh")
  %6 : f32[4,8] = aten::mul.Scalar(%5, 0.5)
  %7 : f32[4,8] = aten::mul.Tensor(%6, %1)
  %8 : b8[4,8] = aten::gt.Scalar(%7, -inf)
  %9 : f32[4,8] = aten::where.ScalarOther(%8, %7, nan)
  %10 : f32[2,4,8]{32,1,4} = aten::expand(%9, [2,4,8], False)
  %11 : Tensor[] = prim::ListConstruct(%9, %9)
  %12 : f32[4,8] = !aten::relu_(%9)
  return (%9, %10, %2)
)";

TEST(IR, TextRoundTrip) {
  auto g = parse_graph(kGraph);
  verify_graph(*g);
  EXPECT_EQ(print_graph(*g), kGraph);
  auto again = parse_graph(print_graph(*g));
  EXPECT_EQ(print_graph(*again), kGraph);
  EXPECT_EQ(print_graph(*g->clone()), kGraph);
}

// Tensor types on a GPU print as @cuda:N and parse back (the torch.compile lowering writes them).
TEST(IR, CudaTypesRoundTrip) {
  const char* text = R"(graph(%0 : f32[2,3]@cuda:1, %1 : f16[3]{2}@cuda:0):
  %2 : f32[2,3]@cuda:1 = aten::mul.Tensor(%0, %1)
  return (%2)
)";
  auto g = parse_graph(text);
  EXPECT_EQ(g->inputs()[0]->tensor_type().device, Device::kCUDA);
  EXPECT_EQ(g->inputs()[0]->tensor_type().device_index, 1);
  EXPECT_EQ(g->inputs()[1]->tensor_type().strides, (std::vector<int64_t>{2}));
  EXPECT_EQ(print_graph(*g), text);
}

// The torch.compile lowering writes index's indices as a Tensor?[] list with None entries; the parser
// refused the '?' it prints, so every FX graph indexing a tensor ran eagerly.
TEST(IR, OptionalTensorListRoundTrips) {
  const char* text = R"(graph(%0 : f32[2,3,4], %1 : i64[5]):
  %2 : Tensor?[] = prim::ListConstruct(None, %1)
  %3 : f32[2,5,4] = aten::index.Tensor(%0, %2)
  return (%3)
)";
  auto g = parse_graph(text);
  EXPECT_EQ(g->nodes()[0]->output()->type().other, "Tensor?[]");
  EXPECT_EQ(print_graph(*g), text);
}

TEST(IR, TypesAndLayout) {
  auto g = parse_graph(kGraph);
  const TensorType& t = g->inputs()[1]->tensor_type();
  EXPECT_EQ(t.dtype, DType::kFloat16);
  EXPECT_EQ(t.strides, std::vector<int64_t>({2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.extent(), 15);
  EXPECT_EQ(g->inputs()[2]->tensor_type().numel(), 1);
  Node* n = g->nodes()[1];
  ASSERT_NE(n->op(), nullptr);
  EXPECT_EQ(n->op()->category, OpCategory::kElementwise);
  EXPECT_TRUE(g->nodes().back()->side_effects());
  EXPECT_EQ(g->nodes()[7]->op()->category, OpCategory::kView);
  EXPECT_EQ(g->nodes()[8]->op(), nullptr);  // opaque
}

TEST(IR, LiteralsPrintExactly) {
  EXPECT_EQ(literal_str(0.1), "0.1");
  EXPECT_EQ(literal_str(1.0), "1.0");
  EXPECT_EQ(literal_str(int64_t{-3}), "-3");
  EXPECT_EQ(literal_str(std::vector<double>{1.5, 2}), "[1.5,2.0]");
  auto g = parse_graph("graph(%0 : f64[2]):\n  %1 : f64[2] = aten::mul.Scalar(%0, 0.30000000000000004)\n  return (%1)\n");
  EXPECT_EQ(std::get<double>(g->nodes()[0]->args()[1].literal), 0.30000000000000004);
}

TEST(IR, ParseErrorsNameTheLine) {
  try {
    parse_graph("graph(%0 : f32[4]):\n  %1 : f32[4] = aten::neg(%9)\n  return (%1)\n");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2: %9 is used before it is defined"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_graph("graph(%0 : q32[4]):\n  return (%0)\n"), Error);
  EXPECT_THROW(parse_graph("graph(%0 : f32[4]):\n  return (%0) junk\n"), Error);
}

TEST(IR, VerifierCatchesWrongDtype) {
  auto g = parse_graph("graph(%0 : i32[4], %1 : f16[4]):\n  %2 : i32[4] = aten::add.Tensor(%0, %1, 1)\n  return (%2)\n");
  try {
    verify_graph(*g);
    FAIL();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("output dtype i32 but the op's rule gives f16"), std::string::npos) << e.what();
  }
}

TEST(IR, VerifierCatchesLiteralForTensor) {
  auto g = parse_graph("graph(%0 : f32[4]):\n  %1 : f32[4] = aten::mul.Tensor(%0, 2)\n  return (%1)\n");
  EXPECT_THROW(verify_graph(*g), InternalError);
}

struct PromoCase {
  std::vector<PromotionOperand> ops;
  DType expected;
};

TEST(DType, PromotionFollowsTorch) {
  using R = OperandRank;
  std::vector<PromoCase> cases = {
      {{{DType::kInt32, R::kTensor}, {DType::kFloat64, R::kWrappedNumber}}, DType::kFloat32},
      {{{DType::kFloat16, R::kTensor}, {DType::kFloat32, R::kZeroDim}}, DType::kFloat16},
      {{{DType::kInt32, R::kTensor}, {DType::kFloat64, R::kZeroDim}}, DType::kFloat64},
      {{{DType::kInt32, R::kTensor}, {DType::kInt64, R::kZeroDim}}, DType::kInt32},
      {{{DType::kBool, R::kTensor}, {DType::kInt64, R::kWrappedNumber}}, DType::kInt64},
      {{{DType::kFloat16, R::kTensor}, {DType::kBFloat16, R::kTensor}}, DType::kFloat32},
      {{{DType::kUInt8, R::kTensor}, {DType::kInt8, R::kTensor}}, DType::kInt16},
      {{{DType::kInt64, R::kZeroDim}, {DType::kFloat64, R::kWrappedNumber}}, DType::kFloat32},
      {{{DType::kBFloat16, R::kTensor}, {DType::kInt64, R::kTensor}}, DType::kBFloat16},
  };
  for (const auto& c : cases) EXPECT_EQ(result_type(c.ops), c.expected) << dtype_name(c.expected);
}

TEST(OpTable, EveryEntryIsWellFormed) {
  EXPECT_GE(all_ops().size(), 90u);
  for (const auto& op : all_ops()) {
    EXPECT_EQ(find_op(op.schema), &op) << op.schema;
    EXPECT_FALSE(op.args.empty()) << op.schema;
    if (op.category == OpCategory::kElementwise) {
      EXPECT_FALSE(op.kernel_fn.empty()) << op.schema;
    }
  }
  EXPECT_EQ(find_op("aten::conv2d"), nullptr);
}

TEST(OpTable, FlagsAnswerForTheOp) {
  const OpInfo& exp = *find_op("aten::exp");
  EXPECT_TRUE(exp.has(OpFlag::kExpensive));
  EXPECT_TRUE(exp.has(OpFlag::kNonNegative));
  EXPECT_FALSE(exp.has(OpFlag::kDiscontinuous));
  EXPECT_EQ(find_op("aten::add.Tensor")->flags, 0u);
  EXPECT_TRUE(find_op("aten::relu")->has(OpFlag::kNonNegative));
  EXPECT_FALSE(find_op("aten::relu")->has(OpFlag::kExpensive));
  // The rounding overloads of div divide integers; true division does not.
  EXPECT_TRUE(find_op("aten::div.Tensor_mode")->has(OpFlag::kIntegerDivision));
  EXPECT_TRUE(find_op("aten::div.Scalar_mode")->has(OpFlag::kIntegerDivision));
  EXPECT_FALSE(find_op("aten::div.Tensor")->has(OpFlag::kIntegerDivision));
  EXPECT_TRUE(find_op("aten::fmod.Scalar")->has(OpFlag::kIntegerDivision));
  EXPECT_TRUE(find_op("aten::pow.Tensor_Scalar")->has(OpFlag::kIntegerRaises));
  EXPECT_TRUE(find_op("aten::__xor__.Scalar")->has(OpFlag::kIntegral));
  EXPECT_TRUE(find_op("aten::floor")->has(OpFlag::kDiscontinuous));
  EXPECT_TRUE(find_op("aten::mul.Scalar")->has(OpFlag::kExact));
  EXPECT_FALSE(find_op("aten::add.Scalar")->has(OpFlag::kExact));  // only with alpha 1
  EXPECT_FALSE(find_op("aten::tanh")->has(OpFlag::kExact));
}

TEST(OpTable, FlagsAreConsistent) {
  std::set<std::string> names;
  uint32_t all = 0;
  for (OpFlag f : all_op_flags()) {
    EXPECT_TRUE(names.insert(flag_name(f)).second) << flag_name(f);
    all |= static_cast<uint32_t>(f);
  }
  for (const auto& op : all_ops()) {
    EXPECT_EQ(op.flags & ~all, 0u) << op.schema << ": an unknown flag bit";
    // Flags describe what a kernel computes: views, reductions and gathers have none of those; every
    // view returns an alias of its input.
    if (op.category != OpCategory::kElementwise) {
      EXPECT_EQ(op.flags & ~static_cast<uint32_t>(OpFlag::kReturnsAlias), 0u) << op.schema;
    }
    if (op.category == OpCategory::kView) {
      EXPECT_TRUE(op.has(OpFlag::kReturnsAlias)) << op.schema;
    }
    // Ops with a bool result are exact step functions of their arguments.
    if (op.rule == DTypeRule::kBool) {
      EXPECT_TRUE(op.has(OpFlag::kDiscontinuous)) << op.schema;
      EXPECT_TRUE(op.has(OpFlag::kExact)) << op.schema;
    }
    EXPECT_FALSE(op.has(OpFlag::kExact) && op.has(OpFlag::kExpensive)) << op.schema << ": a libm call is not exact";
    // An integer division rounds its quotient.
    if (op.has(OpFlag::kIntegerDivision)) {
      EXPECT_TRUE(op.has(OpFlag::kDiscontinuous)) << op.schema;
    }
    // The overloads of an op share its properties.
    for (const auto& other : all_ops())
      if (other.kernel_fn == op.kernel_fn && other.category == op.category && other.rule == op.rule) {
        EXPECT_EQ(other.flags, op.flags) << op.schema << " and " << other.schema;
      }
  }
}

}  // namespace
}  // namespace fusion_jit
