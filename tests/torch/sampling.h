// Heavy corpora run a sample of their variants (issue 64: the whole suite in minutes): every case runs
// every time, in its first variant (dtype) always and in each other one with probability 1/2, chosen by a
// seed. The seed is the day's number (days since 1970-01-01, UTC) unless FJ_TEST_SEED gives one, so each
// day covers other variants and a failure is reproduced by its seed; FJ_TEST_SAMPLE=all runs every
// variant. The seed is printed when a test binary starts and again after each failure, and
// each test starts with torch's generator seeded with 0, whatever ran before it (sampling.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusion_jit {

// FJ_TEST_SEED, else the day's number.
int64_t sample_seed();
// FJ_TEST_SAMPLE=all.
bool sample_everything();
// Whether variant `index` of case `name` runs: index 0 always; each other by the seed, with probability 1/2.
bool sampled(const std::string& name, size_t index);

// The variants of case `name` that run (sampled()).
template <class T>
std::vector<T> sample_of(const std::string& name, const std::vector<T>& variants) {
  std::vector<T> out;
  for (size_t i = 0; i < variants.size(); ++i)
    if (sampled(name, i)) out.push_back(variants[i]);
  return out;
}

}  // namespace fusion_jit
