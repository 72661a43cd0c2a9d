// The op corpus and the reduction corpus with sizes as kernel arguments (Note [Sizes as kernel
// arguments]): per dtype, one module applies every case that accepts it, compiled once with
// CompileOptions::dynamic = "on" and run at the sizes of its class (a prime, a vector-width multiple,
// and its neighbours) with no further compile, then at the sizes that are classes of their own, each
// compiled once: 0, 1, and rows further apart than int32 offsets reach (the int64 variant). Every
// result against eager by the tolerance rule, every input unchanged.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "fusion_jit/cache.h"
#include "op_corpus.h"
#include "reduction_corpus.h"
#include "test_util.h"

namespace fusion_jit::testing {
namespace {

constexpr int64_t kFar = int64_t{1} << 31;  // a dim-0 stride past the int32 index limit

// `v` copied into a view of the same sizes whose dim-0 stride is kFar elements (the others contiguous):
// its last elements lie past offset 2^31 - 1. The storage is allocated but only the view's elements are
// written, so its pages beyond them are never touched.
at::Tensor far_apart(const at::Tensor& v) {
  std::vector<int64_t> strides(v.dim(), 1);
  for (int64_t d = v.dim() - 2; d > 0; --d) strides[d] = strides[d + 1] * v.size(d + 1);
  strides[0] = kFar;
  const int64_t inner = v.numel() / v.size(0);
  at::Tensor storage = at::empty({(v.size(0) - 1) * kFar + inner}, v.options());
  at::Tensor out = storage.as_strided(v.sizes(), strides);
  out.copy_(v);
  return out;
}

struct Size {
  int64_t n;
  bool far = false;
  std::string what() const { return far ? fmt::format("{} with rows 2^31 apart", n) : std::to_string(n); }
};

// The sizes of one class (a prime, a multiple of the float32 vector width minus and plus one, a multiple),
// then three of classes of their own, as Dynamo specializes 0 and 1: an empty tensor (the kernels' loops
// are printed with their bound 0), a dim of 1 (it broadcasts: stride 0) and rows 2^31 elements apart.
const std::vector<Size> kClassSizes = {{13}, {15}, {17}, {64}};
const std::vector<Size> kOtherClasses = {{0}, {1}, {9, true}};

// Runs `m` at every size (inputs(size) makes its inputs) through one CompiledModule with sizes as
// arguments, each against eager: the sizes of kClassSizes share the first one's compiled code and
// compile nothing more; the others compile at most once each, the far one with int64 offsets. Size 0
// only `with_empty`.
void run_at_every_size(torch::jit::Module& m, const std::function<std::vector<c10::IValue>(const Size&)>& inputs,
                       const std::string& what, bool with_empty = true) {
  CompileOptions o;
  o.dynamic = "on";
  CompiledModule fused = compile(m, o);
  const int64_t before = counters().host_compiles;
  std::string code_class;
  int64_t first_compiles = 0;
  for (const Size& s : kClassSizes) {
    const std::string at = what + " at " + s.what();
    RunResult r = compare_with_eager(fused, m, inputs(s), at);
    ASSERT_NE(r.plan, nullptr) << at << " ran eagerly";
    if (code_class.empty()) {
      ASSERT_FALSE(r.plan->kernels.empty()) << at << ": no kernel\n" << r.plan->explain();
      for (const auto& k : r.plan->kernels) EXPECT_FALSE(k.spec.args.empty()) << at << ": " << k.spec.name << " has literal sizes";
      code_class = r.plan->code_class;
      first_compiles = counters().host_compiles - before;
      // One library for the plan's kernels (none where the kernel cache holds it from an earlier run).
      EXPECT_LE(first_compiles, 1) << at;
    } else {
      EXPECT_EQ(r.plan->code_class, code_class) << at << ": not the first size's code\n" << r.plan->explain();
    }
  }
  EXPECT_EQ(counters().host_compiles - before, first_compiles) << what << ": a size of the class compiled";
  for (const Size& s : kOtherClasses) {
    if (s.n == 0 && !with_empty) continue;
    const std::string at = what + " at " + s.what();
    const int64_t compiles = counters().host_compiles;
    RunResult r = compare_with_eager(fused, m, inputs(s), at);
    ASSERT_NE(r.plan, nullptr) << at << " ran eagerly";
    EXPECT_LE(counters().host_compiles - compiles, 1) << at;
    if (s.far) {
      bool int64 = false;
      for (const auto& k : r.plan->kernels) int64 |= !k.spec.index32;
      EXPECT_TRUE(int64) << at << ": no kernel with int64 offsets\n" << r.plan->explain();
    }
  }
}

std::vector<at::ScalarType> op_dtypes() { return {at::kFloat, at::kBFloat16, at::kInt, at::kBool}; }

class DynamicOpCorpus : public ::testing::TestWithParam<at::ScalarType> {};

// Every op case of the dtype (all_cases_module).
TEST_P(DynamicOpCorpus, EveryOpAtEverySizeOfItsClassThroughOneCompile) {
  const at::ScalarType t = GetParam();
  int cases = 0;
  auto m = all_cases_module(t, &cases);
  ASSERT_GT(cases, 10);
  auto inputs = [&](const Size& s) {
    std::vector<c10::IValue> in = all_cases_inputs(t, s.n);
    if (s.far)
      for (size_t x : {0, 3}) in[x] = far_apart(in[x].toTensor());
    return in;
  };
  run_at_every_size(m, inputs, fmt::format("{} op cases in {}", cases, c10::toString(t)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DynamicOpCorpus, ::testing::ValuesIn(op_dtypes()),
                         [](const ::testing::TestParamInfo<at::ScalarType>& i) { return std::string(c10::toString(i.param)); });

class DynamicReductionCorpus : public ::testing::TestWithParam<at::ScalarType> {};

// Every reduction case of the dtype (all_reductions_module); the cases that eager refuses on an empty
// reduced dim in a module of their own that skips size 0.
TEST_P(DynamicReductionCorpus, EveryReductionAtEverySizeOfItsClassThroughOneCompile) {
  const at::ScalarType t = GetParam();
  for (bool empty_ok : {true, false}) {
    int cases = 0;
    auto m = all_reductions_module(t, empty_ok, &cases);
    if (cases == 0) continue;
    auto inputs = [&](const Size& s) {
      at::Tensor x = all_reductions_input(t, s.n);
      return std::vector<c10::IValue>{s.far ? far_apart(x) : x};
    };
    const std::string what = fmt::format("{} reduction cases in {}", cases, c10::toString(t));
    // Eager refuses an empty reduced dim for the cases of the second module ("Expected reduction dim ...
    // to have non-zero size"): no size 0 there.
    run_at_every_size(m, inputs, what, empty_ok);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DynamicReductionCorpus, ::testing::Values(at::kFloat, at::kBFloat16, at::kInt),
                         [](const ::testing::TestParamInfo<at::ScalarType>& i) { return std::string(c10::toString(i.param)); });

// Note [Gathered loads] with sizes as arguments: a table whose row count changes with the call (an
// activation, not a weight) is read through the same compiled code at every row count.
TEST(DynamicGather, TablesOfEveryRowCountShareOneCompile) {
  auto m = script("x, idx, idx2", "    return (torch.embedding(x, idx) * 2.0, torch.gather(x, 0, idx2) - 1.0)");
  CompileOptions o;
  o.dynamic = "on";
  CompiledModule fused = compile(m, o);
  const int64_t before = counters().host_compiles;
  std::string code_class;
  for (int64_t n : {13, 15, 17, 64}) {
    at::manual_seed(n);
    std::vector<c10::IValue> in{at::randn({n, 8}), at::randint(0, n, {5, 3}), at::randint(0, n, {4, 8})};
    RunResult r = compare_with_eager(fused, m, in, fmt::format("{} rows", n));
    ASSERT_NE(r.plan, nullptr);
    ASSERT_EQ(r.plan->kernels.size(), 2u) << r.plan->explain();  // each gather inside its consumer's kernel
    if (code_class.empty()) code_class = r.plan->code_class;
    EXPECT_EQ(r.plan->code_class, code_class) << n << " rows\n" << r.plan->explain();
  }
  EXPECT_LE(counters().host_compiles - before, 1);
}

// The class of Note [Plans of a shape class]'s tests, and its eager reference at one size.
const std::string kClassIr =
    "graph[s0=37](%0 : f32[2,s0,64], %1 : f32[64], %w : f32[64,64]):\n"
    "  %2 : f32[2,s0,64] = aten::add.Tensor(%0, %1, 1)\n"
    "  %3 : f32[2,s0,64] = aten::relu(%2)\n"
    "  %4 : f32[2,s0] = aten::sum.dim_IntList(%3, [2], False, None)\n"
    "  %5 : f32[2,s0,64] = aten::softmax.int(%3, 2, None)\n"
    "  %6 : f32[2,s0,64] = aten::matmul(%5, %w)\n"
    "  %7 : f32[2,s0,64] = aten::tanh(%6)\n"
    "  %8 : Tensor[] = prim::ListConstruct(%7, %5)\n"
    "  %9 : f32[2,2*s0,64] = aten::cat(%8, 1)\n"
    "  %10 : f32[2,2*s0,64] = aten::sigmoid(%9)\n"
    "  %11 : f32[2,s0,4,16] = aten::view(%7, [2, s0, 4, 16])\n"
    "  %12 : f32[2,4,s0,16]{64*s0,16,64,1} = aten::transpose.int(%11, 1, 2)\n"
    "  %13 : f32[2,4,s0,16] = aten::exp(%12)\n"
    "  %14 : f32[2,4,s0-1,16]{64*s0-64,16*s0-16,16,1} = aten::slice.Tensor(%13, 2, 1, s0, 1)\n"
    "  %15 : f32[2,4,s0-1,16] = aten::neg(%14)\n"
    "  return (%4, %10, %15)\n";

std::vector<at::Tensor> class_eager(const at::Tensor& x, const at::Tensor& b, const at::Tensor& w) {
  const int64_t n = x.size(1);
  const at::Tensor r = at::relu(x + b), s = at::softmax(r, 2), t = at::tanh(at::matmul(s, w));
  return std::vector<at::Tensor>{r.sum({2}), at::sigmoid(at::cat({t, s}, 1)),
                                 -at::exp(t.view({2, n, 4, 16}).transpose(1, 2)).slice(2, 1, n, 1)};
}

// Note [Plans of a shape class]: a graph of a shape class given to GraphFunction::add_from_class builds
// one plan, with one compile; every other size of the class is an instance of it (no compile, no passes),
// each against eager. Sizes outside the class (below 2, or where a guard of the plan fails) add nothing,
// and an input laid out otherwise than the class says is a TypeError that adds nothing either.
TEST(ShapeClass, EverySizeIsAnInstanceOfOnePlan) {
  const std::string& ir = kClassIr;
  const at::Tensor b = at::randn({64}), w = at::randn({64, 64}) * 0.2;
  auto eager = [&](const at::Tensor& x) { return class_eager(x, b, w); };
  GraphFunction f("class");
  const int64_t before = counters().host_compiles;
  int64_t built = -1;
  for (int64_t n : {16, 5, 37, 63, 300, 3}) {
    const std::string at = fmt::format("s0 = {}", n);
    const at::Tensor x = at::randn({2, n, 64});
    std::vector<at::Tensor> outs;
    GraphPlanInfo info = f.add_from_class({x, b, w}, "", ir, {{"s0", n}}, {}, &outs);
    ASSERT_EQ(info.outside_class, "") << at;
    ASSERT_TRUE(info.compiled && info.added_here) << at;
    EXPECT_EQ(info.class_built_here, built < 0) << at;
    if (built < 0) built = counters().host_compiles - before;
    const std::vector<at::Tensor> want = eager(x);
    ASSERT_EQ(outs.size(), want.size()) << at;
    // Values only: the graph's types, not this hand-written eager, say the outputs' layouts.
    auto close = [&](size_t i) { return check_close(outs[i], want[i], std::nullopt, /*check_strides=*/false); };
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(close(i).ok) << at << ", output " << i << ": " << close(i).message;
    // Later calls of the signature run the instance.
    ASSERT_EQ(f.run({x, b, w}, "", &outs), GraphFunction::Status::kRan) << at;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(close(i).ok) << at << ", output " << i;
    const std::string explained = f.explain({x, b, w}, "");
    EXPECT_NE(explained.find("the class's plan at " + at.substr(0, 2) + "=" + std::to_string(n)), std::string::npos)
        << explained;
  }
  EXPECT_LE(built, 1) << "the class's one library (none where the kernel cache holds it)";
  EXPECT_EQ(counters().host_compiles - before, built) << "an instance compiled";
  EXPECT_EQ(f.num_classes(), 1);
  EXPECT_EQ(f.num_plans(), 6);
  // Outside the class: s0 = 1 is a class of its own; at s0 = 2 the slice is one long, a dim that merges
  // away (another source), a guard of the class's plan.
  for (int64_t n : {1, 2}) {
    std::vector<at::Tensor> outs;
    GraphPlanInfo info = f.add_from_class({at::randn({2, n, 64}), b, w}, "", ir, {{"s0", n}}, {}, &outs);
    EXPECT_NE(info.outside_class, "") << n;
    EXPECT_FALSE(info.compiled) << n;
    EXPECT_TRUE(outs.empty());
  }
  EXPECT_EQ(f.num_plans(), 6);
  // An input of the class's sizes but another layout.
  std::vector<at::Tensor> outs;
  const at::Tensor strided = at::randn({2, 64, 7}).transpose(1, 2);
  EXPECT_THROW(f.add_from_class({strided, b, w}, "", ir, {{"s0", 7}}, {}, &outs), TypeError);
  EXPECT_EQ(f.num_plans(), 6);
}


// Serving a shape class from many threads: four threads add and run sizes of one class at once (each
// thread its own sizes, two threads sharing one), each result eager's; the class's plan is built once
// or, where two threads build it at the same time, one build is kept, and its code compiles once.
TEST(ShapeClass, ThreadsAddingSizesOfOneClassAtOnceGetEagersResults) {
  const at::Tensor b = at::randn({64}), w = at::randn({64, 64}) * 0.2;
  GraphFunction f("class_threads");
  const int64_t before = counters().host_compiles;
  std::atomic<int> ok{0}, wrong{0};
  std::vector<std::thread> threads;
  const std::vector<std::vector<int64_t>> sizes = {{16, 5, 40}, {37, 63, 9}, {21, 5, 33}, {7, 100, 12}};
  for (const auto& mine : sizes)
    threads.emplace_back([&, mine] {
      for (int round = 0; round < 2; ++round)
        for (int64_t n : mine) {
          const at::Tensor x = at::randn({2, n, 64});
          std::vector<at::Tensor> outs;
          GraphPlanInfo info = f.add_from_class({x, b, w}, "", kClassIr, {{"s0", n}}, {}, &outs);
          if (!info.outside_class.empty() || !info.compiled ||
              (outs.empty() && f.run({x, b, w}, "", &outs) != GraphFunction::Status::kRan)) {
            ++wrong;
            continue;
          }
          const std::vector<at::Tensor> want = class_eager(x, b, w);
          bool same = outs.size() == want.size();
          for (size_t i = 0; same && i < want.size(); ++i)
            same = check_close(outs[i], want[i], std::nullopt, /*check_strides=*/false).ok;
          ++(same ? ok : wrong);
        }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(ok.load(), 24);
  EXPECT_EQ(f.num_classes(), 1);
  EXPECT_EQ(f.num_plans(), 11);  // the distinct sizes
  EXPECT_LE(counters().host_compiles - before, 1);
}

// Note [Symbolic sizes in the plan cache]: the class's plan, once built, is in the plan cache; another
// function (a restarted process's) whose first size of the class is another reads it there (no fusion,
// no code generation, no compile) and serves every size of the class from it, each against eager.
TEST(ShapeClass, AWarmStartReadsTheClassPlanFromThePlanCache) {
  const at::Tensor b = at::randn({64}), w = at::randn({64, 64}) * 0.2;
  {
    GraphFunction first("class");
    std::vector<at::Tensor> outs;
    ASSERT_EQ(first.add_from_class({at::randn({2, 16, 64}), b, w}, "", kClassIr, {{"s0", 16}}, {}, &outs).outside_class, "");
  }
  // The same class first seen at another size: its hint is 50 where it was 37.
  std::string at50 = kClassIr;
  at50.replace(at50.find("s0=37"), 5, "s0=50");
  GraphFunction warm("class");
  const int64_t before = counters().host_compiles;
  for (int64_t n : {50, 7, 200}) {
    const at::Tensor x = at::randn({2, n, 64});
    std::vector<at::Tensor> outs;
    GraphPlanInfo info = warm.add_from_class({x, b, w}, "", at50, {{"s0", n}}, {}, &outs);
    ASSERT_EQ(info.outside_class, "") << n;
    const std::string explained = warm.explain({x, b, w}, "");
    EXPECT_NE(explained.find("(plan from the plan cache"), std::string::npos) << explained;
    const std::vector<at::Tensor> want = class_eager(x, b, w);
    ASSERT_EQ(outs.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      auto c = check_close(outs[i], want[i], std::nullopt, /*check_strides=*/false);
      EXPECT_TRUE(c.ok) << "s0 = " << n << ", output " << i << ": " << c.message;
    }
  }
  EXPECT_EQ(counters().host_compiles, before) << "a warm start compiled";
  EXPECT_EQ(warm.num_classes(), 1);
}

}  // namespace
}  // namespace fusion_jit::testing
