// Elementwise chains, eager vs fused vs a plain add loop, measured in one run.
//
//   ./run bench [--benchmark_filter=...]
//
// Each benchmark reports bytes_per_second for the bytes the computation must move (inputs read once,
// output written once), so fused chains can be compared with the add loop, the bandwidth roofline.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include "fusion_jit/fusion_jit.h"

namespace {

constexpr int64_t kN = 16 << 20;

// The first n ops of a fixed chain of 8 over x.
at::Tensor chain(const at::Tensor& x, int n) {
  at::Tensor y = x;
  for (int i = 0; i < n; ++i) {
    switch (i) {
      case 0: y = y * 0.5; break;
      case 1: y = y + 1.0; break;
      case 2: y = y.sigmoid(); break;
      case 3: y = y * x; break;
      case 4: y = y - 0.25; break;
      case 5: y = y.relu(); break;
      case 6: y = y.tanh(); break;
      case 7: y = y + x; break;
    }
  }
  return y;
}

at::Tensor input(at::ScalarType t, int64_t n) { return at::randn({n}).to(t); }

void BM_Eager(benchmark::State& st) {
  int ops = static_cast<int>(st.range(0));
  auto t = static_cast<at::ScalarType>(st.range(1));
  at::Tensor x = input(t, kN);
  for (auto _ : st) benchmark::DoNotOptimize(chain(x, ops));
  st.SetBytesProcessed(st.iterations() * 2 * kN * x.element_size());
  st.SetLabel(c10::toString(t));
}

void BM_Fused(benchmark::State& st) {
  int ops = static_cast<int>(st.range(0));
  auto t = static_cast<at::ScalarType>(st.range(1));
  at::Tensor x = input(t, kN);
  auto f = fusion_jit::trace([ops](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{chain(in[0], ops)}; },
                             {x});
  std::vector<c10::IValue> args{x};
  f(args);  // compile
  for (auto _ : st) benchmark::DoNotOptimize(f(args));
  st.SetBytesProcessed(st.iterations() * 2 * kN * x.element_size());
  st.SetLabel(c10::toString(t));
}

// c = a + b over float32 with torch's thread pool: the bandwidth roofline of fused elementwise work.
void BM_AddLoop(benchmark::State& st) {
  at::Tensor a = input(at::kFloat, kN), b = input(at::kFloat, kN), c = at::empty({kN});
  const float* __restrict__ pa = a.const_data_ptr<float>();
  const float* __restrict__ pb = b.const_data_ptr<float>();
  float* __restrict__ pc = c.mutable_data_ptr<float>();
  for (auto _ : st) {
    at::parallel_for(0, kN, 32768, [pa, pb, pc](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) pc[i] = pa[i] + pb[i];
    });
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * 3 * kN * 4);
}

// Host overhead of a one-kernel plan on 1K elements.
void BM_SmallEager(benchmark::State& st) {
  at::Tensor x = input(at::kFloat, 1024);
  for (auto _ : st) benchmark::DoNotOptimize((x * 0.5).relu());
}
void BM_SmallFused(benchmark::State& st) {
  at::Tensor x = input(at::kFloat, 1024);
  auto f = fusion_jit::trace([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{(in[0] * 0.5).relu()}; },
                             {x});
  std::vector<c10::IValue> args{x};
  f(args);
  for (auto _ : st) benchmark::DoNotOptimize(f(args));
}

// Host overhead of a plan of 100 ATen steps (views: transpose(0, 1) of a 8x8 tensor, 100 times): eager's
// dispatch of the same ops against the plan's, per step (issue 16's per-step overhead).
at::Tensor transposes(at::Tensor y) {
  for (int i = 0; i < 100; ++i) y = y.transpose(0, 1);
  return y;
}
void BM_AtenSteps100Eager(benchmark::State& st) {
  at::Tensor x = input(at::kFloat, 64).view({8, 8});
  for (auto _ : st) benchmark::DoNotOptimize(transposes(x));
}
void BM_AtenSteps100Plan(benchmark::State& st) {
  at::Tensor x = input(at::kFloat, 64).view({8, 8});
  auto f = fusion_jit::trace([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{transposes(in[0])}; },
                             {x});
  std::vector<c10::IValue> args{x};
  f(args);
  for (auto _ : st) benchmark::DoNotOptimize(f(args));
}

// Eight kernels on 64x64 float32, each followed by an ATen step (cumsum): eight intermediates written by
// kernels, which share the call's arena (Note [Static memory plan]); FUSION_JIT_DISABLE=arena in another
// run allocates each alone.
at::Tensor kernels_between_steps(at::Tensor y) {
  for (int i = 0; i < 8; ++i) y = (y * 0.5 + 1.0).cumsum(1);
  return y;
}
void BM_ArenaEager(benchmark::State& st) {
  at::Tensor x = input(at::kFloat, 4096).view({64, 64});
  for (auto _ : st) benchmark::DoNotOptimize(kernels_between_steps(x));
}
void BM_ArenaPlan(benchmark::State& st) {
  at::Tensor x = input(at::kFloat, 4096).view({64, 64});
  auto f = fusion_jit::trace(
      [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{kernels_between_steps(in[0])}; }, {x});
  std::vector<c10::IValue> args{x};
  f(args);
  for (auto _ : st) benchmark::DoNotOptimize(f(args));
}

// An integer chain with a remainder by a literal and an independent comparison of the same input (issue
// 16's example): one kernel with integer division by literals fused and the two groups merged side by
// side; FUSION_JIT_DISABLE=horizontal in another run gives the two kernels apart, against eager's own.
std::vector<at::Tensor> integer_graph(const at::Tensor& x) { return {(x * 3).remainder(5) + 1, x > 2}; }
void BM_IntegerGraphEager(benchmark::State& st) {
  at::Tensor x = at::randint(-1000, 1000, {st.range(0)}, at::kInt);
  for (auto _ : st) benchmark::DoNotOptimize(integer_graph(x));
}
void BM_IntegerGraphFused(benchmark::State& st) {
  at::Tensor x = at::randint(-1000, 1000, {st.range(0)}, at::kInt);
  auto f = fusion_jit::trace([](const std::vector<at::Tensor>& in) { return integer_graph(in[0]); }, {x});
  std::vector<c10::IValue> args{x};
  f(args);
  for (auto _ : st) benchmark::DoNotOptimize(f(args));
}

// BERT-base's embeddings (Note [Gathered loads]): word and position embeddings summed and layer-normed,
// [8, 128] tokens of a 30522 x 768 table. Eager runs two gathers, an add and a layer norm; the plan one
// kernel that reads the tables at the indices' rows.
std::vector<at::Tensor> embeddings(const std::vector<at::Tensor>& in) {
  at::Tensor e = at::embedding(in[0], in[2]) + at::embedding(in[1], in[3]);
  return {at::layer_norm(e, {e.size(-1)})};
}
std::vector<at::Tensor> embedding_inputs() {
  at::manual_seed(0);
  return {at::randn({30522, 768}), at::randn({512, 768}), at::randint(0, 30522, {8, 128}), at::arange(128)};
}
void BM_EmbeddingsEager(benchmark::State& st) {
  auto in = embedding_inputs();
  for (auto _ : st) benchmark::DoNotOptimize(embeddings(in));
}
void BM_EmbeddingsPlan(benchmark::State& st) {
  auto in = embedding_inputs();
  auto f = fusion_jit::trace(embeddings, in);
  std::vector<c10::IValue> args(in.begin(), in.end());
  f(args);
  for (auto _ : st) benchmark::DoNotOptimize(f(args));
}

// A decode step's key/value cache update (Note [Cats of unequal items]): this step's key rotated (rotary
// embedding: rotate_half's cat inside) and appended to a 511-position cache, its value appended to the
// value cache; 8 heads of 64. Eager runs the rotary's ops and two ATen cats; the plan two kernels (the
// key's with its rotary, the value's copy).
std::vector<at::Tensor> kv_cache(const std::vector<at::Tensor>& in) {
  const at::Tensor& k = in[2];
  at::Tensor r = at::cat({-k.slice(-1, 32, 64), k.slice(-1, 0, 32)}, -1);
  return {at::cat({in[0], k * in[4] + r * in[5]}, 2), at::cat({in[1], in[3]}, 2)};
}
std::vector<at::Tensor> kv_cache_inputs() {
  at::manual_seed(0);
  return {at::randn({1, 8, 511, 64}), at::randn({1, 8, 511, 64}), at::randn({1, 8, 1, 64}),
          at::randn({1, 8, 1, 64}),   at::randn({1, 1, 1, 64}),   at::randn({1, 1, 1, 64})};
}
void BM_KvCacheEager(benchmark::State& st) {
  auto in = kv_cache_inputs();
  for (auto _ : st) benchmark::DoNotOptimize(kv_cache(in));
}
void BM_KvCachePlan(benchmark::State& st) {
  auto in = kv_cache_inputs();
  auto f = fusion_jit::trace(kv_cache, in);
  std::vector<c10::IValue> args(in.begin(), in.end());
  f(args);
  for (auto _ : st) benchmark::DoNotOptimize(f(args));
}

void chains(benchmark::internal::Benchmark* b) {
  for (int64_t t : {static_cast<int64_t>(at::kFloat), static_cast<int64_t>(at::kBFloat16)})
    for (int64_t ops : {2, 4, 6, 8}) b->Args({ops, t});
}

BENCHMARK(BM_AddLoop)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Eager)->Apply(chains)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Fused)->Apply(chains)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SmallEager)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SmallFused)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AtenSteps100Eager)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AtenSteps100Plan)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ArenaEager)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ArenaPlan)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EmbeddingsEager)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EmbeddingsPlan)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_KvCacheEager)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_KvCachePlan)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_IntegerGraphEager)->Arg(1 << 10)->Arg(1 << 20)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_IntegerGraphFused)->Arg(1 << 10)->Arg(1 << 20)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace


namespace {
void BM_TorchAddOut(benchmark::State& st) {
  at::Tensor a = input(at::kFloat, kN), b = input(at::kFloat, kN), c = at::empty({kN});
  for (auto _ : st) at::add_out(c, a, b);
  st.SetBytesProcessed(st.iterations() * 3 * kN * 4);
}
void BM_TorchAddAlloc(benchmark::State& st) {
  at::Tensor a = input(at::kFloat, kN), b = input(at::kFloat, kN);
  for (auto _ : st) benchmark::DoNotOptimize(a + b);
  st.SetBytesProcessed(st.iterations() * 3 * kN * 4);
}
BENCHMARK(BM_TorchAddOut)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TorchAddAlloc)->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK_MAIN();
