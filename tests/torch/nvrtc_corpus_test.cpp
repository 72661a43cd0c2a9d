// Every kernel the foundation's op corpus generates for a GPU (every op, every dtype it accepts, every
// layout), compiled with NVRTC for sm_80 and sm_90: no error, no spills, no stack, and the same source
// on every run. No GPU needed: the corpus is captured on CPU tensors and the plans are moved to cuda:0.
// One NVRTC call per op and architecture, over all its dtypes' kernels.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <future>

#include "codegen/cuda_printer.h"
#include "compile/nvrtc.h"
#include "support/error.h"
#include "op_corpus.h"

namespace fusion_jit::testing {
namespace {

class NvrtcCorpus : public ::testing::TestWithParam<OpCase> {};

TEST_P(NvrtcCorpus, CompilesForSm80AndSm90WithoutSpills) {
  std::string why;
  ASSERT_TRUE(nvrtc_available(&why)) << why;
  const OpCase& c = GetParam();
  auto m = corpus_module(c);
  std::vector<std::shared_ptr<const ExecutablePlan>> plans;  // own the specs' graphs
  std::vector<KernelSpec> specs;
  for (at::ScalarType t : dtypes_of(c.dtypes)) {
    auto inputs = corpus_inputs(c, t);
    std::string what = std::string(c.name) + " " + c10::toString(t);
    auto plan = compile(m).compile_cuda(inputs, "sm_90", /*run_nvrtc=*/false);
    auto again = compile(m).compile_cuda(inputs, "sm_90", /*run_nvrtc=*/false);
    EXPECT_EQ(plan->cuda_source, again->cuda_source) << what << ": generated source differs between runs";
    if (c.ints_via_aten && at::isIntegralType(t, true)) {
      EXPECT_TRUE(plan->kernels.empty()) << what;
      continue;
    }
    EXPECT_FALSE(plan->kernels.empty()) << what << ": no fused kernel\n" << plan->explain();
    for (const auto& k : plan->kernels) {
      EXPECT_EQ(k.spec.device, Device::kCUDA) << what;
      KernelSpec s = k.spec;
      s.name = fmt::format("{}_{}_{}", c.name, c10::toString(t), k.spec.name);
      specs.push_back(std::move(s));
    }
    plans.push_back(std::move(plan));
  }
  if (specs.empty()) return;
  std::string source = print_cuda_source(specs);
  // Both architectures at once, on two threads.
  auto compile_for = [&](const char* arch) -> std::shared_ptr<const CudaBinary> {
    try {
      return compile_cuda_source(source, arch);
    } catch (const Error& e) {
      ADD_FAILURE() << c.name << " " << arch << ": " << e.what();
      return nullptr;
    }
  };
  auto sm80 = std::async(std::launch::async, compile_for, "sm_80");
  auto sm90 = compile_for("sm_90");
  for (const auto& bin : {sm80.get(), sm90}) {
    if (!bin) continue;
    EXPECT_EQ(bin->kernels.size(), specs.size()) << c.name << " " << bin->arch;
    for (const auto& k : bin->kernels) {
      EXPECT_EQ(k.spill_stores + k.spill_loads, 0) << k.name << " " << bin->arch << " spills\n" << bin->log;
      // (A stack frame without spills is allowed: sin, cos and tan keep their large-argument reduction's
      // table on the stack, in eager's kernels too.)
      EXPECT_LE(k.registers, 64) << k.name << " " << bin->arch;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, NvrtcCorpus, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace fusion_jit::testing
