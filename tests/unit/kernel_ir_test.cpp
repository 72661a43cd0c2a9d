// The kernel IR printed and queried, the one offset emitter, and the targets' lowering policies, without
// torch and without compiling anything.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <set>
#include <fstream>
#include <filesystem>
#include <limits>

#include "codegen/kernel_ir.h"
#include "codegen/kernel_spec.h"
#include "codegen/target.h"
#include "cost/cost_model.h"
#include "fusion/fusion.h"
#include "support/error.h"
#include "targets/cuda/cuda_schedule.h"
#include "targets/targets.h"

namespace fusion_jit {
namespace {

TEST(KernelIr, PrintsEachKindOfExpression) {
  ExprRef b0 = Expr::load(0);
  EXPECT_EQ(print_expr(*b0), "b0");
  EXPECT_EQ(print_expr(*Expr::lit(2.5, DType::kFloat32)), "((float)0x1.4p+1)");
  EXPECT_EQ(print_expr(*Expr::lit(int64_t{3}, DType::kFloat64)), "((double)3LL)");
  EXPECT_EQ(print_expr(*Expr::lit(std::numeric_limits<double>::infinity(), DType::kFloat32)), "((float)(FJ_INF))");
  EXPECT_EQ(print_expr(*Expr::lit(-std::numeric_limits<double>::infinity(), DType::kFloat64)), "((double)(-FJ_INF))");
  EXPECT_EQ(print_expr(*Expr::lit(std::nan(""), DType::kFloat16)), "((float)FJ_NAN)");  // computed in float
  EXPECT_EQ(print_expr(*Expr::lit(int64_t{7}, DType::kInt32)), "((int32_t)7LL)");
  EXPECT_EQ(print_expr(*Expr::lit(true, DType::kBool)), "true");
  ExprRef c = Expr::cast(DType::kFloat32, b0);
  EXPECT_EQ(print_expr(*c), "((float)b0)");
  EXPECT_EQ(print_expr(*Expr::call("fj_add", {c, Expr::var("t3"), Expr::lit(int64_t{1}, DType::kFloat32)})),
            "fj_add(((float)b0), t3, ((float)1LL))");
  EXPECT_EQ(print_expr(*Expr::convert(DType::kBFloat16, Expr::call("fj_exp", {c}))), "((float)(fj_exp(((float)b0))))");
  // A cast right under a rounding needs no parentheses of its own; anything else keeps them.
  EXPECT_EQ(print_expr(*Expr::round(DType::kFloat16, c)), "fj_round_f16((float)b0)");
  EXPECT_EQ(print_expr(*Expr::round(DType::kBFloat16, Expr::convert(DType::kBFloat16, Expr::var("t2")))),
            "fj_round_bf16(((float)(t2)))");
  EXPECT_EQ(print_expr(*Expr::select(Expr::load(1), c, Expr::var("t4"))), "(b1 ? ((float)b0) : t4)");
  EXPECT_EQ(print_expr(*Expr::div(Expr::var("acc0"), Expr::lit(int64_t{16}, DType::kFloat32))), "acc0 / ((float)16LL)");
}

TEST(KernelIr, PrintsStatements) {
  Stmt let = Stmt::let("t5", DType::kFloat16, Expr::var("t4"), "aten::relu");
  EXPECT_EQ(print_stmt(let), "const float t5 = t4;  // aten::relu");  // float16 values compute in float
  EXPECT_EQ(print_stmt(Stmt::let("t6", DType::kInt64, Expr::load(2), "aten::neg")), "const int64_t t6 = b2;  // aten::neg");
  EXPECT_EQ(print_stmt(Stmt::out(1, Expr::var("t5"))), "o1 = t5;");
}

TEST(KernelIr, WalksWhatAnExpressionReads) {
  ExprRef e = Expr::call("fj_mul", {Expr::round(DType::kFloat16, Expr::cast(DType::kFloat32, Expr::load(3))),
                                    Expr::select(Expr::load(1), Expr::var("t2"), Expr::var("acc0"))});
  std::set<std::string> vars;
  std::set<int> bufs;
  vars_read(*e, &vars);
  buffers_read(*e, &bufs);
  EXPECT_EQ(vars, (std::set<std::string>{"acc0", "t2"}));
  EXPECT_EQ(bufs, (std::set<int>{1, 3}));
  EXPECT_TRUE(rounds_reduced_float(*e));
  EXPECT_FALSE(rounds_reduced_float(*Expr::call("fj_exp", {Expr::load(0)})));
}

TEST(KernelIr, AccumulatorKinds) {
  EXPECT_STREQ(acc_kind_name(AccKind::kDoubleSum), "dsum");
  EXPECT_STREQ(acc_kind_name(AccKind::kWelford), "welford");
  EXPECT_TRUE(is_sum(AccKind::kKahanSum));
  EXPECT_FALSE(is_sum(AccKind::kProd));
  EXPECT_EQ(reduction_identity(AccKind::kMax, DType::kFloat32), "(-FJ_INFF)");
  EXPECT_EQ(reduction_identity(AccKind::kMin, DType::kInt32), "2147483647");
  EXPECT_EQ(reduction_identity(AccKind::kProd, DType::kFloat64), "((double)1)");
  EXPECT_EQ(reduction_identity(AccKind::kKahanSum, DType::kFloat32), "((float)0)");
}

TEST(KernelIr, OneOffsetEmitterForEveryIndexDecomposition) {
  KernelSpec k;
  k.sizes = {4, 6, 8};
  KernelBuffer a, b;
  a.strides = {48, 8, 1};
  b.strides = {0, 0, 1};  // moves along the last dim only
  k.buffers = {a, b};
  EXPECT_EQ(offsets_code(k, 0, 3, {"r", "c", "off"}, "  "),
            "  c = r % 8; r /= 8;\n  off0 += c * 1;\n  off1 += c * 1;\n"
            "  c = r % 6; r /= 6;\n  off0 += c * 8;\n"
            "  c = r;\n  off0 += c * 48;\n");
  // CUDA's form: unit strides without the multiply, dims no buffer moves along only divide the index.
  k.buffers[0].strides = {0, 0, 1};
  EXPECT_EQ(offsets_code(k, 0, 3, {"r_", "c_", "off", true, true}, ""),
            "c_ = r_ % 8; r_ /= 8;\noff0 += c_;\noff1 += c_;\nr_ /= 6;\n");
  // A range of dims (a reduction's reduced dims): its first dim takes the rest of the index.
  EXPECT_EQ(offsets_code(k, 1, 3, {"q_", "d_", "eoff"}, ""),
            "d_ = q_ % 8; q_ /= 8;\neoff0 += d_ * 1;\neoff1 += d_ * 1;\nd_ = q_;\n");
}

TEST(Targets, EachDeviceHasOneAndTheirPoliciesDifferWhereEagerDoes) {
  const Target& cpu = target_for(Device::kCPU);
  const Target& cuda = target_for(Device::kCUDA);
  EXPECT_STREQ(cpu.name(), "cpu");
  EXPECT_STREQ(cuda.name(), "cuda");
  EXPECT_EQ(cpu.device(), Device::kCPU);
  EXPECT_EQ(cuda.device(), Device::kCUDA);
  EXPECT_EQ(all_targets().size(), 2u);
  EXPECT_EQ(target_named("cpu"), &cpu);
  EXPECT_EQ(target_named("cuda"), &cuda);
  EXPECT_EQ(target_named("tpu"), nullptr);
  // The host compiles for itself only; CUDA names the architectures it knows.
  EXPECT_NO_THROW(cpu.check_arch(""));
  EXPECT_THROW(cpu.check_arch("sm_90"), Error);
  EXPECT_TRUE(cpu.device_present());
  EXPECT_EQ(cpu.device_arch(0), "");
  // Eager's CPU erf of float16 is ATen's vectorized polynomial; CUDA calls the device's erff.
  EXPECT_EQ(cpu.math_fn("erf", DType::kFloat16), "erf_as");
  EXPECT_EQ(cpu.math_fn("erf", DType::kFloat32), "erf");
  EXPECT_EQ(cuda.math_fn("erf", DType::kFloat16), "erf");
  EXPECT_EQ(cpu.math_fn("gelu", DType::kFloat64), "gelu");
  EXPECT_FALSE(cpu.pow_uses_sqrt(DType::kFloat16));
  EXPECT_TRUE(cpu.pow_uses_sqrt(DType::kBFloat16));
  EXPECT_TRUE(cuda.pow_uses_sqrt(DType::kFloat16));
  EXPECT_EQ(cpu.float_sum(DType::kFloat32, false), AccKind::kDoubleSum);
  EXPECT_EQ(cpu.float_sum(DType::kFloat32, true), AccKind::kSum);
  EXPECT_EQ(cpu.float_sum(DType::kFloat64, false), AccKind::kKahanSum);
  EXPECT_EQ(cuda.float_sum(DType::kFloat32, false), AccKind::kKahanSum);
  // Keeping values between passes: CPU scratch rows within a byte budget, expensive values only; CUDA
  // registers, two values, cheap ones where they read two element buffers or more.
  KernelSpec k;
  k.row_len = 1024;
  int64_t budget = 6000;
  const KeptValue exp_value{DType::kFloat32, true, 1}, sum_of_two{DType::kFloat32, false, 2},
      cheap_of_one{DType::kFloat32, false, 1};
  EXPECT_FALSE(cpu.may_keep_between_passes(k, sum_of_two, 0, &budget));
  EXPECT_EQ(budget, 6000);
  EXPECT_TRUE(cpu.may_keep_between_passes(k, exp_value, 0, &budget));
  EXPECT_EQ(budget, 6000 - 4096);
  EXPECT_FALSE(cpu.may_keep_between_passes(k, exp_value, 1, &budget));
  k.row_len = 32 * kCudaRowRegisters;
  k.passes.resize(1);
  EXPECT_TRUE(cuda.may_keep_between_passes(k, exp_value, 1, &budget));
  EXPECT_TRUE(cuda.may_keep_between_passes(k, sum_of_two, 1, &budget));
  EXPECT_FALSE(cuda.may_keep_between_passes(k, cheap_of_one, 0, &budget));
  EXPECT_FALSE(cuda.may_keep_between_passes(k, exp_value, 2, &budget));
}

TEST(Targets, CudaGridCoversTheWorkUpToOneWave) {
  EXPECT_EQ(cuda_grid_blocks(1, 132), 1);
  EXPECT_EQ(cuda_grid_blocks(kCudaBlockSize * 10 + 1, 132), 11);
  EXPECT_EQ(cuda_grid_blocks(int64_t{1} << 40, 132), 132 * (2048 / kCudaBlockSize));
  EXPECT_EQ(cuda_grid_blocks(int64_t{1} << 40, 0), 2048 / kCudaBlockSize);
  // Note [One wave of blocks]: 6 blocks per SM (a kernel of 33-40 registers): one wave of 6 per SM.
  EXPECT_EQ(cuda_grid_blocks(int64_t{1} << 40, 132, 6), 132 * 6);
  EXPECT_EQ(cuda_grid_blocks(kCudaBlockSize * 10, 132, 6), 10);
}

// A third target is a new folder under src/targets/ and its entry in all_targets(): the layers that build,
// hold and run plans name no target and no CUDA device. Outside src/targets/ only the CUDA-specific
// features include a target's headers: the public CUDA status and compiler counters (torch/api_cache.cpp),
// `fusion-jit compile`'s kernels.json (cli/model.cpp) and the fuzzer's NVRTC spill check (fuzz/fuzzer.cpp).
TEST(Targets, OnlyTheTargetsFolderNamesATarget) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(FJ_TEST_DATA_DIR) / ".." / ".." / ".." / "src";
  ASSERT_TRUE(fs::exists(src / "targets" / "targets.cpp")) << src;
  const std::set<std::string> cuda_features = {"torch/api_cache.cpp", "cli/model.cpp", "fuzz/fuzzer.cpp"};
  // The layers that lower, build, hold and run plans.
  const std::set<std::string> device_neutral = {"codegen", "runtime", "driver"};
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), src).generic_string();
    const std::string layer = rel.substr(0, rel.find('/'));
    if (layer == "targets") continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string t = text.str();
    ++files;
    const bool includes_target =
        t.find("#include \"targets/cpu/") != std::string::npos || t.find("#include \"targets/cuda/") != std::string::npos;
    EXPECT_TRUE(!includes_target || cuda_features.count(rel)) << rel << " includes a target's own header";
    if (device_neutral.count(layer)) {
      EXPECT_EQ(t.find("Device::kCUDA"), std::string::npos) << rel << " branches on the CUDA device";
      EXPECT_EQ(t.find("cuda_"), std::string::npos) << rel << " names a CUDA function";
    }
  }
  EXPECT_GT(files, 50);
}

}  // namespace
}  // namespace fusion_jit
