// Every kernel the foundation's op corpus generates for a GPU (every op, in its first dtype and a daily
// sample of the others (sampling.h), every layout), compiled with NVRTC for sm_80 and sm_90: no error, no
// spills, no stack, and the same source on every run. No GPU needed: the corpus is captured on CPU tensors
// and the plans are moved to cuda:0. One NVRTC call per dtype and architecture, over the kernels of every
// case sampled in that dtype (NVRTC's time is about 20 ms per kernel and architecture, 900 kernels for
// float32's cases, plus a fixed cost per call that one call per case paid 240 times). A failure names the
// case and dtype; a spill names the kernel, prefixed by its case.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <future>

#include "cat_corpus.h"
#include "gather_corpus.h"
#include "op_corpus.h"
#include "reduction_corpus.h"
#include "sampling.h"
#include "support/error.h"
#include "targets/cuda/cuda_printer.h"
#include "targets/cuda/nvrtc.h"

namespace fusion_jit::testing {
namespace {

// The plan's kernels, renamed `prefix` + their name so that many plans share one source.
void append_specs(const ExecutablePlan& plan, const std::string& prefix, std::vector<KernelSpec>* specs) {
  for (const auto& k : plan.kernels) {
    KernelSpec s = k.spec;
    s.name = prefix + k.spec.name;
    specs->push_back(std::move(s));
  }
}

// Compiles the kernels as one source for sm_80 and sm_90 at once (two threads): no error, no spill, at
// most `max_registers` registers. (A stack frame without spills is allowed: sin, cos and tan keep their
// large-argument reduction's table on the stack, in eager's kernels too.)
void compile_source_for_gpus(const std::string& what, const std::string& source, size_t kernels, int max_registers) {
  auto compile_for = [&](const char* arch) -> std::shared_ptr<const CudaBinary> {
    try {
      return compile_cuda_source(source, arch);
    } catch (const Error& e) {
      ADD_FAILURE() << what << " " << arch << ": " << e.what();
      return nullptr;
    }
  };
  auto sm80 = std::async(std::launch::async, compile_for, "sm_80");
  auto sm90 = compile_for("sm_90");
  for (const auto& bin : {sm80.get(), sm90}) {
    if (!bin) continue;
    EXPECT_EQ(bin->kernels.size(), kernels) << what << " " << bin->arch;
    for (const auto& k : bin->kernels) {
      EXPECT_EQ(k.spill_stores + k.spill_loads, 0) << k.name << " " << bin->arch << " spills\n" << bin->log;
      EXPECT_LE(k.registers, max_registers) << k.name << " " << bin->arch;
    }
  }
}

void compile_for_gpus(const std::string& what, const std::vector<KernelSpec>& specs, int max_registers) {
  ASSERT_FALSE(specs.empty()) << what;
  compile_source_for_gpus(what, print_cuda_source(specs), specs.size(), max_registers);
}

class NvrtcCorpus : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(NvrtcCorpus, EveryCaseCompilesForSm80AndSm90WithoutSpills) {
  std::string why;
  ASSERT_TRUE(nvrtc_available(&why)) << why;
  const at::ScalarType t = GetParam();
  std::vector<std::shared_ptr<const ExecutablePlan>> plans;  // own the specs' graphs
  std::vector<KernelSpec> specs;
  int cases = 0;
  for (const OpCase& c : kCases) {
    const auto dtypes = sample_of(std::string("nvrtc-ops/") + c.name, dtypes_of(c.dtypes));
    if (std::find(dtypes.begin(), dtypes.end(), t) == dtypes.end()) continue;
    auto m = corpus_module(c);
    auto inputs = corpus_inputs(c, t);
    std::string what = std::string(c.name) + " " + c10::toString(t);
    auto plan = compile(m).compile_cuda(inputs, "sm_90", /*run_nvrtc=*/false);
    auto again = compile(m).compile_cuda(inputs, "sm_90", /*run_nvrtc=*/false);
    ASSERT_EQ(plan->code.size(), again->code.size()) << what;
    if (!plan->code.empty()) {
      EXPECT_EQ(plan->code[0].source, again->code[0].source) << what << ": generated source differs between runs";
    }
    if (c.ints_via_aten && at::isIntegralType(t, true)) {
      EXPECT_TRUE(plan->kernels.empty()) << what;
      continue;
    }
    if (plan->kernels.empty() && plan->explain().find("views.identity") != std::string::npos)
      continue;  // a cast to the input's own dtype is the input (OpsTest checks eager's aliasing)
    EXPECT_FALSE(plan->kernels.empty()) << what << ": no fused kernel\n" << plan->explain();
    for (const auto& k : plan->kernels) EXPECT_EQ(k.spec.device, Device::kCUDA) << what;
    append_specs(*plan, fmt::format("{}_{}_", c.name, c10::toString(t)), &specs);
    plans.push_back(std::move(plan));
    cases++;
  }
  if (!specs.empty()) compile_for_gpus(fmt::format("{} op cases in {}", cases, c10::toString(t)), specs, 64);
}

const at::ScalarType kAllDtypes[] = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong, at::kBool};
std::string dtype_name(const ::testing::TestParamInfo<at::ScalarType>& i) { return c10::toString(i.param); }

INSTANTIATE_TEST_SUITE_P(Dtypes, NvrtcCorpus, ::testing::ValuesIn(kAllDtypes), dtype_name);

}  // namespace
}  // namespace fusion_jit::testing

namespace fusion_jit::testing {
namespace {

// The comment line above each kernel of a CUDA source (its schedule), for failure messages.
std::string kernel_headers(const std::string& source) {
  std::string out;
  for (size_t at = source.find("\n// group"); at != std::string::npos; at = source.find("\n// group", at + 1))
    out += source.substr(at + 1, source.find('\n', at + 1) - at);
  return out;
}

// Note [CUDA size arguments] without a GPU: per dtype, every op case in one module and every reduction
// case in another (the modules of dynamic_corpus_test.cpp), moved to the GPU with sizes as arguments at
// sizes 13 and 15: one source for both, every kernel reading its sizes, and that source compiles for
// sm_80 and sm_90 without spills. (Sizes whose rows need another power of two of elements per thread,
// 13 and 17 where a row is 2n long, print another reduction schedule: Note [CUDA reduction schedule].)
class NvrtcDynamicCorpus : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(NvrtcDynamicCorpus, OneSourceForTwoSizesCompilesWithoutSpills) {
  std::string why;
  ASSERT_TRUE(nvrtc_available(&why)) << why;
  const at::ScalarType t = GetParam();
  CompileOptions o;
  o.dynamic = "on";
  int ops = 0, reductions = 0;
  auto op_module = all_cases_module(t, &ops);
  auto reduction_module = all_reductions_module(t, /*empty_ok=*/true, &reductions);
  const std::vector<std::pair<torch::jit::Module*, std::function<std::vector<c10::IValue>(int64_t)>>> modules = {
      {&op_module, [t](int64_t n) { return all_cases_inputs(t, n); }},
      {&reduction_module, [t](int64_t n) { return std::vector<c10::IValue>{all_reductions_input(t, n)}; }}};
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string what = fmt::format("{} {} cases", c10::toString(t), i ? reductions : ops);
    if ((i ? reductions : ops) == 0) continue;
    auto a = compile(*modules[i].first, o).compile_cuda(modules[i].second(13), "sm_90", /*run_nvrtc=*/false);
    auto b = compile(*modules[i].first, o).compile_cuda(modules[i].second(15), "sm_90", /*run_nvrtc=*/false);
    ASSERT_EQ(a->code.size(), 1u) << what << "\n" << a->explain();
    ASSERT_EQ(b->code.size(), 1u) << what;
    EXPECT_TRUE(a->code[0].source == b->code[0].source)
        << what << ": sizes 13 and 15 printed different sources; their kernels:\n" << kernel_headers(a->code[0].source)
        << "and\n" << kernel_headers(b->code[0].source);
    for (const auto& k : a->kernels) EXPECT_FALSE(k.spec.args.empty()) << what << ": " << k.spec.name << " has literal sizes";
    // One kernel may hold every op case (horizontal fusion): many registers, no spill.
    compile_source_for_gpus(what, a->code[0].source, a->kernels.size(), 255);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NvrtcDynamicCorpus, ::testing::Values(at::kFloat, at::kBFloat16, at::kInt, at::kBool),
                         [](const ::testing::TestParamInfo<at::ScalarType>& i) { return std::string(c10::toString(i.param)); });

// The reduction corpus and the patterns, likewise: every kernel compiles for sm_80 and sm_90
// without spills (one source per dtype, as NvrtcCorpus).
class NvrtcReductions : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(NvrtcReductions, EveryCaseCompilesForSm80AndSm90WithoutSpills) {
  std::string why;
  ASSERT_TRUE(nvrtc_available(&why)) << why;
  const at::ScalarType t = GetParam();
  std::vector<std::shared_ptr<const ExecutablePlan>> plans;
  std::vector<KernelSpec> specs;
  int cases = 0;
  for (const ReductionCase& c : kReductionCases) {
    const auto dtypes = sample_of(std::string("nvrtc-reductions/") + c.name, reduction_dtypes(c.dtypes));
    if (std::find(dtypes.begin(), dtypes.end(), t) == dtypes.end()) continue;
    auto ins = inputs_for(c);
    auto m = reduction_module(c, ins.size());
    auto plan = compile(m).compile_cuda(reduction_case_inputs(ins, t), "sm_90", /*run_nvrtc=*/false);
    append_specs(*plan, fmt::format("{}_{}_", c.name, c10::toString(t)), &specs);
    plans.push_back(std::move(plan));
    cases++;
  }
  if (!specs.empty()) compile_for_gpus(fmt::format("{} reduction cases in {}", cases, c10::toString(t)), specs, 128);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NvrtcReductions, ::testing::ValuesIn(kAllDtypes), dtype_name);

TEST(NvrtcReductionPatterns, EachIsOneKernelThatCompilesWithoutSpills) {
  std::string why;
  ASSERT_TRUE(nvrtc_available(&why)) << why;
  struct P {
    const char* args;
    const char* body;
    std::vector<std::vector<int64_t>> shapes;
  };
  const P patterns[] = {
      {"x, mask", "    return torch.softmax(x * 0.125 + mask, -1)", {{4096, 1024}, {4096, 1024}}},
      {"x, r, bias, w, b", "    return torch.layer_norm(x + bias + r, [x.size(-1)], w, b, 1e-5)",
       {{4096, 1024}, {4096, 1024}, {1024}, {1024}, {1024}}},
      {"x, w", "    return torch.rms_norm(x, [x.size(-1)], None, None) * w", {{4096, 1024}, {1024}}},
      {"x", "    return torch.log_softmax(x, -1)", {{4096, 1024}}},
      {"x", "    return torch.mean(x, -1), torch.var(x, -1)", {{4096, 1024}}},
      {"x", "    return torch.gelu(x).mean(-1)", {{4096, 1024}}},
      {"x", "    return torch.softmax(x, -1)", {{64, 32768}}},  // rows longer than the registers hold
      // batch_norm's per-channel arguments inside a reduction kernel (an EfficientNet block's batch_norm,
      // SiLU and squeeze-excitation mean).
      {"x, w, b, mu, var",
       "    h = torch.silu(torch.batch_norm(x, w, b, mu, var, False, 0.1, 1e-5, False))\n"
       "    return h, h.mean([2, 3], keepdim=True)",
       {{8, 96, 56, 56}, {96}, {96}, {96}, {96}}},
  };
  std::vector<std::shared_ptr<const ExecutablePlan>> plans;
  std::vector<KernelSpec> specs;
  for (at::ScalarType t : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (const auto& p : patterns) {
      auto m = script(p.args, p.body);
      std::vector<c10::IValue> inputs;
      for (const auto& s : p.shapes) inputs.emplace_back(at::randn(s).to(t));
      auto plan = compile(m).compile_cuda(inputs, "sm_90", /*run_nvrtc=*/false);
      EXPECT_EQ(plan->kernels.size(), 1u) << p.body << "\n" << plan->explain();
      append_specs(*plan, fmt::format("p{}_{}_", specs.size(), c10::toString(t)), &specs);
      plans.push_back(std::move(plan));
    }
  }
  compile_for_gpus("patterns", specs, 128);
}

// The gather corpus (Note [Gathered loads]): each case one kernel that reads the table inside it.
TEST(NvrtcGathers, EachIsOneKernelThatCompilesWithoutSpills) {
  std::string why;
  ASSERT_TRUE(nvrtc_available(&why)) << why;
  std::vector<std::shared_ptr<const ExecutablePlan>> plans;
  std::vector<KernelSpec> specs;
  for (const GatherCase& c : kGatherCases) {
    auto m = script(c.args, c.body);
    for (at::ScalarType t : gather_table_types(c)) {
      auto plan = compile(m).compile_cuda(gather_inputs(t, at::kLong), "sm_90", /*run_nvrtc=*/false);
      EXPECT_EQ(plan->kernels.size(), c.kernels) << c.name << "\n" << plan->explain();
      for (const auto& k : plan->kernels) EXPECT_TRUE(has_gathers(k.spec)) << c.name << "\n" << plan->explain();
      append_specs(*plan, fmt::format("{}_{}_", c.name, c10::toString(t)), &specs);
      plans.push_back(std::move(plan));
    }
  }
  EXPECT_NE(print_cuda_source(specs).find("fj_gather_row((long long)(p0["), std::string::npos);
  compile_for_gpus("gathers", specs, 128);
}

// The cat corpus (Note [Cats of unequal items]): each cat one kernel whose leaf pieces compile.
TEST(NvrtcCatPieces, EachCatIsOneKernelThatCompilesWithoutSpills) {
  std::string why;
  ASSERT_TRUE(nvrtc_available(&why)) << why;
  std::vector<std::shared_ptr<const ExecutablePlan>> plans;
  std::vector<KernelSpec> specs;
  for (const CatCase& c : cat_cases()) {
    auto m = script(c.args, c.body);
    std::vector<c10::IValue> in(c.inputs.begin(), c.inputs.end());
    auto plan = compile(m).compile_cuda(in, "sm_90", /*run_nvrtc=*/false);
    EXPECT_EQ(plan->kernels.size(), c.kernels) << c.name << "\n" << plan->explain();
    EXPECT_EQ(plan->aten_ops.count("aten::cat"), 0u) << c.name << "\n" << plan->explain();
    append_specs(*plan, std::string(c.name) + "_", &specs);
    plans.push_back(std::move(plan));
  }
  EXPECT_NE(print_cuda_source(specs).find("kv_cache_rotary_fj_kernel_0_leaf"), std::string::npos);
  compile_for_gpus("cat pieces", specs, 128);
}

}  // namespace
}  // namespace fusion_jit::testing
