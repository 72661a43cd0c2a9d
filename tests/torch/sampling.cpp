// The corpora's sample (sampling.h): the seed, and the lines that print it.
#include "sampling.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>

namespace fusion_jit {

int64_t sample_seed() {
  static const int64_t seed = [] {
    if (const char* s = std::getenv("FJ_TEST_SEED"); s && *s) {
      char* end = nullptr;
      const long long v = std::strtoll(s, &end, 10);
      if (*end == '\0') return static_cast<int64_t>(v);
      std::fprintf(stderr, "FJ_TEST_SEED=%s is not an integer\n", s);
      std::exit(2);
    }
    return static_cast<int64_t>(std::time(nullptr) / 86400);
  }();
  return seed;
}

bool sample_everything() {
  const char* s = std::getenv("FJ_TEST_SAMPLE");
  return s && std::string(s) == "all";
}

bool sampled(const std::string& name, size_t index) {
  if (index == 0 || sample_everything()) return true;
  // std::hash of a string is the same in every run of one build (libstdc++: murmur over the bytes).
  const size_t h = std::hash<std::string>()(name + "#" + std::to_string(index) + "@" + std::to_string(sample_seed()));
  return (h >> 7) % 2 == 0;
}

namespace {

std::string describe() {
  return sample_everything() ? "FJ_TEST_SAMPLE=all: every variant of the corpora"
                             : "corpora sampled with FJ_TEST_SEED=" + std::to_string(sample_seed()) +
                                   " (set it to run this sample again; FJ_TEST_SAMPLE=all runs every variant)";
}

// Prints the sample when the run starts and after each failed test, so a failure names its seed. Each test
// starts from torch's generator seeded with 0: a test that draws its inputs without seeding gets the same
// ones whichever sample of the corpora ran before it.
class SamplePrinter : public ::testing::EmptyTestEventListener {
  void OnTestProgramStart(const ::testing::UnitTest&) override { std::printf("[ sample   ] %s\n", describe().c_str()); }
  void OnTestStart(const ::testing::TestInfo&) override { at::manual_seed(0); }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) std::printf("[ sample   ] %s\n", describe().c_str());
  }
};

const bool registered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SamplePrinter);
  return true;
}();

}  // namespace
}  // namespace fusion_jit
