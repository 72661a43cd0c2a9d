#include <gtest/gtest.h>

#include "passes/passes.h"

namespace fusion_jit {
namespace {

std::string run(bool (*pass)(Graph&), const std::string& in, bool expect_change = true) {
  auto g = parse_graph(in);
  EXPECT_EQ(pass(*g), expect_change);
  verify_graph(*g);
  g->renumber();
  return print_graph(*g);
}

TEST(DCE, RemovesUnusedKeepsSideEffects) {
  EXPECT_EQ(run(dce, R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::exp(%0)
  %2 : f32[4] = aten::neg(%1)
  %3 : f32[4] = aten::relu(%0)
  %4 : f32[4] = !aten::relu_(%0)
  return (%3)
)"),
            R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::relu(%0)
  %2 : f32[4] = !aten::relu_(%0)
  return (%1)
)");
}

TEST(DCE, NothingToDo) {
  run(dce, "graph(%0 : f32[4]):\n  %1 : f32[4] = aten::exp(%0)\n  return (%1)\n", false);
}

TEST(CSE, MergesSameOpSameArgs) {
  EXPECT_EQ(run(cse, R"(graph(%0 : f32[4], %1 : f32[4]):
  %2 : f32[4] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[4] = aten::add.Tensor(%0, %1, 1)
  %4 : f32[4] = aten::add.Tensor(%0, %1, 2)
  %5 : f32[4] = aten::mul.Tensor(%2, %3)
  %6 : f32[4] = aten::mul.Tensor(%5, %4)
  return (%6)
)"),
            R"(graph(%0 : f32[4], %1 : f32[4]):
  %2 : f32[4] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[4] = aten::add.Tensor(%0, %1, 2)
  %4 : f32[4] = aten::mul.Tensor(%2, %2)
  %5 : f32[4] = aten::mul.Tensor(%4, %3)
  return (%5)
)");
}

TEST(CSE, KeepsSideEffectsAndDistinctTypes) {
  run(cse, R"(graph(%0 : f32[4]):
  %1 : f32[4] = !aten::relu_(%0)
  %2 : f32[4] = !aten::relu_(%0)
  return (%1, %2)
)",
      false);
  // The same op on the same arguments, typed with other strides (a library step that chooses its layout):
  // two values, neither read as the other.
  run(cse, R"(graph(%0 : f32[2,3]):
  %1 : f32[2,3] = aten::clone(%0, None)
  %2 : f32[2,3]{1,2} = aten::clone(%0, None)
  %3 : f32[2,3] = aten::add.Tensor(%1, %2, 1)
  return (%3)
)",
      false);
}

// Two returned results stay two tensors (eager's are distinct); a returned one and an internal one merge.
TEST(CSE, KeepsTwoReturnedResultsApart) {
  run(cse, R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::mul.Scalar(%0, 3.0)
  %2 : f32[4] = aten::mul.Scalar(%0, 3.0)
  return (%1, %2)
)",
      false);
  EXPECT_EQ(run(cse, R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::mul.Scalar(%0, 3.0)
  %2 : f32[4] = aten::mul.Scalar(%0, 3.0)
  %3 : f32[4] = aten::exp(%2)
  return (%1, %3)
)"),
            R"(graph(%0 : f32[4]):
  %1 : f32[4] = aten::mul.Scalar(%0, 3.0)
  %2 : f32[4] = aten::exp(%1)
  return (%1, %2)
)");
}

TEST(ConstantFold, FoldsNodesOverConstants) {
  auto g = parse_graph(R"(graph(%0 : f32[4]):
  %1 : f32[4] = fj::constant(0)
  %2 : f32[4] = aten::mul.Scalar(%1, 2.0)
  %3 : f32[4] = aten::add.Tensor(%0, %2, 1)
  return (%3)
)");
  int evaluated = 0;
  ConstantEvaluator eval = [&](const Node& n) -> std::optional<std::vector<int64_t>> {
    EXPECT_EQ(n.schema(), "aten::mul.Scalar");
    ++evaluated;
    return std::vector<int64_t>{7};
  };
  EXPECT_TRUE(constant_fold(*g, eval));
  dce(*g);
  g->renumber();
  EXPECT_EQ(evaluated, 1);
  EXPECT_EQ(print_graph(*g), R"(graph(%0 : f32[4]):
  %1 : f32[4] = fj::constant(7)
  %2 : f32[4] = aten::add.Tensor(%0, %1, 1)
  return (%2)
)");
}

// A factory of literals is folded where its result is small (up to 64 KiB), not a larger one, and not an
// op of literals that is no factory of the list.
TEST(ConstantFold, SmallFactoriesOfLiteralsOnly) {
  auto g = parse_graph(R"(graph(%0 : f32[8]):
  %1 : i64[8] = aten::arange(8, None, None, None, None)
  %2 : f32[128,128] = aten::zeros([128, 128], None, None, None, None)
  %3 : f32[129,128] = aten::zeros([129, 128], None, None, None, None)
  %4 : f32[8] = aten::randn([8], None, None, None, None)
  return (%1, %2, %3, %4, %0)
)");
  std::vector<std::string> evaluated;
  ConstantEvaluator eval = [&](const Node& n) -> std::optional<std::vector<int64_t>> {
    evaluated.push_back(n.schema());
    return std::vector<int64_t>{static_cast<int64_t>(evaluated.size())};
  };
  EXPECT_TRUE(constant_fold(*g, eval));
  EXPECT_EQ(evaluated, (std::vector<std::string>{"aten::arange", "aten::zeros"}));
  const std::string out = print_graph(*g);
  EXPECT_NE(out.find("f32[129,128] = aten::zeros("), std::string::npos) << out;
  EXPECT_NE(out.find("aten::randn"), std::string::npos) << out;
}

TEST(ConstantFold, LeavesNodesTheEvaluatorRefuses) {
  auto g = parse_graph("graph():\n  %0 : f32[4] = fj::constant(0)\n  %1 : f32[4] = aten::exp(%0)\n  return (%1)\n");
  EXPECT_FALSE(constant_fold(*g, [](const Node&) { return std::optional<std::vector<int64_t>>(); }));
  EXPECT_EQ(g->num_nodes(), 2u);
}


// decompose.max_pool2d (Note [Max pooling as loads]): a window without padding is one piece, the maximum
// of its taps (strided slices of the input, in window order, each the first argument); padding splits the
// result into pieces, each the maximum of its valid taps, joined by cats along W, then H.
TEST(Decompose, MaxPoolIsAMaximumOfStridedSlicesPerEdgePiece) {
  EXPECT_EQ(run(decompose, R"(graph(%0 : f32[1,2,4,4]):
  %1 : f32[1,2,2,2], %2 : i64[1,2,2,2] = aten::max_pool2d_with_indices(%0, [2,2], [2,2])
  return (%1)
)"),
            R"(graph(%0 : f32[1,2,4,4]):
  %1 : f32[1,2,2,4]{32,16,8,1} = aten::slice.Tensor(%0, 2, 0, 3, 2)
  %2 : f32[1,2,2,2]{32,16,8,2} = aten::slice.Tensor(%1, 3, 0, 3, 2)
  %3 : f32[1,2,2,4]{32,16,8,1} = aten::slice.Tensor(%0, 2, 0, 3, 2)
  %4 : f32[1,2,2,2]{32,16,8,2} = aten::slice.Tensor(%3, 3, 1, 4, 2)
  %5 : f32[1,2,2,2] = aten::maximum(%4, %2)
  %6 : f32[1,2,2,4]{32,16,8,1} = aten::slice.Tensor(%0, 2, 1, 4, 2)
  %7 : f32[1,2,2,2]{32,16,8,2} = aten::slice.Tensor(%6, 3, 0, 3, 2)
  %8 : f32[1,2,2,2] = aten::maximum(%7, %5)
  %9 : f32[1,2,2,4]{32,16,8,1} = aten::slice.Tensor(%0, 2, 1, 4, 2)
  %10 : f32[1,2,2,2]{32,16,8,2} = aten::slice.Tensor(%9, 3, 1, 4, 2)
  %11 : f32[1,2,2,2] = aten::maximum(%10, %8)
  return (%11)
)");
  // stride [] is the window's size
  EXPECT_EQ(run(decompose, R"(graph(%0 : f32[1,2,4,4]):
  %1 : f32[1,2,2,2], %2 : i64[1,2,2,2] = aten::max_pool2d_with_indices(%0, [2,2], [])
  return (%1)
)"),
            run(decompose, R"(graph(%0 : f32[1,2,4,4]):
  %1 : f32[1,2,2,2], %2 : i64[1,2,2,2] = aten::max_pool2d_with_indices(%0, [2,2], [2,2])
  return (%1)
)"));
  // 3x3, stride 2, padding 1 over a channels-last 5x5 input: rows and columns run [0,1) without tap 0, [1,2)
  // with all three, [2,3) without tap 2; nine pieces of 2 or 3 taps by 2 or 3 (49 in all), the result laid
  // out as the input.
  auto g = parse_graph(R"(graph(%0 : f32[2,8,5,5]{200,1,40,8}):
  %1 : f32[2,8,3,3]{72,1,24,8} = aten::max_pool2d(%0, [3,3], [2,2], [1,1], [1,1], False)
  return (%1)
)");
  EXPECT_TRUE(decompose(*g));
  dce(*g);
  verify_graph(*g);
  int slices = 0, maxima = 0, cats = 0;
  for (const Node* n : g->nodes()) {
    slices += n->schema() == "aten::slice.Tensor";
    maxima += n->schema() == "aten::maximum";
    cats += n->schema() == "aten::cat";
    EXPECT_NE(n->schema(), "aten::max_pool2d");
  }
  EXPECT_EQ(slices, 2 * 49);  // a slice along H, then one along W, per tap
  EXPECT_EQ(maxima, 49 - 9);
  EXPECT_EQ(cats, 3 + 1);  // each band's W cat, then H
  EXPECT_EQ(g->outputs()[0]->producer()->schema(), "aten::cat");
  EXPECT_EQ(g->outputs()[0]->tensor_type().strides, (std::vector<int64_t>{72, 1, 24, 8}));
  auto pool = [](const char* in, const char* out, const char* args) {
    return "graph(%0 : " + std::string(in) + "):\n  %1 : " + out + " = aten::max_pool2d(%0, " + args +
           ")\n  return (%1)\n";
  };
  const std::string kept[] = {
      // the indices are used
      R"(graph(%0 : f32[1,2,4,4]):
  %1 : f32[1,2,2,2], %2 : i64[1,2,2,2] = aten::max_pool2d_with_indices(%0, [2,2], [2,2])
  return (%1, %2)
)",
      pool("f32[2,4,4]", "f32[2,2,2]", "[2,2], [2,2], [0,0], [1,1], False"),  // unbatched (3-d)
      pool("i64[1,2,4,4]", "i64[1,2,2,2]", "[2,2], [2,2], [0,0], [1,1], False"),  // not floating
      // a window of one element: its slice would alias the input
      pool("f32[1,2,4,4]", "f32[1,2,2,2]", "[1,1], [2,2], [0,0], [1,1], False"),
      // 7x7: more loads per element than the rule takes
      pool("f32[1,2,8,8]", "f32[1,2,2,2]", "[7,7], [1,1], [0,0], [1,1], False"),
      // on CUDA, eager's kernel is one already
      pool("f32[1,2,4,4]@cuda:0", "f32[1,2,2,2]@cuda:0", "[2,2], [2,2], [0,0], [1,1], False"),
      // padding over half the window: eager raises
      pool("f32[1,2,4,4]", "f32[1,2,4,4]", "[2,2], [1,1], [2,2], [1,1], False")};
  for (const std::string& ir : kept) {
    auto k = parse_graph(ir);
    decompose(*k);
    EXPECT_NE(print_graph(*k).find("aten::max_pool2d"), std::string::npos) << ir;
  }
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

TEST(Decompose, SoftmaxBecomesMaxExpSumDiv) {
  EXPECT_EQ(run(decompose, R"(graph(%0 : f32[4,8]):
  %1 : f32[4,8] = aten::softmax.int(%0, -1, None)
  return (%1)
)"),
            R"(graph(%0 : f32[4,8]):
  %1 : f32[4,1] = aten::amax(%0, [1], True)
  %2 : f32[4,8] = aten::sub.Tensor(%0, %1, 1)
  %3 : f32[4,8] = aten::exp(%2)
  %4 : f32[4,1] = aten::sum.dim_IntList(%3, [1], True, None)
  %5 : f32[4,8] = aten::div.Tensor(%3, %4)
  return (%5)
)");
}

TEST(Decompose, HalfLayerNormComputesInFloatAndRoundsOnce) {
  EXPECT_EQ(run(decompose, R"(graph(%0 : f16[2,6], %1 : f16[6]):
  %2 : f16[2,6] = aten::layer_norm(%0, [6], %1, None, 1e-05, True)
  return (%2)
)"),
            R"(graph(%0 : f16[2,6], %1 : f16[6]):
  %2 : f32[2,6] = aten::to.dtype(%0, 6, False, False, None)
  %3 : f32[2,1] = aten::mean.dim(%2, [1], True, None)
  %4 : f32[2,1] = aten::var.correction(%2, [1], 0.0, True)
  %5 : f32[2,1] = aten::add.Scalar(%4, 1e-05, 1)
  %6 : f32[2,1] = aten::rsqrt(%5)
  %7 : f32[2,6] = aten::sub.Tensor(%2, %3, 1)
  %8 : f32[2,6] = aten::mul.Tensor(%7, %6)
  %9 : f32[6] = aten::to.dtype(%1, 6, False, False, None)
  %10 : f32[2,6] = aten::mul.Tensor(%8, %9)
  %11 : f16[2,6] = aten::to.dtype(%10, 5, False, False, None)
  return (%11)
)");
}

// Eager's CUDA rms_norm makes a row holding an infinity NaN except in its vectorized path (float32/16,
// bfloat16, rows a multiple of 4 elements): sum(x - x) (0, or NaN) is added to rstd there only; the CPU's
// composite never does it (measured on an H200, bench/RESULTS.md).
TEST(Decompose, CudaRmsNormFollowsEagersTwoPaths) {
  auto has_row_nan_term = [](const std::string& graph) {
    std::string out = run(decompose, graph);
    return out.find("aten::sub.Tensor") != std::string::npos &&
           out.find("aten::sum.dim_IntList") != std::string::npos;
  };
  auto rms = [](const std::string& type) {
    return "graph(%0 : " + type + "):\n  %1 : " + type + " = aten::rms_norm(%0, [" +
           type.substr(type.find(',') + 1, type.find(']') - type.find(',') - 1) + "], None, None)\n  return (%1)\n";
  };
  EXPECT_TRUE(has_row_nan_term(rms("f32[3,7]@cuda:0")));
  EXPECT_TRUE(has_row_nan_term(rms("f64[3,16]@cuda:0")));
  EXPECT_FALSE(has_row_nan_term(rms("f32[3,16]@cuda:0")));
  EXPECT_FALSE(has_row_nan_term(rms("bf16[3,16]@cuda:0")));
  EXPECT_FALSE(has_row_nan_term(rms("f32[3,7]")));
}

// decompose.embedding_range: an embedding of an ascending range (GPT-2's positions) is a slice of the
// weight's rows, viewed to the result's shape; other indices, a range outside the rows, a returned result
// or one read by a non-pointwise op stay embeddings.
TEST(Decompose, EmbeddingOfAnAscendingRangeIsASliceOfTheWeight) {
  auto g = parse_graph(R"(graph(%0 : f32[16,4], %1 : f32[1,8,4]):
  %2 : i64[8] = aten::arange.start(2, 10, None, None, None, False)
  %3 : i64[8] = aten::add.Scalar(%2, 1, 1)
  %4 : i64[1,8] = aten::unsqueeze(%3, 0)
  %5 : f32[1,8,4] = aten::embedding(%0, %4, -1, False, False)
  %6 : f32[1,8,4] = aten::add.Tensor(%5, %1, 1)
  return (%6)
)");
  EXPECT_TRUE(decompose(*g));
  dce(*g);
  g->renumber();
  EXPECT_EQ(print_graph(*g), R"(graph(%0 : f32[16,4], %1 : f32[1,8,4]):
  %2 : f32[8,4] = aten::slice.Tensor(%0, 0, 3, 11, 1)
  %3 : f32[1,8,4] = aten::view(%2, [1,8,4])
  %4 : f32[1,8,4] = aten::add.Tensor(%3, %1, 1)
  return (%4)
)");
  const char* kept[] = {
      // rows 10..18 of 16: eager raises
      R"(graph(%0 : f32[16,4], %1 : f32[8,4]):
  %2 : i64[8] = aten::arange.start(10, 18, None, None, None, False)
  %3 : f32[8,4] = aten::embedding(%0, %2, -1, False, False)
  %4 : f32[8,4] = aten::add.Tensor(%3, %1, 1)
  return (%4)
)",
      // step 2
      R"(graph(%0 : f32[16,4], %1 : f32[4,4]):
  %2 : i64[4] = aten::arange.start_step(0, 8, 2, None, None, None, False)
  %3 : f32[4,4] = aten::embedding(%0, %2, -1, False, False)
  %4 : f32[4,4] = aten::add.Tensor(%3, %1, 1)
  return (%4)
)",
      // returned: eager's result is a tensor of its own
      R"(graph(%0 : f32[16,4]):
  %1 : i64[8] = aten::arange(8, None, None, None, False)
  %2 : f32[8,4] = aten::embedding(%0, %1, -1, False, False)
  return (%2)
)",
      // read by a matmul
      R"(graph(%0 : f32[16,4], %1 : f32[4,4]):
  %2 : i64[8] = aten::arange(8, None, None, None, False)
  %3 : f32[8,4] = aten::embedding(%0, %2, -1, False, False)
  %4 : f32[8,4] = aten::mm(%3, %1)
  return (%4)
)",
      // indices from the caller
      R"(graph(%0 : f32[16,4], %1 : i64[8], %2 : f32[8,4]):
  %3 : f32[8,4] = aten::embedding(%0, %1, -1, False, False)
  %4 : f32[8,4] = aten::add.Tensor(%3, %2, 1)
  return (%4)
)"};
  for (const char* ir : kept) {
    auto k = parse_graph(ir);
    decompose(*k);
    EXPECT_NE(print_graph(*k).find("aten::embedding"), std::string::npos) << ir;
  }
}

TEST(Decompose, EmptyReducedDimStaysWithATen) {
  run(decompose, R"(graph(%0 : f32[3,0]):
  %1 : f32[3,0] = aten::softmax.int(%0, 1, None)
  %2 : f32[3] = aten::logsumexp(%0, [1], False)
  return (%1, %2)
)",
      false);
}

TEST(Decompose, MaxDimWithoutIndicesBecomesAmax) {
  EXPECT_EQ(run(decompose, R"(graph(%0 : f32[3,5]):
  %1 : f32[3], %2 : i64[3] = aten::max.dim(%0, 1, False)
  return (%1)
)"),
            R"(graph(%0 : f32[3,5]):
  %1 : f32[3] = aten::amax(%0, [1], False)
  return (%1)
)");
}

}  // namespace
}  // namespace fusion_jit
