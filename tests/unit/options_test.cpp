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
  expect_error("FUSION_JIT_COMPILE_JOBS=-1", "FUSION_JIT_COMPILE_JOBS=-1: expected an integer >= 0");
  expect_error("FUSION_JIT_COMPILE_JOBS=257", "FUSION_JIT_COMPILE_JOBS=257: too large (at most 256)");
  const char* env[] = {"FUSION_JIT_COMPILE_JOBS=3", nullptr};
  EXPECT_EQ(Options::parse(env).compile_jobs, 3);
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

// Issue 64 item 3: the Python package reads its options through Options::value, so that their parsing,
// checks and errors are the table's.
TEST(Options, ValueIsTheTablesParseWrittenBack) {
  const char* none[] = {"PATH=/bin", nullptr};
  EXPECT_EQ(Options::value("FUSION_JIT_DYNAMIC", none), "auto");
  EXPECT_EQ(Options::value("FUSION_JIT_STRICT", none), "0");
  EXPECT_EQ(Options::value("FUSION_JIT_FREEZING", none), "0");
  EXPECT_EQ(Options::value("FUSION_JIT_DISABLE", none), "");
  EXPECT_EQ(Options::value("FUSION_JIT_SPECIALIZATION_LIMIT", none), "8");
  const char* env[] = {"FUSION_JIT_DYNAMIC=off", "FUSION_JIT_STRICT=yes", "FUSION_JIT_FREEZING=on",
                       "FUSION_JIT_CUDA_GRAPHS=true", "FUSION_JIT_DISABLE=horizontal,,fusion",
                       "FUSION_JIT_LOG_LEVEL=debug", "FUSION_JIT_GEMM=onednn", "FUSION_JIT_CACHE_MAX_MB=7", nullptr};
  EXPECT_EQ(Options::value("FUSION_JIT_DYNAMIC", env), "off");
  EXPECT_EQ(Options::value("FUSION_JIT_STRICT", env), "1");
  EXPECT_EQ(Options::value("FUSION_JIT_FREEZING", env), "1");
  EXPECT_EQ(Options::value("FUSION_JIT_CUDA_GRAPHS", env), "1");
  EXPECT_EQ(Options::value("FUSION_JIT_DISABLE", env), "fusion,horizontal");
  EXPECT_EQ(Options::value("FUSION_JIT_LOG_LEVEL", env), "debug");
  EXPECT_EQ(Options::value("FUSION_JIT_GEMM", env), "onednn");
  EXPECT_EQ(Options::value("FUSION_JIT_CACHE_MAX_MB", env), "7");
  Options o = Options::parse(env);
  EXPECT_TRUE(o.strict);
  EXPECT_TRUE(o.freezing);
}

// Only the variable asked for is parsed: another's bad value is the snapshot's error (Options::get), not
// this one's; the one asked for is reported as parse reports it, naming the variable and its value.
TEST(Options, ValueParsesOnlyTheVariableAskedFor) {
  const char* env[] = {"FUSION_JIT_CPU_GRAIN=many", "FUSION_JIT_DYNAMIC=sometimes", "FUSION_JIT_STRICT=maybe", nullptr};
  EXPECT_EQ(Options::value("FUSION_JIT_FREEZING", env), "0");
  auto expect_value_error = [&](const char* name, const char* fragment) {
    try {
      Options::value(name, env);
      FAIL() << name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_value_error("FUSION_JIT_DYNAMIC", "FUSION_JIT_DYNAMIC=sometimes: expected auto, on or off");
  expect_value_error("FUSION_JIT_STRICT", "FUSION_JIT_STRICT=maybe: expected 0 or 1");
  expect_value_error("FUSION_JIT_CPU_GRAIN", "FUSION_JIT_CPU_GRAIN=many: expected an integer");
  expect_value_error("FUSION_JIT_STRCT", "unknown environment variable FUSION_JIT_STRCT");
  expect_value_error("FUSION_JIT_LIBRARY", "FUSION_JIT_LIBRARY is read before the library loads");
}

// Every entry's value read back is the value: what `show` writes, `set` parses to the same.
TEST(Options, ValueRoundTripsThroughTheTable) {
  const char* env[] = {"FUSION_JIT_DUMP=plan,ir", "FUSION_JIT_SHARED_PLANS=9", "FUSION_JIT_REMOTE_CACHE_TTL=60",
                       "FUSION_JIT_CXX=ccache g++", "FUSION_JIT_ASSERT_NO_COMPILE=1", nullptr};
  for (const char* name : {"FUSION_JIT_DUMP", "FUSION_JIT_SHARED_PLANS", "FUSION_JIT_REMOTE_CACHE_TTL",
                           "FUSION_JIT_CXX", "FUSION_JIT_ASSERT_NO_COMPILE", "FUSION_JIT_CPU_POOL_MB"}) {
    const std::string shown = Options::value(name, env);
    const std::string again = std::string(name) + "=" + shown;
    const char* back[] = {again.c_str(), nullptr};
    EXPECT_EQ(Options::value(name, back), shown) << name;
  }
  EXPECT_EQ(Options::value("FUSION_JIT_DUMP", env), "ir,plan");
  EXPECT_EQ(Options::value("FUSION_JIT_CXX", env), "ccache g++");
}

// ./run reads FUSION_JIT_TEST_JOBS (docs/building.md); the library accepts it as it accepts ./run's other variables.
TEST(Options, AcceptsRunsVariables) {
  const char* env[] = {"FUSION_JIT_VENV=/v", "FUSION_JIT_BUILD_JOBS=4", "FUSION_JIT_TEST_JOBS=3", nullptr};
  EXPECT_NO_THROW(Options::parse(env));
}

}  // namespace
}  // namespace fusion_jit
