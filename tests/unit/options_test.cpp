#include <array>
#include <gtest/gtest.h>

#include "support/error.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

TEST(Options, Defaults) {
  const char* env[] = {"PATH=/bin", nullptr};
  Options o = Options::parse(env);
  EXPECT_EQ(o.specialization_limit, 8);
  EXPECT_EQ(o.shared_plans, 64);
  EXPECT_EQ(o.dynamic, DynamicSizes::kAuto);
  EXPECT_FALSE(o.assert_no_compile);
  EXPECT_TRUE(o.dump.empty());
}

TEST(Options, ParsesKnownVariables) {
  const char* env[] = {"FUSION_JIT_DUMP=ir,plan", "FUSION_JIT_SPECIALIZATION_LIMIT=3", "FUSION_JIT_DISABLE=cse",
                       "FUSION_JIT_ASSERT_NO_COMPILE=1", "FUSION_JIT_LOG_LEVEL=debug", "FUSION_JIT_DYNAMIC=off",
                       "FUSION_JIT_SHARED_PLANS=7", "FUSION_JIT_GEMM=aten", nullptr};
  Options o = Options::parse(env);
  EXPECT_TRUE(o.dumps("ir"));
  EXPECT_TRUE(o.dumps("plan"));
  EXPECT_FALSE(o.dumps("source"));
  EXPECT_EQ(o.specialization_limit, 3);
  EXPECT_TRUE(o.is_disabled("cse"));
  EXPECT_TRUE(o.assert_no_compile);
  EXPECT_EQ(o.log_level, LogLevel::kDebug);
  EXPECT_EQ(o.dynamic, DynamicSizes::kOff);
  EXPECT_EQ(o.shared_plans, 7);
  EXPECT_EQ(o.gemm, GemmChoice::kAten);
  EXPECT_EQ(Options::parse(std::array<const char*, 1>{nullptr}.data()).gemm, GemmChoice::kMeasure);
}

void expect_error(const char* var, const char* fragment) {
  const char* env[] = {var, nullptr};
  try {
    Options::parse(env);
    FAIL() << var;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Options, RejectsUnknownAndMalformed) {
  expect_error("FUSION_JIT_DUMPS=ir", "unknown environment variable FUSION_JIT_DUMPS");
  expect_error("FUSION_JIT_DUMP=kernels", "unknown item 'kernels'");
  expect_error("FUSION_JIT_SPECIALIZATION_LIMIT=many", "FUSION_JIT_SPECIALIZATION_LIMIT=many");
  expect_error("FUSION_JIT_LOG_LEVEL=loud", "expected error, warn, info or debug");
  expect_error("FUSION_JIT_DYNAMIC=yes", "FUSION_JIT_DYNAMIC=yes: expected auto, on or off");
  expect_error("FUSION_JIT_GEMM=mkl", "FUSION_JIT_GEMM=mkl: expected measure, aten or onednn");
  expect_error("FUSION_JIT_ASSERT_NO_COMPILE=maybe", "expected 0 or 1");
  expect_error("FUSION_JIT_SHARED_PLANS=0", "FUSION_JIT_SHARED_PLANS=0: expected an integer >= 1");
}

// Issue 13 item 14: a megabyte count whose bytes (MB << 20) overflow int64_t was accepted and wrapped the
// cache cap to a negative number; values past int64_t were clamped by strtoll in silence.
TEST(Options, OverflowingNumbersAreRejectedNamingTheVariableAndValue) {
  expect_error("FUSION_JIT_CACHE_MAX_MB=17592186044416", "FUSION_JIT_CACHE_MAX_MB=17592186044416: too large");
  expect_error("FUSION_JIT_CACHE_MAX_MB=99999999999999999999",
               "FUSION_JIT_CACHE_MAX_MB=99999999999999999999: too large");
  expect_error("FUSION_JIT_CPU_POOL_MB=17592186044416", "FUSION_JIT_CPU_POOL_MB=17592186044416: too large");
  expect_error("FUSION_JIT_SPECIALIZATION_LIMIT=4294967296", "FUSION_JIT_SPECIALIZATION_LIMIT=4294967296: too large");
  expect_error("FUSION_JIT_CPU_GRAIN=-99999999999999999999", "FUSION_JIT_CPU_GRAIN=-99999999999999999999");
  expect_error("FUSION_JIT_CACHE_MAX_MB= 5", "FUSION_JIT_CACHE_MAX_MB= 5: expected an integer");
  // The largest cap whose bytes fit is accepted, and its bytes do fit.
  const char* env[] = {"FUSION_JIT_CACHE_MAX_MB=8796093022207", nullptr};
  Options o = Options::parse(env);
  EXPECT_EQ(o.cache_max_mb, 8796093022207);
  EXPECT_GT(o.cache_max_mb << 20, 0);
}

}  // namespace
}  // namespace fusion_jit
