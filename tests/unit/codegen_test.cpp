// Code generation without torch: kernels printed as text, compiled by the host compiler, run on plain
// buffers, and compared with values computed here.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <vector>

#include "codegen/lowering.h"
#include "driver/build_plan.h"
#include "driver/plan_cache.h"
#include "kernels_cache/kernels_cache.h"
#include "targets/cpu/cpu_launch.h"
#include "targets/cpu/cpu_printer.h"
#include "support/options.h"
#include "targets/cpu/host_compiler.h"
#include "targets/targets.h"

#include <ctime>
#include <unistd.h>
#include "support/error.h"

namespace fusion_jit {
namespace {

struct Built {
  std::unique_ptr<Graph> graph;
  FusionPlan plan;
  std::vector<KernelSpec> specs;
  std::string source;
};

Built build(const std::string& ir) {
  Built b;
  b.graph = parse_graph(ir);
  verify_graph(*b.graph);
  RooflineCostModel cost(host_cpu_description());
  b.plan = plan_fusion(*b.graph, cost);
  for (const auto& g : b.plan.groups) b.specs.push_back(make_kernel_spec(g, target_for(Device::kCPU)));
  b.source = print_cpu_source(b.specs);
  return b;
}

const char* kChain = R"(graph(%0 : f32[3,5], %1 : f32[5]):
  %2 : f32[3,5] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[3,5] = aten::mul.Scalar(%2, 0.5)
  %4 : f32[3,5] = aten::maximum(%3, %0)
  return (%4)
)";

TEST(Codegen, KernelSpecOfBroadcastChain) {
  Built b = build(kChain);
  ASSERT_EQ(b.specs.size(), 1u);
  const KernelSpec& k = b.specs[0];
  EXPECT_EQ(k.sizes, std::vector<int64_t>({3, 5}));
  EXPECT_TRUE(k.index32);
  ASSERT_EQ(k.buffers.size(), 3u);
  EXPECT_EQ(k.buffers[0].strides, std::vector<int64_t>({5, 1}));  // %0
  EXPECT_EQ(k.buffers[1].strides, std::vector<int64_t>({0, 1}));  // %1 broadcast over rows
  EXPECT_TRUE(k.buffers[2].is_output);
  ASSERT_EQ(k.body.size(), 4u);
  EXPECT_EQ(print_stmt(k.body[0]), "const float t2 = ((float)(fj_add(((float)b0), ((float)b1), ((float)1LL))));  // aten::add.Tensor");
  EXPECT_EQ(print_stmt(k.body[1]), "const float t3 = ((float)(fj_mul(((float)t2), ((float)0x1p-1))));  // aten::mul.Scalar");
  EXPECT_EQ(print_stmt(k.body[3]), "o0 = t4;");
}

TEST(Codegen, ContiguousDimsMergeAndTransposedReorder) {
  Built b = build(R"(graph(%0 : f32[4,6,8], %1 : f32[4,6,8]{1,32,4}):
  %2 : f32[4,6,8] = aten::add.Tensor(%0, %0, 1)
  %3 : f32[4,6,8]{1,32,4} = aten::neg(%1)
  return (%2, %3)
)");
  ASSERT_EQ(b.specs.size(), 2u);
  EXPECT_EQ(b.specs[0].sizes, std::vector<int64_t>({192}));  // fully merged
  EXPECT_EQ(b.specs[1].sizes, std::vector<int64_t>({192}));  // reordered by the output's strides, then merged
  EXPECT_EQ(b.specs[1].buffers[0].strides, std::vector<int64_t>({1}));
}

TEST(Codegen, Int64IndicesWhenAnExtentExceedsInt32) {
  Built b = build(R"(graph(%0 : f32[2,3]{3000000000,1}):
  %1 : f32[2,3] = aten::neg(%0)
  return (%1)
)");
  EXPECT_FALSE(b.specs[0].index32);
  EXPECT_NE(b.source.find("typedef int64_t I;"), std::string::npos);
}

// The f32 0-d operand of mul is not rounded to f16: eager's CPU kernel takes a scalar second operand of a
// reduced-float mul or div at its original value (in float), though it rounds other operands. Rows of 12
// elements: shorter ones are walked along the next dim (Note [Short rows], ShortRowsRunAlongTheNextDim).
TEST(Codegen, KernelTextOfATransposedInput) {
  Built b = build(R"(graph(%0 : f16[3,12]{1,3}, %1 : f32[]):
  %2 : f16[3,12] = aten::mul.Tensor(%0, %1)
  return (%2)
)");
  std::string src = b.source.substr(b.source.find("// group 0"));
  EXPECT_EQ(src, R"(// group 0: 36 elements as [3,12], int32_t offsets
extern "C" void fj_kernel_0(void* const* buf, const int64_t* z_, int64_t begin_, int64_t end_) {
  typedef int32_t I;
  const uint16_t* __restrict__ p0 = (const uint16_t*)buf[0];
  const float* __restrict__ p1 = (const float*)buf[1];
  uint16_t* __restrict__ p2 = (uint16_t*)buf[2];
  const I fb_ = (I)((begin_ + 12 - 1) / 12), fe_ = (I)((end_ + 12 - 1) / 12);
  for (I row = fb_; row < fe_; ++row) {
    const I col = 0, n = 12;
    I off0 = 0;
    I off1 = 0;
    I off2 = 0;
    {
      I r = row, c;
      c = r;
      off0 += c * 1;
      off2 += c * 12;
    }
    const uint16_t* __restrict__ r0 = p0 + off0;
    const float* __restrict__ r1 = p1 + off1;
    uint16_t* __restrict__ r2 = p2 + off2;
#pragma omp simd
    for (I j = 0; j < n; ++j) {
      const float b0 = fj_h2f(r0[j * 3]);
      const float b1 = r1[0];
      float o0;
      const float t2 = fj_round_f16(((float)(fj_mul(((float)b0), ((float)b1)))));  // aten::mul.Tensor
      o0 = t2;
      r2[j] = fj_f2h(o0);
    }
  }
}
)");
}

// Note [Short rows]: a channels-last copy of a [2,3,5,7] image plus a per-channel bias (the kernel's rows
// are its 3 channels, read 35 apart), and a [6,2] tensor times a [2] scale: the whole rows run in a loop
// along the next dim with the row's elements written out, each split running the rows that start in its
// range (Note [Whole rows]). Each kernel runs over every split of its range into two (as the thread pool
// may split it) against values computed here.
TEST(Codegen, ShortRowsRunAlongTheNextDim) {
  struct Case {
    std::string ir;
    int64_t numel, inner;
    std::function<float(const std::vector<float>&, const std::vector<float>&, int64_t)> want;
  } cases[] = {
      {R"(graph(%0 : f32[2,3,5,7], %1 : f32[3,1,1]):
  %2 : f32[2,3,5,7]{105,1,21,3} = aten::clone(%0, 2)
  %3 : f32[2,3,5,7]{105,1,21,3} = aten::add.Tensor(%2, %1, 1)
  return (%3)
)",
       210, 3,
       [](const std::vector<float>& x, const std::vector<float>& bias, int64_t i) {
         const int64_t c = i % 3, w = i / 3 % 7, h = i / 21 % 5, n = i / 105;  // element i is (n, h, w, c)
         return x[((n * 3 + c) * 5 + h) * 7 + w] + bias[c];
       }},
      {R"(graph(%0 : f32[6,2], %1 : f32[2]):
  %2 : f32[6,2] = aten::mul.Tensor(%0, %1)
  return (%2)
)",
       12, 2, [](const std::vector<float>& x, const std::vector<float>& s, int64_t i) { return x[i] * s[i % 2]; }},
  };
  for (const Case& k : cases) {
    Built b = build(k.ir);
    ASSERT_EQ(b.specs.size(), 1u) << k.ir;
    ASSERT_EQ(static_cast<int64_t>(b.specs[0].sizes.back()), k.inner) << k.ir;
    EXPECT_NE(b.source.find("for (I r_ = fb_; r_ < fe_;)"), std::string::npos) << b.source;
    EXPECT_EQ(b.source.find("part_"), std::string::npos) << "no partial rows\n" << b.source;
    auto lib = compile_cpu_source(b.source);
    auto fn = reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"));
    std::vector<float> x(k.numel), small(k.inner);
    for (int64_t i = 0; i < k.numel; ++i) x[i] = std::sin(static_cast<float>(i)) * 3.0f;
    for (int64_t i = 0; i < k.inner; ++i) small[i] = 0.5f + static_cast<float>(i);
    for (int64_t split = 0; split <= k.numel; ++split) {
      std::vector<float> out(k.numel, -100.0f);
      void* bufs[] = {x.data(), small.data(), out.data()};
      fn(bufs, nullptr, 0, split);
      fn(bufs, nullptr, split, k.numel);
      for (int64_t i = 0; i < k.numel; ++i)
        ASSERT_EQ(out[i], k.want(x, small, i)) << "split " << split << ", element " << i;
    }
  }
}

// Note [Whole rows]: a kernel whose rows are at most kWholeRow long runs the rows that start in its range,
// each whole, so that any split of the range runs every row: a [7,33] product with a per-column scale, a
// cat of unequal items (pieces along the row: 3 * cat(-x, y)), each over every split into two and into
// three; a row longer than kWholeRow keeps element ranges and is split inside rows.
TEST(Codegen, WholeRowsRunEveryRowWhateverTheSplit) {
  struct Case {
    std::string ir;
    int64_t numel, x_numel, y_numel;
    bool whole, pieces;
    std::function<float(const std::vector<float>&, const std::vector<float>&, int64_t)> want;
  } cases[] = {
      {R"(graph(%0 : f32[7,33], %1 : f32[33]):
  %2 : f32[7,33] = aten::mul.Tensor(%0, %1)
  return (%2)
)",
       231, 231, 33, true, false, [](const std::vector<float>& x, const std::vector<float>& y, int64_t i) { return x[i] * y[i % 33]; }},
      {R"(graph(%0 : f32[4,5], %1 : f32[4,7]):
  %2 : f32[4,5] = aten::neg(%0)
  %3 : Tensor[] = prim::ListConstruct(%2, %1)
  %4 : f32[4,12] = aten::cat(%3, 1)
  %5 : f32[4,12] = aten::mul.Scalar(%4, 3.0)
  return (%5)
)",
       48, 20, 28, true, true,
       [](const std::vector<float>& x, const std::vector<float>& y, int64_t i) {
         const int64_t r = i / 12, c = i % 12;
         return 3.0f * (c < 5 ? -x[r * 5 + c] : y[r * 7 + c - 5]);
       }},
      {R"(graph(%0 : f32[2,5000], %1 : f32[5000]):
  %2 : f32[2,5000] = aten::mul.Tensor(%0, %1)
  return (%2)
)",
       10000, 10000, 5000, false, false, [](const std::vector<float>& x, const std::vector<float>& y, int64_t i) { return x[i] * y[i % 5000]; }},
  };
  for (const Case& k : cases) {
    Built b = build(k.ir);
    ASSERT_EQ(b.specs.size(), 1u) << k.ir;
    EXPECT_EQ(b.source.find("for (I row = fb_; row < fe_; ++row)") != std::string::npos, k.whole) << b.source;
    EXPECT_EQ(b.source.find("while (i < end)") != std::string::npos, !k.whole) << b.source;
    EXPECT_EQ(b.source.find("I lo_ = 0, hi_ = n;") != std::string::npos, k.pieces) << "pieces along the row\n" << b.source;
    auto lib = compile_cpu_source(b.source);
    auto fn = reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"));
    std::vector<float> x(k.x_numel), y(k.y_numel);
    for (int64_t i = 0; i < k.x_numel; ++i) x[i] = std::sin(static_cast<float>(i)) * 3.0f;
    for (int64_t i = 0; i < k.y_numel; ++i) y[i] = 0.5f + static_cast<float>(i % 17);
    auto check = [&](std::vector<int64_t> cuts) {
      std::vector<float> out(k.numel, -100.0f);
      void* bufs[] = {x.data(), y.data(), out.data()};
      cuts.insert(cuts.begin(), 0);
      cuts.push_back(k.numel);
      for (size_t c = 0; c + 1 < cuts.size(); ++c) fn(bufs, nullptr, cuts[c], cuts[c + 1]);
      for (int64_t i = 0; i < k.numel; ++i) ASSERT_EQ(out[i], k.want(x, y, i)) << "cuts at " << cuts[1] << ", element " << i;
    };
    const int64_t step = k.numel > 1000 ? 997 : 1;
    for (int64_t a = 0; a <= k.numel; a += step) {
      check({a});
      check({a / 3, a});
    }
  }
}

// Note [Short rows through a tile]: an output whose short rows have gaps (8 elements every 16, as a kernel
// writing its channels of a wider cat) is written through a tile and copied out row by row; the elements
// in the gaps are left as they were. In float32 and in bfloat16 (values a bfloat16 holds exactly), over
// every split of the range into two and with more rows than one tile. bfloat16 rows end to end (a row
// stride of 8) go through a tile too, float32's are stored as they are.
TEST(Codegen, ShortRowsWithGapsAreWrittenThroughATile) {
  constexpr int64_t kRows = 150, kInner = 8;
  for (auto [t, kStride] : {std::pair<const char*, int64_t>{"f32", 16}, {"bf16", 16}, {"f32", 8}, {"bf16", 8}}) {
    const bool bf16 = std::strcmp(t, "bf16") == 0;
    Built b = build(fmt::format(R"(graph(%0 : {0}[{1},{2}], %1 : {0}[{2}]):
  %2 : {0}[{1},{2}]{{{3},1}} = aten::mul.Tensor(%0, %1)
  return (%2)
)",
                                t, kRows, kInner, kStride));
    ASSERT_EQ(b.specs.size(), 1u);
    EXPECT_NE(b.source.find("for (I r_ = fb_; r_ < fe_;)"), std::string::npos) << b.source;
    EXPECT_EQ(b.source.find("tile2_[jj_ * 8 + 7]") != std::string::npos, bf16 || kStride != kInner)
        << "the output goes through a tile\n" << b.source;
    auto lib = compile_cpu_source(b.source);
    auto fn = reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"));
    // bfloat16 as the upper half of a float's bits: small multiples of 1/4 are exact in both.
    auto to_bf16 = [](float f) { uint32_t u; std::memcpy(&u, &f, 4); return static_cast<uint16_t>(u >> 16); };
    auto from_bf16 = [](uint16_t h) { uint32_t u = static_cast<uint32_t>(h) << 16; float f; std::memcpy(&f, &u, 4); return f; };
    std::vector<float> x(kRows * kInner), scale(kInner);
    for (int64_t i = 0; i < kRows * kInner; ++i) x[i] = static_cast<float>(i % 37) - 18.0f;
    for (int64_t i = 0; i < kInner; ++i) scale[i] = 0.25f * static_cast<float>(i + 1);
    std::vector<uint16_t> xh(x.size()), scaleh(scale.size());
    for (size_t i = 0; i < x.size(); ++i) xh[i] = to_bf16(x[i]);
    for (size_t i = 0; i < scale.size(); ++i) scaleh[i] = to_bf16(scale[i]);
    for (int64_t split : {int64_t{0}, int64_t{5}, int64_t{8}, int64_t{517}, int64_t{64 * 8 + 3}, kRows * kInner}) {
      constexpr float kUntouched = -1000.0f;
      std::vector<float> out(kRows * kStride, kUntouched);
      std::vector<uint16_t> outh(out.size(), to_bf16(kUntouched));
      void* bufs[] = {bf16 ? static_cast<void*>(xh.data()) : x.data(), bf16 ? static_cast<void*>(scaleh.data()) : scale.data(),
                      bf16 ? static_cast<void*>(outh.data()) : out.data()};
      fn(bufs, nullptr, 0, split);
      fn(bufs, nullptr, split, kRows * kInner);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kStride; ++c) {
          const float got = bf16 ? from_bf16(outh[r * kStride + c]) : out[r * kStride + c];
          const float want = c < kInner ? x[r * kInner + c] * scale[c] : kUntouched;
          ASSERT_EQ(got, want) << t << ", split " << split << ", row " << r << ", element " << c;
        }
    }
  }
}

// Note [Results that need no rounding]: in a bfloat16 chain, the ops that keep a value held in the dtype
// (relu of a rounded product, a clone of a load, a clamp and a hardtanh to bounds the dtype holds, a
// maximum of two bfloat16 values) are not rounded again; the product, and a hardtanh to bounds it does not
// hold (0.1), are.
TEST(Codegen, ResultsTheDtypeHoldsAreNotRoundedAgain) {
  Built b = build(R"(graph(%0 : bf16[4,64], %1 : bf16[4,64]):
  %2 : bf16[4,64] = aten::mul.Scalar(%0, 3.0)
  %3 : bf16[4,64] = aten::relu(%2)
  %4 : bf16[4,64] = aten::clone(%1, None)
  %5 : bf16[4,64] = aten::maximum(%3, %4)
  %6 : bf16[4,64] = aten::clamp(%5, -2.0, 2.5)
  %7 : bf16[4,64] = aten::hardtanh(%6, -1.0, 1.0)
  %8 : bf16[4,64] = aten::hardtanh(%6, 0.1, 0.9)
  return (%7, %8)
)");
  ASSERT_EQ(b.specs.size(), 1u) << b.source;
  auto line_of = [&](const std::string& op) {
    std::string all;
    for (size_t at = b.source.find("// " + op); at != std::string::npos; at = b.source.find("// " + op, at + 1))
      all += b.source.substr(b.source.rfind('\n', at) + 1, at - b.source.rfind('\n', at) - 1) + "\n";
    return all;
  };
  EXPECT_NE(line_of("aten::mul.Scalar").find("fj_round_bf16"), std::string::npos) << b.source;
  for (const char* op : {"aten::relu", "aten::clone", "aten::maximum", "aten::clamp"})
    EXPECT_EQ(line_of(op).find("fj_round_bf16"), std::string::npos) << op << "\n" << b.source;
  const std::string hardtanh = line_of("aten::hardtanh");
  size_t rounded = 0;
  for (size_t at = hardtanh.find("fj_round_bf16"); at != std::string::npos; at = hardtanh.find("fj_round_bf16", at + 1)) ++rounded;
  EXPECT_EQ(rounded, 1u) << "only the hardtanh to 0.1 and 0.9 is rounded\n" << hardtanh;
  EXPECT_NE(hardtanh.find("fj_round_bf16(((float)(fj_hardtanh(((float)t6), ((float)0x1.99999"), std::string::npos) << hardtanh;
}

// Note [Stores of held values]: bfloat16 outputs whose values the dtype holds (a rounded product, a relu
// of it, a clone of an input) are stored as their upper 16 bits, with the bits the rounding store gave
// for every one of the 65536 bfloat16 inputs, and a signalling NaN cloned keeps its bits, as eager's copy
// does; float16 stores are left as they were.
TEST(Codegen, StoresOfHeldBfloat16ValuesAreTheirUpperHalves) {
  Built b = build(R"(graph(%0 : bf16[256,256]):
  %2 : bf16[256,256] = aten::mul.Scalar(%0, 3.0)
  %3 : bf16[256,256] = aten::relu(%2)
  %4 : bf16[256,256] = aten::clone(%0, None)
  return (%2, %3, %4)
)");
  ASSERT_EQ(b.specs.size(), 1u) << b.source;
  for (int o = 0; o < 3; ++o)
    EXPECT_NE(b.source.find(fmt::format("fj_bf16_bits(o{})", o)), std::string::npos) << o << "\n" << b.source;
  EXPECT_EQ(b.source.find("fj_f2bf(o"), std::string::npos) << b.source;
  std::string rounding = b.source;  // the same kernel storing through the rounding conversion
  for (size_t at = rounding.find("fj_bf16_bits(o"); at != std::string::npos; at = rounding.find("fj_bf16_bits(o", at))
    rounding.replace(at, 13, "fj_f2bf(");
  auto lib = compile_cpu_source(b.source), old = compile_cpu_source(rounding);
  constexpr int64_t n = 65536;
  std::vector<uint16_t> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<uint16_t>(i);
  std::vector<std::vector<uint16_t>> got(3, std::vector<uint16_t>(n)), want(3, std::vector<uint16_t>(n));
  void* bufs[] = {x.data(), got[0].data(), got[1].data(), got[2].data()};
  void* old_bufs[] = {x.data(), want[0].data(), want[1].data(), want[2].data()};
  reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"))(bufs, nullptr, 0, n);
  reinterpret_cast<CpuKernelFn>(old->symbol("fj_kernel_0"))(old_bufs, nullptr, 0, n);
  for (int o = 0; o < 2; ++o)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[o][i], want[o][i]) << "output " << o << ", input bits " << i;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[2][i], x[i]) << "the clone keeps the input's bits " << i;
    const bool nan = (i & 0x7f80) == 0x7f80 && (i & 0x7f) != 0;
    if (!nan) {
      ASSERT_EQ(got[2][i], want[2][i]) << i;
    }
  }
  Built h = build(R"(graph(%0 : f16[4,8]):
  %1 : f16[4,8] = aten::mul.Scalar(%0, 3.0)
  return (%1)
)");
  EXPECT_NE(h.source.find("fj_f2h(o0)"), std::string::npos) << h.source;
}

// The same for a reduction kernel's stores: a bfloat16 softmax's row sums (a row store) and its results
// (a pass's element stores), against the kernel storing through the rounding conversion.
TEST(Codegen, ReductionStoresOfHeldBfloat16ValuesAreTheirUpperHalves) {
  Built b = build(R"(graph(%0 : bf16[64,256]):
  %1 : bf16[64,1] = aten::amax(%0, [1], True)
  %2 : bf16[64,256] = aten::sub.Tensor(%0, %1, 1)
  %3 : bf16[64,256] = aten::exp(%2)
  %4 : bf16[64,1] = aten::sum.dim_IntList(%3, [1], True, None)
  %5 : bf16[64,256] = aten::div.Tensor(%3, %4)
  return (%4, %5)
)");
  ASSERT_EQ(b.specs.size(), 1u) << b.source;
  ASSERT_TRUE(b.specs[0].is_reduction());
  const std::string kernel = b.source.substr(b.source.find("// group 0"));
  EXPECT_EQ(kernel.find("fj_f2bf("), std::string::npos) << kernel;
  std::string rounding = b.source;
  size_t replaced = 0;
  for (size_t at = rounding.find("fj_bf16_bits(", rounding.find("// group 0")); at != std::string::npos;
       at = rounding.find("fj_bf16_bits(", at), ++replaced)
    rounding.replace(at, 13, "fj_f2bf(");
  EXPECT_GE(replaced, 2u) << kernel;
  auto lib = compile_cpu_source(b.source), old = compile_cpu_source(rounding);
  constexpr int64_t rows = 64, cols = 256;
  std::vector<uint16_t> x(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float f = std::sin(static_cast<float>(i) * 0.37f) * 6.0f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    x[i] = static_cast<uint16_t>(u >> 16);
  }
  std::vector<uint16_t> sums(rows), out(rows * cols), old_sums(rows), old_out(rows * cols);
  void* bufs[] = {x.data(), sums.data(), out.data()};
  void* old_bufs[] = {x.data(), old_sums.data(), old_out.data()};
  reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"))(bufs, nullptr, 0, rows);
  reinterpret_cast<CpuKernelFn>(old->symbol("fj_kernel_0"))(old_bufs, nullptr, 0, rows);
  EXPECT_EQ(sums, old_sums);
  EXPECT_EQ(out, old_out);
  EXPECT_NE(std::count(out.begin(), out.end(), uint16_t{0}), rows * cols) << "the kernel ran";
}

TEST(Codegen, SourceIsDeterministic) { EXPECT_EQ(build(kChain).source, build(kChain).source); }

// Note [Sizes as kernel arguments]: printed with its sizes as arguments, a broadcast chain and a softmax
// written out give one source for every size (the rows, the row length, the strides that follow), so
// the host compiler runs once; each size runs that library with its own values and gives the formula's
// results.
// A size whose offsets no longer fit int32 is another variant of the same kernel: int64 offsets, its own
// source (compiled once more), the stride read as an argument like any other.
TEST(Codegen, SizesAsArgumentsPastTheInt32LimitAreAnotherVariant) {
  const char* graph = R"(graph(%0 : f32[2,3]{{{},1}}):
  %1 : f32[2,3] = aten::neg(%0)
  return (%1)
)";
  Built small = build(fmt::format(fmt::runtime(graph), 5)), huge = build(fmt::format(fmt::runtime(graph), 3000000000));
  small.source = print_cpu_source(small.specs, /*size_args=*/true);
  huge.source = print_cpu_source(huge.specs, /*size_args=*/true);
  EXPECT_TRUE(small.specs[0].index32);
  EXPECT_FALSE(huge.specs[0].index32);
  EXPECT_NE(small.source, huge.source);
  EXPECT_NE(huge.source.find("typedef int64_t I;"), std::string::npos);
  const auto& args = huge.specs[0].args;
  EXPECT_NE(std::find(args.begin(), args.end(), 3000000000), args.end()) << fmt::format("{}", fmt::join(args, ","));
  EXPECT_EQ(huge.source.find("3000000000"), std::string::npos) << "the stride is an argument, not a literal";
}

TEST(Codegen, SizesAsArgumentsGiveOneSourceForEverySize) {
  const char* graph = R"(graph(%0 : f32[{0},{1}], %1 : f32[{1}]):
  %2 : f32[{0},{1}] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[{0},{1}] = aten::mul.Scalar(%2, 0.5)
  %4 : f32[{0},{1}] = aten::maximum(%3, %0)
  %5 : f32[{0},1] = aten::amax(%4, [1], True)
  %6 : f32[{0},{1}] = aten::sub.Tensor(%4, %5, 1)
  %7 : f32[{0},{1}] = aten::exp(%6)
  %8 : f32[{0},1] = aten::sum.dim_IntList(%7, [1], True, None)
  %9 : f32[{0},{1}] = aten::div.Tensor(%7, %8)
  return (%4, %9)
)";
  std::string source;
  std::shared_ptr<CompiledLibrary> lib;
  const int64_t compiles = host_compile_stats().compiles;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 5}, {7, 5}, {2, 16}, {13, 17}, {5, 1000}}) {
    const std::string what = fmt::format("[{},{}]", rows, cols);
    Built b = build(fmt::format(fmt::runtime(graph), rows, cols));
    b.source = print_cpu_source(b.specs, /*size_args=*/true);
    if (source.empty()) {
      source = b.source;
      lib = compile_cpu_source(b.source);
    }
    EXPECT_EQ(b.source, source) << what << ": another size printed another source";
    // Every value's elements, by value id: the inputs given, the kernels' outputs written.
    std::map<int, std::vector<float>> data;
    std::vector<float>& x = data[0];
    std::vector<float>& bias = data[1];
    x.resize(rows * cols);
    bias.resize(cols);
    for (int64_t i = 0; i < rows * cols; ++i) x[i] = std::sin(static_cast<float>(i)) * 4.0f;
    for (int64_t j = 0; j < cols; ++j) bias[j] = static_cast<float>(j % 7) * 0.25f - 0.5f;
    for (const KernelSpec& k : b.specs) {
      EXPECT_FALSE(k.args.empty()) << what;
      std::vector<void*> bufs;
      for (const KernelBuffer& kb : k.buffers) {
        std::vector<float>& v = data[kb.value->id()];
        if (kb.is_output) v.resize(kb.value->tensor_type().numel());
        bufs.push_back(v.data());
      }
      auto fn = reinterpret_cast<CpuKernelFn>(lib->symbol(k.name));
      const int64_t n = k.is_reduction() ? k.rows : k.numel;
      fn(bufs.data(), k.args.data(), 0, n / 2);  // two ranges, as the thread pool splits them
      fn(bufs.data(), k.args.data(), n / 2, n);
    }
    const std::vector<float>& out = data[4];
    const std::vector<float>& soft = data[9];
    ASSERT_EQ(out.size(), static_cast<size_t>(rows * cols)) << what;
    ASSERT_EQ(soft.size(), static_cast<size_t>(rows * cols)) << what;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> y(cols);
      float m = -INFINITY;
      double sum = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = r * cols + c;
        y[c] = std::fmax((x[i] + bias[c]) * 0.5f, x[i]);
        ASSERT_FLOAT_EQ(out[i], y[c]) << what << " element " << i;
        m = std::fmax(m, y[c]);
      }
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(y[c] - m);
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_NEAR(soft[r * cols + c], std::exp(y[c] - m) / sum, 1e-6) << what << " row " << r << " col " << c;
    }
  }
  EXPECT_LE(host_compile_stats().compiles - compiles, 1) << "one compile for every size (none: the disk cache had it)";
}

TEST(Codegen, CompiledKernelComputesTheChain) {
  Built b = build(kChain);
  auto lib = compile_cpu_source(b.source);
  auto fn = reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"));
  float x[15], bias[5], out[15];
  for (int i = 0; i < 15; ++i) x[i] = static_cast<float>(i) - 7.0f;
  for (int j = 0; j < 5; ++j) bias[j] = static_cast<float>(j) * 0.25f;
  x[3] = std::numeric_limits<float>::quiet_NaN();
  void* bufs[] = {x, bias, out};
  // Two ranges, as the thread pool would split them.
  fn(bufs, nullptr, 0, 7);
  fn(bufs, nullptr, 7, 15);
  for (int i = 0; i < 15; ++i) {
    float e = std::fmax((x[i] + bias[i % 5]) * 0.5f, x[i]);
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(out[i])) << i;
    } else {
      EXPECT_FLOAT_EQ(out[i], e) << i;
    }
  }
  EXPECT_EQ(compile_cpu_source(b.source).get(), lib.get());  // in-memory cache
}

// The activation block of examples/models.py: its loop must be vectorized, with libmvec's vector tanhf and
// the prelude's own exp (Note [Inline float32 exp]: no expf called at all), on CPUs without AVX-512 too. Before -fno-tree-pre -fno-thread-jumps (host_compiler.h), GCC left the
// whole loop scalar for -march=haswell and znver3 ("control flow in loop", from the clamp's selects) and
// the block ran 3x slower than eager there.
TEST(Codegen, TheActivationBlocksLoopIsVectorizedOnEveryX86Level) {
  Built b = build(R"(graph(%0 : f32[64,256], %1 : f32[64,256], %2 : f32[256], %3 : f32[256]):
  %4 : f32[64,256] = aten::mul.Tensor(%0, %2)
  %5 : f32[64,256] = aten::add.Tensor(%4, %3, 1)
  %6 : f32[64,256] = aten::silu(%5)
  %7 : f32[64,256] = aten::sigmoid(%1)
  %8 : f32[64,256] = aten::mul.Tensor(%6, %7)
  %9 : f32[64,256] = aten::clamp(%8, -4.0, 4.0)
  %10 : f32[64,256] = aten::tanh(%9)
  %11 : f32[64,256] = aten::mul.Scalar(%10, 0.5)
  %12 : f32[64,256] = aten::add.Tensor(%9, %11, 1)
  %13 : f32[64,256] = aten::hardswish(%12)
  %14 : f32[64,256] = aten::add.Tensor(%13, %0, 1)
  return (%14)
)");
  ASSERT_EQ(b.specs.size(), 1u);
  if (Options::get().cxx.find("-fsanitize") != std::string::npos)
    GTEST_SKIP() << "the host compiler command (FUSION_JIT_CXX) sanitizes: its checks keep loops scalar";
  // The shared object names the vector variants it calls: _ZGVdN8v_tanhf (AVX2), _ZGVeN16v_tanhf (AVX-512).
  for (const char* level : {"x86-64-v3", "x86-64-v4"}) {
    const std::string so = cpu_library_image(b.source, level);
    EXPECT_NE(so.find(std::string(level) == "x86-64-v3" ? "_ZGVdN8v_tanhf" : "_ZGVeN16v_tanhf"), std::string::npos)
        << level;
    EXPECT_EQ(so.find("expf"), std::string::npos) << level;
  }
}

TEST(Codegen, Float16RoundsLikeEager) {
  Built b = build(R"(graph(%0 : f16[4]):
  %1 : f16[4] = aten::mul.Scalar(%0, 1000.0)
  %2 : f16[4] = aten::mul.Scalar(%1, 1000.0)
  %3 : f16[4] = aten::mul.Scalar(%2, 0.0001)
  return (%3)
)");
  auto lib = compile_cpu_source(b.source);
  auto fn = reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"));
  // 1.0 * 1000 * 1000 overflows f16 (max 65504) to inf, as in eager; without rounding it would give 100.
  uint16_t in[4] = {0x3c00, 0x3c00, 0x0000, 0x3c00}, out[4];
  void* bufs[] = {in, out};
  launch_cpu_kernel(fn, bufs, nullptr, 4, 1 << 20, nullptr);
  EXPECT_EQ(out[0], 0x7c00);  // +inf
  EXPECT_EQ(out[2], 0x0000);
}

// Note [Row-invariant values]: batch_norm's alpha and beta read only the per-channel operands. Over an
// NCHW tensor they are computed once per row (a row is one channel's plane), over a channels-last one once
// per call into a table of the row's channels, and over rows longer than a table allows per element. Each
// against the formula computed here, the kernel run over two ranges that split a row (as the thread pool
// may); the element loop (after the last `omp simd`) computes alpha only in the last case.
TEST(Codegen, BatchNormsPerChannelValuesAreComputedOutsideTheElementLoop) {
  struct Case {
    const char* what;
    int64_t c, h;
    bool channels_last;
    bool table, in_loop;
  } cases[] = {
      {"NCHW", 3, 5, false, false, false},
      {"channels-last", 12, 5, true, true, false},
      {"channels-last, 3 channels (Note [Short rows])", 3, 5, true, false, true},
      {"channels-last, 5000 channels", 5000, 2, true, false, true},
  };
  for (const Case& k : cases) {
    const int64_t n = 2, c = k.c, h = k.h, w = 2, numel = n * c * h * w;
    const std::string shape = fmt::format("[{},{},{},{}]", n, c, h, w);
    const std::string strides = k.channels_last ? fmt::format("{{{},1,{},{}}}", c * h * w, w * c, c) : "";
    Built b = build(fmt::format(R"(graph(%0 : f32{0}{1}, %1 : f32[{2}], %2 : f32[{2}], %3 : f32[{2}], %4 : f32[{2}]):
  %5 : f32{0}{1} = aten::batch_norm(%0, %1, %2, %3, %4, False, 0.1, 1e-05, False)
  %6 : f32{0}{1} = aten::relu(%5)
  return (%6)
)", shape, strides, c));
    const std::string loop = b.source.substr(b.source.rfind("#pragma omp simd"));
    EXPECT_EQ(b.source.find("float h_t5_alpha[") != std::string::npos, k.table) << k.what << "\n" << b.source;
    EXPECT_EQ(loop.find("fj_bn_alpha") != std::string::npos, k.in_loop) << k.what << "\n" << b.source;
    auto lib = compile_cpu_source(b.source);
    auto fn = reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"));
    std::vector<float> x(numel), wt(c), bias(c), mean(c), var(c), out(numel);
    for (int64_t i = 0; i < numel; ++i) x[i] = std::sin(static_cast<float>(i)) * 3.0f;
    for (int64_t j = 0; j < c; ++j) {
      wt[j] = 0.5f + static_cast<float>(j % 7) * 0.25f;
      bias[j] = static_cast<float>(j % 5) - 2.0f;
      mean[j] = std::cos(static_cast<float>(j));
      var[j] = 0.1f + static_cast<float>(j % 3);
    }
    void* bufs[] = {x.data(), wt.data(), bias.data(), mean.data(), var.data(), out.data()};
    fn(bufs, nullptr, 0, 7);  // splits a row
    fn(bufs, nullptr, 7, numel);
    for (int64_t i = 0; i < numel; ++i) {
      const int64_t ch = k.channels_last ? i % c : (i / (h * w)) % c;
      const float alpha = 1.0f / std::sqrt(var[ch] + 1e-05f) * wt[ch];
      const float scaled = x[i] * alpha, beta = bias[ch] - mean[ch] * alpha, y = scaled + beta;
      // Contracted into fused multiply-adds or not, the kernel's rounding may differ from this one's.
      EXPECT_NEAR(out[i], y < 0 ? 0.0f : y, 1e-6f * (std::fabs(scaled) + std::fabs(beta) + 1.0f)) << k.what << " element " << i;
    }
  }
}

// Note [batch_norm's per-channel part in reduction kernels]: an EfficientNet block's batch_norm, SiLU and
// squeeze-and-excite mean, one reduction kernel. Its alpha and beta are computed once per row (a row is a
// channel's plane): the element loop applies them. Channels-last, the kernel walks column tiles and
// computed both per element before (a square root and a division each, efficientnet_b0's kernels 2.2x
// slower). Each against values computed here, the kernel run over two ranges of rows.
TEST(Codegen, BatchNormsPerChannelValuesInAReductionKernelAreComputedOncePerRow) {
  for (bool channels_last : {false, true}) {
    const int64_t n = 2, c = 5, h = 3, w = 4, numel = n * c * h * w;
    const std::string strides = channels_last ? fmt::format("{{{},1,{},{}}}", c * h * w, w * c, c) : "";
    Built b = build(fmt::format(R"(graph(%0 : f32[{0},{1},{2},{3}]{4}, %1 : f32[{1}], %2 : f32[{1}], %3 : f32[{1}], %4 : f32[{1}]):
  %5 : f32[{0},{1},{2},{3}]{4} = aten::batch_norm(%0, %1, %2, %3, %4, False, 0.1, 1e-05, False)
  %6 : f32[{0},{1},{2},{3}]{4} = aten::silu(%5)
  %7 : f32[{0},{1},1,1]{5} = aten::mean.dim(%6, [2, 3], True, None)
  return (%6, %7)
)", n, c, h, w, strides, channels_last ? fmt::format("{{{},1,{},{}}}", c, c, c) : ""));
    const char* what = channels_last ? "channels-last" : "NCHW";
    ASSERT_EQ(b.specs.size(), 1u) << what << "\n" << b.source;
    const std::string kernel = b.source.substr(b.source.find("void fj_kernel_0("));
    EXPECT_EQ(kernel.find("fj_batch_norm("), std::string::npos) << what << "\n" << kernel;
    const size_t alpha = kernel.find("fj_bn_alpha(");
    ASSERT_NE(alpha, std::string::npos) << what << "\n" << kernel;
    EXPECT_EQ(kernel.find("fj_bn_alpha(", alpha + 1), std::string::npos) << what << ": computed once\n" << kernel;
    EXPECT_LT(alpha, kernel.find("#pragma omp simd")) << what << ": before the element loop\n" << kernel;
    auto lib = compile_cpu_source(b.source);
    auto fn = reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"));
    std::vector<float> x(numel), wt(c), bias(c), mean(c), var(c), out(numel), avg(n * c);
    for (int64_t i = 0; i < numel; ++i) x[i] = std::sin(static_cast<float>(i)) * 3.0f;
    for (int64_t j = 0; j < c; ++j) {
      wt[j] = 0.5f + static_cast<float>(j) * 0.25f;
      bias[j] = static_cast<float>(j) - 2.0f;
      mean[j] = std::cos(static_cast<float>(j));
      var[j] = 0.1f + static_cast<float>(j % 3);
    }
    void* bufs[] = {x.data(), wt.data(), bias.data(), mean.data(), var.data(), out.data(), avg.data()};
    fn(bufs, nullptr, 0, 3);
    fn(bufs, nullptr, 3, n * c);
    std::vector<double> sums(n * c, 0.0);
    for (int64_t i = 0; i < numel; ++i) {
      const int64_t ch = channels_last ? i % c : (i / (h * w)) % c;
      const int64_t img = i / (c * h * w);
      const float alpha = 1.0f / std::sqrt(var[ch] + 1e-05f) * wt[ch];
      const float y = x[i] * alpha + (bias[ch] - mean[ch] * alpha);
      const float s = y / (1.0f + std::exp(-y));
      EXPECT_NEAR(out[i], s, 1e-5f * (std::fabs(s) + 1.0f)) << what << " element " << i;
      sums[img * c + ch] += s;
    }
    for (int64_t r = 0; r < n * c; ++r)
      EXPECT_NEAR(avg[r], sums[r] / (h * w), 1e-5) << what << " row " << r;
  }
}

// Note [Whole column tiles]: a channels-last mean over the image (a column kernel) runs whole tiles of the
// largest height of 8 to 32 rows, a multiple of 8, that divides the channels (64: 32, 48: 24, 40: 8; 5: none,
// tiles clipped at run time), each started by the range it starts in: over every split of the rows into two
// ranges, every channel's mean against values computed here.
TEST(Codegen, ColumnKernelsRunWholeTilesWhateverTheSplit) {
  for (auto [c, tile] : {std::pair<int64_t, int64_t>{64, 32}, {48, 24}, {40, 8}, {5, 0}}) {
    const int64_t n = 2, h = 3, w = 5, numel = n * c * h * w;
    Built b = build(fmt::format(R"(graph(%0 : f32[{0},{1},{2},{3}]{{{4},1,{5},{1}}}):
  %1 : f32[{0},{1},1,1]{{{1},1,{1},{1}}} = aten::mean.dim(%0, [2, 3], True, None)
  return (%1)
)",
                                n, c, h, w, c * h * w, w * c));
    ASSERT_EQ(b.specs.size(), 1u) << b.source;
    ASSERT_TRUE(b.specs[0].is_reduction() && reduction_is_column(b.specs[0])) << b.source;
    if (tile) {
      EXPECT_NE(b.source.find(fmt::format("column tiles of {} rows, whole", tile)), std::string::npos) << b.source;
      EXPECT_NE(b.source.find(fmt::format("const int n_ = {};", tile)), std::string::npos) << b.source;
    } else {
      EXPECT_NE(b.source.find("if (n_ > end_ - row0_) n_ = end_ - row0_;"), std::string::npos) << b.source;
    }
    auto lib = compile_cpu_source(b.source);
    auto fn = reinterpret_cast<CpuKernelFn>(lib->symbol("fj_kernel_0"));
    std::vector<float> x(numel);
    for (int64_t i = 0; i < numel; ++i) x[i] = std::sin(static_cast<float>(i)) * 3.0f;
    std::vector<double> want(n * c, 0.0);
    for (int64_t i = 0; i < numel; ++i) want[i / (c * h * w) * c + i % c] += x[i];
    for (int64_t split = 0; split <= n * c; ++split) {
      std::vector<float> avg(n * c, -100.0f);
      void* bufs[] = {x.data(), avg.data()};
      fn(bufs, nullptr, 0, split);
      fn(bufs, nullptr, split, n * c);
      for (int64_t r = 0; r < n * c; ++r)
        ASSERT_NEAR(avg[r], want[r] / (h * w), 1e-5) << "c " << c << ", split " << split << ", row " << r;
    }
  }
}

// Two libraries loaded one after the other are two libraries: each is loaded through an in-memory file
// whose /proc/self/fd path dlopen remembers, so a descriptor closed and reused made dlopen hand back the
// first library for the second (found by a backward graph compiled while its forward plan was alive).
TEST(Codegen, LibrariesLoadedInTurnStayDistinct) {
  auto a = compile_cpu_source("extern \"C\" int fj_only_in_a() { return 1; }\n");
  auto b = compile_cpu_source("extern \"C\" int fj_only_in_b() { return 2; }\n");
  ASSERT_NE(a.get(), b.get());
  EXPECT_EQ(reinterpret_cast<int (*)()>(a->symbol("fj_only_in_a"))(), 1);
  EXPECT_EQ(reinterpret_cast<int (*)()>(b->symbol("fj_only_in_b"))(), 2);
}

TEST(Codegen, CompilerErrorCarriesTheLog) {
  try {
    compile_cpu_source("this is not C++");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host compiler failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("error"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fusion_jit

namespace fusion_jit {
namespace {

// The plan cache: a second build of the same graph takes the plan from the kernel cache (no fusion, no
// code generation) and computes the same results. A graph of its own (a unique literal), so that the
// first build is a miss in any cache.
TEST(PlanCache, ASecondBuildOfAGraphSkipsFusionAndCodegenAndComputesTheSame) {
  const std::string salt = std::to_string(::getpid()) + "." + std::to_string(std::time(nullptr));
  const std::string ir = "graph(%0 : f32[3,5], %1 : f32[5]):\n"
                         "  %2 : f32[3,5] = aten::add.Tensor(%0, %1, 1)\n"
                         "  %3 : f32[3,5] = aten::mul.Scalar(%2, 0.5)\n"
                         "  %4 : f32[3,5] = aten::add.Scalar(%3, " + salt + ", 1)\n"
                         "  return (%4)\n";
  auto run = [&](const ExecutablePlan& p) {
    std::vector<float> x(15), bias(5), out(15);
    for (int i = 0; i < 15; ++i) x[i] = static_cast<float>(i) * 0.3f - 2.0f;
    for (int j = 0; j < 5; ++j) bias[j] = static_cast<float>(j) * 0.25f;
    EXPECT_EQ(p.kernels.size(), 1u);
    void* bufs[] = {x.data(), bias.data(), out.data()};
    p.launch(0, 0, bufs, LaunchContext{});  // 15 elements: one chunk, no parallel_for needed
    return out;
  };
  auto first = build_plan(parse_graph(ir));
  EXPECT_FALSE(first->from_plan_cache);
  auto second = build_plan(parse_graph(ir));
  ASSERT_TRUE(second->from_plan_cache) << "the plan was not found in the cache";
  EXPECT_TRUE(second->fusion.groups.empty()) << "no fusion ran";
  ASSERT_EQ(second->code.size(), 1u);
  EXPECT_EQ(second->code[0].source, first->code.at(0).source);
  EXPECT_EQ(second->num_groups, 1);
  EXPECT_EQ(second->fused_ops, 3);
  EXPECT_NE(second->explain().find("plan from the plan cache"), std::string::npos);
  EXPECT_EQ(run(*second), run(*first));
}

// Note [Plan sources stored once]: the plans of one shape class (sizes as kernel arguments) name their
// one source by its key instead of holding a copy each; a plan whose source is missing or is not the
// text its key names is a miss, built again, never read with another source.
TEST(PlanCache, PlansOfOneShapeClassShareOneStoredSource) {
  const std::string salt = std::to_string(::getpid()) + "." + std::to_string(std::time(nullptr)) + "2";
  auto ir = [&](int rows) {
    const std::string t = "f32[" + std::to_string(rows) + ",7]";
    return "graph(%0 : " + t + "):\n  %1 : " + t + " = aten::mul.Scalar(%0, " + salt + ")\n  %2 : " + t +
           " = aten::tanh(%1)\n  return (%2)\n";
  };
  PlanTarget target;
  target.size_args = true;
  auto a = build_plan(parse_graph(ir(5)), target);
  auto b = build_plan(parse_graph(ir(9)), target);
  ASSERT_FALSE(a->from_plan_cache);
  ASSERT_FALSE(b->from_plan_cache);
  const std::string source = a->code.at(0).source;
  ASSERT_EQ(b->code.at(0).source, source) << "one class, one source";
  KernelsCache& cache = KernelsCache::instance();
  const std::string ref = plan_source_key(source);
  ASSERT_EQ(cache.get(ref), source) << "the source is an entry of its own";
  auto again = build_plan(parse_graph(ir(9)), target);
  EXPECT_TRUE(again->from_plan_cache);
  EXPECT_EQ(again->code.at(0).source, source);
  // Another text under the source's key (damage, or a hostile writer): the plan is a miss and is built
  // again with its own source, which is stored again.
  cache.put(ref, "extern \"C\" void fj_not_the_source() {}\n");
  auto rebuilt = build_plan(parse_graph(ir(5)), target);
  EXPECT_FALSE(rebuilt->from_plan_cache);
  EXPECT_EQ(rebuilt->code.at(0).source, source);
  // The source gone: a miss too, not a failure.
  cache.erase(ref);
  auto missing = build_plan(parse_graph(ir(9)), target);
  EXPECT_FALSE(missing->from_plan_cache);
  EXPECT_EQ(cache.get(ref), source) << "stored again with the rebuilt plan";
  EXPECT_TRUE(build_plan(parse_graph(ir(5)), target)->from_plan_cache);
}

// Issue 13 item 8: a cached library that loads but lacks a kernel's function costs that group only: it
// runs through ATen (it used to fail the whole plan, so the signature ran eagerly).
TEST(PlanCache, ALibraryMissingAKernelFallsBackPerGroup) {
  const std::string salt = std::to_string(::getpid()) + "." + std::to_string(std::time(nullptr)) + "1";
  const std::string ir = "graph(%0 : f32[3,5]):\n"
                         "  %1 : f32[3,5] = aten::mul.Scalar(%0, " + salt + ")\n"
                         "  %2 : f32[3,5] = aten::exp(%1)\n"
                         "  return (%2)\n";
  PlanTarget sources_only;
  sources_only.compile = false;
  const std::string source = build_plan(parse_graph(ir), sources_only)->code.at(0).source;
  ASSERT_FALSE(source.empty());
  // A loadable library without the kernel, stored under the key of the plan's source.
  const std::string other = "extern \"C\" int fj_unrelated_kernel() { return 0; }\n// " + salt + "\n";
  auto other_lib = compile_cpu_source(other);
  auto image = KernelsCache::instance().get(cpu_source_cache_key(other));
  ASSERT_TRUE(image.has_value());
  KernelsCache::instance().put(cpu_source_cache_key(source), *image);
  testing::internal::CaptureStderr();
  auto plan = build_plan(parse_graph(ir));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(plan->kernels.empty());
  ASSERT_EQ(plan->fallback_groups.size(), 1u);
  EXPECT_EQ(plan->aten_ops.at("aten::exp"), 1);
  EXPECT_EQ(plan->steps.size(), 2u) << "the group's two nodes run through ATen";
  EXPECT_NE(err.find("is missing from its compiled library"), std::string::npos) << err;
  KernelsCache::instance().erase(cpu_source_cache_key(source));
}

}  // namespace
}  // namespace fusion_jit
