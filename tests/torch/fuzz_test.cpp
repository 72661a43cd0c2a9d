// The fuzzer itself: generation is deterministic and valid, repros replay, and each planted code
// generation bug is caught within a small budget.
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/import.h>

#include <cstdlib>
#include <filesystem>

#include "codegen/kernel_spec.h"
#include "fuzz/fuzzer.h"
#include "test_util.h"

namespace fusion_jit::testing {
namespace {

TEST(Fuzz, GenerationIsDeterministic) {
  for (uint64_t s : {1u, 2u, 99u}) {
    auto a = fuzz::generate(s), b = fuzz::generate(s);
    EXPECT_EQ(a.describe(), b.describe());
    EXPECT_GE(a.ops.size(), 1u);
    EXPECT_LE(a.ops.size(), 16u);
  }
  EXPECT_NE(fuzz::generate(1).describe(), fuzz::generate(2).describe());
}

TEST(Fuzz, CleanBatchPasses) {
  std::vector<fuzz::Recipe> batch;
  for (uint64_t s = 100; s < 116; ++s) batch.push_back(fuzz::generate(s));
  auto results = fuzz::check_batch(batch);
  for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(results[i].ok) << batch[i].describe() << results[i].message;
}

TEST(Fuzz, ReproIsATorchScriptModelThatReplaysEagerly) {
  auto r = fuzz::generate(7);
  auto m = script("x", "    return x");  // sets the reference executor mode
  (void)m;
  torch::jit::Module repro("FuzzRepro");
  repro.define(fuzz::torchscript_source(r));
  std::vector<c10::IValue> in;
  for (auto& t : fuzz::make_inputs(r)) in.emplace_back(t);
  auto res = run_and_compare(repro, in, r.describe());
  ASSERT_NE(res.plan, nullptr) << r.describe() << fuzz::torchscript_source(r);
  EXPECT_FALSE(res.plan->kernels.empty());
}

class PlantedBug : public ::testing::TestWithParam<int> {};

TEST_P(PlantedBug, IsCaught) {
  PlantedBugs& bugs = planted_bugs_for_tests();
  bugs = PlantedBugs{};
  const char* names[] = {"left_aligned_broadcast", "int32_always", "maximum_drops_nan", "bf16_truncates"};
  switch (GetParam()) {
    case 0: bugs.left_aligned_broadcast = true; break;
    case 1: bugs.int32_always = true; break;
    case 2: bugs.maximum_drops_nan = true; break;
    case 3: bugs.bf16_truncates = true; break;
  }
  fuzz::Options opt;
  opt.seed = 4242;
  opt.max_graphs = 1500;
  opt.stop_at_first_failure = true;
  opt.shrink = true;
  auto rep = fuzz::run(opt, nullptr);
  bugs = PlantedBugs{};
  ASSERT_FALSE(rep.failures.empty()) << names[GetParam()] << " not caught in " << rep.graphs << " graphs";
  std::printf("planted bug %s caught after %lld graphs:\n%s\n", names[GetParam()], static_cast<long long>(rep.graphs),
              rep.failures[0].c_str());
}

INSTANTIATE_TEST_SUITE_P(Fuzz, PlantedBug, ::testing::Values(0, 1, 2, 3));

}  // namespace
}  // namespace fusion_jit::testing
