// The per-call signature lookup of a compiled module (src/torch/graph_function.h): the table's map type,
// std::map and std::unordered_map against absl::flat_hash_map, in one run. Keys are real signatures
// (input_signature of the call's inputs plus the grad-mode byte); the table holds 8 of them (the default
// specialization limit), or 64, and the lookup hits, as a served call's does.
//
//   build/bench_signature_lookup --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <ATen/ops/randn.h>
#include <absl/container/flat_hash_map.h>
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "torch/executor.h"

namespace {

// Signatures of calls with three tensors (a batch of activations, a mask, a bias) of varying batch size.
std::vector<std::string> signatures(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::vector<c10::IValue> in = {at::randn({4 + i, 128, 64}), at::randn({4 + i, 1, 64}), at::randn({64})};
    out.push_back(fusion_jit::input_signature(in) + '\1');
  }
  return out;
}

template <typename Map>
void BM_Lookup(benchmark::State& state) {
  const auto keys = signatures(static_cast<int>(state.range(0)));
  Map map;
  for (const auto& k : keys) map.emplace(k, std::make_shared<int>(1));
  std::mutex mu;  // as the table takes its lock for the lookup
  size_t i = 0;
  for (auto _ : state) {
    const std::string& key = keys[i++ % keys.size()];
    std::lock_guard<std::mutex> g(mu);
    auto it = map.find(key);
    benchmark::DoNotOptimize(it->second.get());
  }
  state.counters["key_bytes"] = static_cast<double>(keys[0].size());
}

using StdMap = std::map<std::string, std::shared_ptr<int>>;
using StdUnorderedMap = std::unordered_map<std::string, std::shared_ptr<int>>;
using AbslFlatHashMap = absl::flat_hash_map<std::string, std::shared_ptr<int>>;

BENCHMARK_TEMPLATE(BM_Lookup, StdMap)->Arg(8)->Arg(64);
BENCHMARK_TEMPLATE(BM_Lookup, StdUnorderedMap)->Arg(8)->Arg(64);
BENCHMARK_TEMPLATE(BM_Lookup, AbslFlatHashMap)->Arg(8)->Arg(64);

}  // namespace

BENCHMARK_MAIN();
