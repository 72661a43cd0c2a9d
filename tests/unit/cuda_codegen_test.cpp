// CUDA code generation and NVRTC without a GPU: kernels printed for graphs on cuda:0, compiled for the
// architectures we ship for, with ptxas's report parsed; the Driver API's absence reported clearly.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <regex>

#include "codegen/lowering.h"
#include "driver/build_plan.h"
#include "targets/cuda/cuda_driver.h"
#include "targets/cuda/cuda_printer.h"
#include "targets/cuda/nvrtc.h"
#include "targets/targets.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

std::vector<KernelSpec> cuda_specs(const std::string& ir) {
  auto g = parse_graph(ir);
  verify_graph(*g);
  set_device(*g, Device::kCUDA, 0);
  verify_graph(*g);
  RooflineCostModel cost(cuda_gpu_description());
  FusionPlan plan = plan_fusion(*g, cost);
  std::vector<KernelSpec> specs;
  for (const auto& grp : plan.groups) specs.push_back(make_kernel_spec(grp, target_for(Device::kCUDA)));
  static std::vector<std::unique_ptr<Graph>> keep;  // specs point into the graph
  keep.push_back(std::move(g));
  return specs;
}

const char* kChain = R"(graph(%0 : f32[64,256], %1 : f32[256], %2 : f16[64,256]):
  %3 : f32[64,256] = aten::add.Tensor(%0, %1, 1)
  %4 : f32[64,256] = aten::mul.Tensor(%3, %2)
  %5 : f32[64,256] = aten::maximum(%4, %0)
  %6 : f32[64,256] = aten::sigmoid(%5)
  return (%6)
)";

TEST(CudaCodegen, VectorWidthFollowsLayoutAndDtype) {
  auto k = cuda_specs(kChain);
  ASSERT_EQ(k.size(), 1u);
  EXPECT_EQ(k[0].device, Device::kCUDA);
  EXPECT_EQ(cuda_vector_width(k[0]), 4);  // f32 is the widest contiguous buffer: 16 bytes = 4 elements
  EXPECT_EQ(cuda_work_items(k[0]), 64 * 256 / 4);
  auto h = cuda_specs(R"(graph(%0 : f16[4096]):
  %1 : f16[4096] = aten::relu(%0)
  %2 : f16[4096] = aten::neg(%1)
  return (%2)
)");
  EXPECT_EQ(cuda_vector_width(h[0]), 8);
  auto t = cuda_specs(R"(graph(%0 : f32[64,32]{1,64}, %1 : f32[64,32]):
  %2 : f32[64,32] = aten::mul.Tensor(%0, %1)
  %3 : f32[64,32] = aten::exp(%2)
  return (%3)
)");
  EXPECT_EQ(cuda_vector_width(t[0]), 1) << "a transposed input has no vector path";
  auto odd = cuda_specs(R"(graph(%0 : f32[5,7], %1 : f32[7]):
  %2 : f32[5,7] = aten::mul.Tensor(%0, %1)
  %3 : f32[5,7] = aten::exp(%2)
  return (%3)
)");
  EXPECT_EQ(cuda_vector_width(odd[0]), 1) << "rows of 7 do not start on vector boundaries";
}

TEST(CudaCodegen, SourceIsDeterministicAndOnlyIncludesHalfHeadersWhenNeeded) {
  std::string a = print_cuda_source(cuda_specs(kChain));
  std::string b = print_cuda_source(cuda_specs(kChain));
  EXPECT_EQ(a, b);
  EXPECT_NE(a.find("#include <cuda_fp16.h>"), std::string::npos);
  EXPECT_NE(a.find("extern \"C\" __global__ void __launch_bounds__(256, 1) fj_kernel_0("), std::string::npos) << a;
  std::string f32 = print_cuda_source(cuda_specs(R"(graph(%0 : f32[100]):
  %1 : f32[100] = aten::relu(%0)
  %2 : f32[100] = aten::neg(%1)
  return (%2)
)"));
  EXPECT_EQ(f32.find("cuda_fp16.h"), std::string::npos);
}

TEST(Nvrtc, CompilesForSm80AndSm90WithoutSpills) {
  std::string why;
  ASSERT_TRUE(nvrtc_available(&why)) << why;
  std::string src = print_cuda_source(cuda_specs(kChain));
  for (const char* arch : {"sm_80", "sm_90"}) {
    auto bin = compile_cuda_source(src, arch);
    EXPECT_FALSE(bin->is_ptx);
    EXPECT_GT(bin->image.size(), 1000u);
    ASSERT_EQ(bin->kernels.size(), 1u) << bin->log;
    const CudaKernelInfo& k = bin->kernels[0];
    EXPECT_EQ(k.name, "fj_kernel_0");
    EXPECT_GT(k.registers, 0) << bin->log;
    EXPECT_EQ(k.spill_stores, 0) << bin->log;
    EXPECT_EQ(k.spill_loads, 0) << bin->log;
    EXPECT_EQ(compile_cuda_source(src, arch), bin) << "the same source is compiled once per process";
  }
  auto ptx = compile_cuda_source(src, "compute_90");
  EXPECT_TRUE(ptx->is_ptx);
  EXPECT_NE(ptx->image.find(".entry fj_kernel_0"), std::string::npos);
}

// What auto mode asks before taking size-argument code for a first signature (Target::compiled): a
// source is known compiled once NVRTC made it (memory, then the kernel cache), not before.
TEST(Nvrtc, KnowsWhichSourcesAreCompiled) {
  ASSERT_TRUE(nvrtc_available());
  auto specs = cuda_specs(R"(graph(%0 : f32[9,40]):
  %1 : f32[9,40] = aten::exp(%0)
  %2 : f32[9,40] = aten::mul.Tensor(%1, %0)
  return (%2)
)");
  // A comment no earlier run wrote, so that no kernel cache holds this source yet.
  const std::string src = print_cuda_source(specs, /*size_args=*/true) +
                          fmt::format("// {}\n", std::chrono::system_clock::now().time_since_epoch().count());
  EXPECT_FALSE(cuda_source_compiled(src, "sm_90"));
  auto bin = compile_cuda_source(src, "sm_90");
  EXPECT_TRUE(cuda_source_compiled(src, "sm_90"));
  EXPECT_FALSE(cuda_source_compiled(src, "sm_80")) << "compiled for sm_90 only";
}

TEST(Nvrtc, ArchitecturesAreCheckedAndChosen) {
  ASSERT_TRUE(nvrtc_available());
  EXPECT_EQ(cuda_arch_for(9, 0), "sm_90");
  EXPECT_EQ(cuda_arch_for(8, 0), "sm_80");
  auto archs = nvrtc_supported_archs();
  ASSERT_FALSE(archs.empty());
  EXPECT_EQ(cuda_arch_for(99, 0), "compute_" + std::to_string(archs.back())) << "newer GPUs get PTX";
  EXPECT_THROW(cuda_arch_for(3, 0), Error);
  try {
    check_cuda_arch("sm_70");
    ADD_FAILURE() << "sm_70 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm_70"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sm_90"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_cuda_arch("volta"), Error);
}

// Where a packaged CUBIN or PTX runs (Note [Packaged binaries]): a CUBIN on its major version from its
// minor on, PTX on every newer GPU whose driver reads the NVRTC's PTX.
TEST(Nvrtc, PackagedBinariesRunOnlyWhereTheirArchitectureAndDriverAllow) {
  EXPECT_EQ(cuda_binary_cannot_run("sm_80", 13000, 8, 0, 13000), "");
  EXPECT_EQ(cuda_binary_cannot_run("sm_80", 13000, 8, 6, 13000), "");
  EXPECT_EQ(cuda_binary_cannot_run("sm_90", 13000, 9, 0, 13010), "");
  EXPECT_EQ(cuda_binary_cannot_run("sm_80", 13000, 9, 0, 13000),
            "a CUBIN for sm_80 runs on GPUs of compute capability 8.0 to 8.9; this GPU is of compute capability 9.0");
  EXPECT_NE(cuda_binary_cannot_run("sm_86", 13000, 8, 0, 13000).find("8.6 to 8.9"), std::string::npos);
  EXPECT_NE(cuda_binary_cannot_run("sm_90", 13000, 10, 0, 13000), "");
  EXPECT_EQ(cuda_binary_cannot_run("compute_90", 13000, 10, 0, 13000), "");
  EXPECT_EQ(cuda_binary_cannot_run("compute_90", 13000, 12, 0, 13020), "");
  EXPECT_EQ(cuda_binary_cannot_run("compute_90", 13000, 8, 9, 13000),
            "PTX for compute_90 needs compute capability 9.0 or newer; this GPU is of compute capability 8.9");
  EXPECT_EQ(cuda_binary_cannot_run("compute_90", 13000, 10, 0, 12080),
            "PTX from NVRTC 13.0 needs a driver for CUDA 13.0 or newer; this one supports CUDA 12.8");
  EXPECT_NE(cuda_binary_cannot_run("volta", 13000, 9, 0, 13000).find("not a CUDA architecture"), std::string::npos);
}

TEST(Nvrtc, CompileErrorCarriesTheLog) {
  ASSERT_TRUE(nvrtc_available());
  try {
    compile_cuda_source("extern \"C\" __global__ void k() { undeclared_thing(); }", "sm_90");
    ADD_FAILURE() << "bad source compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("undeclared_thing"), std::string::npos) << e.what();
  }
}

TEST(Nvrtc, ParsesPtxasReport) {
  const char* log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'fj_kernel_0' for 'sm_90'\n"
      "ptxas info    : Function properties for fj_kernel_0\n"
      "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 17 registers, used 0 barriers, 8 bytes stack frame, 64 bytes smem, 392 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'fj_kernel_1' for 'sm_90'\n"
      "ptxas info    : Function properties for fj_kernel_1\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 9 registers, used 0 barriers, 368 bytes cmem[0]\n";
  auto ks = parse_ptxas_report(log);
  ASSERT_EQ(ks.size(), 2u);
  EXPECT_EQ(ks[0].name, "fj_kernel_0");
  EXPECT_EQ(ks[0].registers, 17);
  EXPECT_EQ(ks[0].stack_bytes, 8);
  EXPECT_EQ(ks[0].spill_stores, 4);
  EXPECT_EQ(ks[0].spill_loads, 12);
  EXPECT_EQ(ks[0].shared_bytes, 64);
  EXPECT_EQ(ks[1].registers, 9);
  EXPECT_EQ(ks[1].spill_loads, 0);
}

// Note [CUDA size arguments]: printed with sizes as arguments, graphs of every kernel kind (a broadcast
// chain with a softmax written out, a column sum, a cat of unequal items, an embedding read in its
// consumer) give one CUDA source for every size of their class, no number of the size in the text, the
// values recorded per size; NVRTC compiles that source for sm_80 and sm_90 without spills. Printed with
// literals, the sizes give different sources.
TEST(CudaCodegen, SizesAsArgumentsGiveOneSourceForEverySize) {
  const std::vector<std::pair<const char*, const char*>> graphs = {
      {"softmax", R"(graph(%0 : f32[{0},{1}], %1 : f32[{1}]):
  %2 : f32[{0},{1}] = aten::add.Tensor(%0, %1, 1)
  %3 : f32[{0},{1}] = aten::maximum(%2, %0)
  %4 : f32[{0},1] = aten::amax(%3, [1], True)
  %5 : f32[{0},{1}] = aten::sub.Tensor(%3, %4, 1)
  %6 : f32[{0},{1}] = aten::exp(%5)
  %7 : f32[{0},1] = aten::sum.dim_IntList(%6, [1], True, None)
  %8 : f32[{0},{1}] = aten::div.Tensor(%6, %7)
  %9 : f32[{0},{1}] = aten::mean.dim(%3, [1], True, None)
  return (%3, %8, %9)
)"},
      {"column sum", R"(graph(%0 : f32[{1},{0}]):
  %1 : f32[{1},{0}] = aten::exp(%0)
  %2 : f32[{0}] = aten::sum.dim_IntList(%1, [0], False, None)
  return (%2)
)"},
      {"cat pieces", R"(graph(%0 : f32[2,{0},{1}], %1 : f32[2,3,{1}]):
  %2 : f32[2,3,{1}] = aten::exp(%1)
  %3 : Tensor[] = prim::ListConstruct(%0, %2)
  %4 : f32[2,{2},{1}] = aten::cat(%3, 1)
  return (%4)
)"},
      {"embedding", R"(graph(%0 : f32[{0},{1}], %1 : i64[3,{0}], %2 : f32[3,{0},{1}]):
  %3 : f32[3,{0},{1}] = aten::embedding(%0, %1, -1, False, False)
  %4 : f32[3,{0},{1}] = aten::mul.Tensor(%3, %2)
  return (%4)
)"}};
  // Sizes of one class: the same vector width (columns a multiple of 4), threads per row (rows of at most
  // 512) and elements per thread (5 to 8 rounded up to 8 in the column sum).
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{13, 40}, {17, 48}, {29, 64}};
  for (const auto& [what, graph] : graphs) {
    std::string source, literal;
    std::vector<std::vector<int64_t>> args;
    for (auto [a, b] : sizes) {
      const std::string ir = fmt::format(fmt::runtime(graph), a, b, a + 3);  // {2}: the cat's extent
      const std::string at = fmt::format("{} at {}, {}", what, a, b);
      auto specs = cuda_specs(ir);
      ASSERT_FALSE(specs.empty()) << at;
      const std::string lit = print_cuda_source(specs);
      const std::string src = print_cuda_source(specs, /*size_args=*/true);
      for (const auto& k : specs) EXPECT_FALSE(k.args.empty()) << at << ": " << k.name;
      for (int64_t n : {a, b, a * b}) {
        const std::string number = fmt::format("[^0-9a-z_]{}[^0-9]", n);
        EXPECT_FALSE(std::regex_search(src.substr(src.find("fj_kernel_0")), std::regex(number)))
            << at << ": " << n << " printed as a literal\n" << src.substr(src.find("fj_kernel_0"));
      }
      if (source.empty()) {
        source = src;
        literal = lit;
      } else {
        EXPECT_TRUE(src == source) << at << ": another size printed another source:\n"
                               << src.substr(src.find("fj_kernel_0"));
        EXPECT_TRUE(lit != literal) << at << ": literal sizes print the same source";
      }
      args.push_back(specs[0].args);
      print_cuda_source(specs, /*size_args=*/false);
      for (const auto& k : specs) EXPECT_TRUE(k.args.empty()) << at << ": printed with literals, args stay";
    }
    EXPECT_NE(args[0], args[1]) << what;
    for (const char* arch : {"sm_80", "sm_90"}) {
      auto bin = compile_cuda_source(source, arch);
      ASSERT_FALSE(bin->kernels.empty()) << what << " " << arch << "\n" << bin->log;
      for (const auto& k : bin->kernels)
        EXPECT_EQ(k.spill_stores + k.spill_loads, 0) << what << " " << arch << " " << k.name << "\n" << bin->log;
    }
  }
}

// Note [Row loops with sizes as arguments] and Note [Variance of a row in registers]: a row kept in
// registers loops unguarded where the thread's last element lies in the row (only when the row length is
// an argument: a literal's guard folds away), and its var is two sums, with no per-element division;
// a row read per pass keeps Welford's update. Compiled with NVRTC without spills.
TEST(CudaCodegen, RowsInRegistersLoopUnguardedAndTakeVarAsTwoSums) {
  const char* graph = R"(graph(%0 : f32[64,{0}]):
  %1 : f32[64] = aten::mean.dim(%0, [1], False, None)
  %2 : f32[64] = aten::var.correction(%0, [1], 1, False)
  return (%1, %2)
)";
  auto in_registers = cuda_specs(fmt::format(fmt::runtime(graph), 1024));
  ASSERT_EQ(in_registers.size(), 1u);
  const std::string dynamic = print_cuda_source(in_registers, /*size_args=*/true);
  const std::string literal = print_cuda_source(in_registers, /*size_args=*/false);
  for (const std::string* src : {&dynamic, &literal}) {
    const std::string body = src->substr(src->find("fj_kernel_0"));
    EXPECT_EQ(body.find("fj_wf<float> w"), std::string::npos) << body;  // no Welford accumulator
    EXPECT_NE(body.find("q1 += d_ * d_"), std::string::npos) << body;  // the squared deviations' sum
  }
  EXPECT_NE(dynamic.find("const bool full_ = active_ && lane_ + 768 < (long long)L_;"), std::string::npos) << dynamic;
  EXPECT_NE(dynamic.find("if (full_) {"), std::string::npos) << dynamic;
  EXPECT_EQ(literal.find("full_"), std::string::npos) << literal;
  // Rows of 8192 elements: 32 per thread, more than a thread keeps; read per pass, Welford's update.
  auto per_pass = cuda_specs(fmt::format(fmt::runtime(graph), 8192));
  const std::string long_rows = print_cuda_source(per_pass, /*size_args=*/true);
  EXPECT_NE(long_rows.find("w1.mean += d_ / w1.n"), std::string::npos) << long_rows;
  EXPECT_EQ(long_rows.find("full_"), std::string::npos) << long_rows;
  for (const std::string* src : {&dynamic, &literal, &long_rows}) {
    auto bin = compile_cuda_source(*src, "sm_90");
    ASSERT_FALSE(bin->kernels.empty()) << bin->log;
    for (const auto& k : bin->kernels) EXPECT_EQ(k.spill_stores + k.spill_loads, 0) << k.name << "\n" << bin->log;
  }
}

// Note [Values kept in registers between passes]: layer norm of x + residual + bias keeps the sum for its
// second pass, not the three buffers it is made of, and reads the bias (the same for every row) again;
// with sizes as arguments NVRTC gives the kernel no more registers than with literal sizes (53 against
// 40 before).
TEST(CudaCodegen, ReductionPassesKeepTheSumNotItsBuffers) {
  auto specs = cuda_specs(R"(graph(%0 : f32[64,1024], %1 : f32[64,1024], %2 : f32[1024], %3 : f32[1024]):
  %4 : f32[64,1024] = aten::add.Tensor(%0, %2, 1)
  %5 : f32[64,1024] = aten::add.Tensor(%4, %1, 1)
  %6 : f32[64,1] = aten::mean.dim(%5, [1], True, None)
  %7 : f32[64,1] = aten::var.correction(%5, [1], 0.0, True)
  %8 : f32[64,1] = aten::add.Scalar(%7, 1e-05, 1)
  %9 : f32[64,1] = aten::rsqrt(%8)
  %10 : f32[64,1024] = aten::sub.Tensor(%5, %6, 1)
  %11 : f32[64,1024] = aten::mul.Tensor(%10, %9)
  %12 : f32[64,1024] = aten::mul.Tensor(%11, %3)
  %13 : f32[64,1024] = aten::add.Tensor(%12, %2, 1)
  return (%13)
)");
  ASSERT_EQ(specs.size(), 1u);
  const KernelSpec& k = specs[0];
  ASSERT_EQ(k.passes.size(), 2u);
  ASSERT_EQ(k.scratch.size(), 1u);  // x + residual + bias
  EXPECT_EQ(k.passes[0].stash_out, std::vector<std::string>{k.scratch[0].first});
  EXPECT_EQ(k.passes[1].stash_in, std::vector<std::string>{k.scratch[0].first});
  int regs[2] = {0, 0};
  for (bool size_args : {false, true}) {
    const std::string src = print_cuda_source(specs, size_args);
    const std::string body = src.substr(src.find("fj_kernel_0"));
    EXPECT_EQ(body.find(" rc"), std::string::npos) << "no element buffer kept between passes\n" << body;
    EXPECT_NE(body.find("sr_" + k.scratch[0].first + "[4]"), std::string::npos) << body;
    auto bin = compile_cuda_source(src, "sm_90");
    ASSERT_EQ(bin->kernels.size(), 1u) << bin->log;
    EXPECT_EQ(bin->kernels[0].spill_stores + bin->kernels[0].spill_loads, 0) << bin->log;
    regs[size_args] = bin->kernels[0].registers;
  }
  EXPECT_LE(regs[1], regs[0]) << "sizes as arguments take more registers than literal sizes";
}

// Note [Run-time dividers]: the magic number and shift of every divisor give n / d exactly for every int32
// index n: small divisors, powers of two and their neighbours, and the largest ones, each against indices
// at the edges (0, d - 1, d, d + 1, multiples, 2^31 - 1) and spread over the range.
TEST(CudaCodegen, RunTimeDividersAreExact) {
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= 2048; ++d) divisors.push_back(d);
  for (int p = 11; p <= 31; ++p)
    for (int64_t e : {-3, -1, 0, 1, 3}) divisors.push_back((int64_t{1} << p) + e);
  for (int64_t d = 2049; d < INT32_MAX; d = d * 7 / 3 + 11) divisors.push_back(d);
  const int64_t max_n = INT32_MAX;
  for (int64_t d : divisors) {
    if (d < 1 || d > INT32_MAX) continue;
    const CudaDivider div = cuda_divider(d);
    std::vector<int64_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, max_n, max_n - 1, max_n - d, max_n / d * d, max_n / d * d - 1};
    for (int64_t n = 2; n < max_n; n = n * 5 / 2 + 1) ns.push_back(n);
    for (int64_t n : ns) {
      if (n < 0 || n > max_n) continue;
      ASSERT_EQ(cuda_divide(static_cast<uint32_t>(n), div), static_cast<uint32_t>(n / d))
          << n << " / " << d << " (magic " << div.magic << ", shift " << div.shift << ")";
    }
  }
  // The kernels read them: a 3-d pointwise kernel with int32 offsets divides through fj_udiv.
  auto specs = cuda_specs(R"(graph(%0 : f32[6,10,14]{140,1,10}, %1 : f32[6,10,14]):
  %2 : f32[6,10,14] = aten::add.Tensor(%0, %1, 1)
  return (%2)
)");
  const std::string src = print_cuda_source(specs, /*size_args=*/true);
  EXPECT_NE(src.find("fj_udiv((unsigned)r_"), std::string::npos) << src.substr(src.find("fj_kernel_0"));
  EXPECT_EQ(print_cuda_source(specs).find("fj_udiv((unsigned)r_"), std::string::npos) << "literal sizes divide by constants";
}

TEST(CudaPlan, BuildsWithAGivenArchWithoutAGpu) {
  auto g = parse_graph(kChain);
  set_device(*g, Device::kCUDA, 0);
  PlanTarget target;
  target.arch["cuda"] = "sm_90";
  auto plan = build_plan(std::move(g), target);
  ASSERT_EQ(plan->kernels.size(), 1u) << plan->explain();
  EXPECT_EQ(plan->code_for(Device::kCPU), nullptr);
  const TargetCode* code = plan->code_for(Device::kCUDA);
  ASSERT_NE(code, nullptr);
  EXPECT_EQ(code->arch, "sm_90");
  EXPECT_FALSE(code->source.empty());
  ASSERT_NE(code->artifact, nullptr);
  EXPECT_EQ(code->artifact->image_file_name(), "plan.cubin");
  EXPECT_FALSE(code->artifact->image().empty());
  const auto report = code->artifact->kernel_report("fj_kernel_0");
  ASSERT_EQ(report.size(), 5u);
  EXPECT_EQ(report[0].first, "registers");
  EXPECT_GT(report[0].second, 0);
  EXPECT_EQ(cuda_vector_width(plan->kernels[0].spec), 4);
  std::string ex = plan->explain();
  EXPECT_NE(ex.find("cuda fj_kernel_0 (sm_90): 16384 elements, vector width 4, int32 offsets"), std::string::npos) << ex;
  EXPECT_NE(ex.find("spills 0 B stored / 0 B loaded"), std::string::npos) << ex;
}

TEST(CudaDriver, AbsentDriverIsReportedClearly) {
  std::string why;
  if (cuda_driver_available(&why)) GTEST_SKIP() << "a CUDA driver is present on this machine";
  EXPECT_EQ(why.rfind("no CUDA driver found", 0), 0u) << why;
  try {
    cuda_device_info(0);
    ADD_FAILURE() << "no error without a driver";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("no CUDA driver found"), 0u) << e.what();
  }
  // Without an architecture, a CUDA plan asks the driver: its groups fall back to ATen, with the reason.
  auto g = parse_graph(kChain);
  set_device(*g, Device::kCUDA, 0);
  auto plan = build_plan(std::move(g));
  EXPECT_TRUE(plan->kernels.empty());
  EXPECT_EQ(plan->fallback_groups.size(), 1u);
}

}  // namespace
}  // namespace fusion_jit
