// GPU benchmarks, each against a baseline measured in the same run (they skip without a GPU):
//
//   build/bench_cuda --benchmark_format=json     (tests/gpu/run.sh runs them and prints the ratios)
//
// - BM_CudaCopy: a device-to-device copy of 256M float32 (bytes read + written): the bandwidth roofline.
// - BM_CudaChainEager / BM_CudaChainFused: the 6-op float32 chain of bench_elementwise on 256M elements;
//   bytes_per_second counts the input read once and the output written once, like the copy.
// - BM_CudaLaunchesEager / BM_CudaReplay: a 10-op plan on 4K elements, one kernel per op (fusion off),
//   run by eager's launches or replayed as one CUDA Graph; the "host_us" counter is the host time per
//   call (the GPU is synchronized every 64 calls, outside the timed region).
// - BM_Cuda<Pattern>Eager / BM_Cuda<Pattern>Fused: the reduction patterns (softmax of a scaled, masked
//   input; layer norm of x + bias + residual; RMS norm times a weight; log_softmax; mean and var; GELU then
//   mean) on [65536, 1024] float32, bytes_per_second over the tensors read and written once.
// - BM_CudaSoftmaxDynamic, BM_CudaLayerNormDynamic, BM_CudaTransposedAdd{Fused,Dynamic}: plans whose
//   kernels take their sizes as arguments against the same plans with literal sizes (issue 17's bar: within
//   10%).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <functional>
#include <optional>

#include "fusion_jit/fusion_jit.h"
#include "runtime/plan.h"
#include "targets/cuda/cuda_driver.h"
#include "torch/cuda_support.h"

namespace {

constexpr int64_t kBig = 256LL << 20;
constexpr int64_t kSmall = 4096;

bool skip_without_gpu(benchmark::State& st) {
  std::string why;
  if (!fusion_jit::cuda_driver_available(&why) || fusion_jit::torch_cuda_device_count() == 0) {
    st.SkipWithError(("no GPU: " + (why.empty() ? std::string("torch sees no CUDA device") : why)).c_str());
    return true;
  }
  return false;
}

at::Tensor chain6(const at::Tensor& x) {
  at::Tensor y = x * 0.5;
  y = y + 1.0;
  y = y.sigmoid();
  y = y * x;
  y = y - 0.25;
  return y.relu();
}

at::Tensor chain10(const at::Tensor& x) {
  at::Tensor y = x;
  for (int i = 0; i < 5; ++i) y = (y * 0.9).sin();
  return y;
}

void sync() { fusion_jit::cuda_synchronize(0); }

void BM_CudaCopy(benchmark::State& st) {
  if (skip_without_gpu(st)) return;
  at::Tensor a = at::randn({kBig}, at::kCUDA), b = at::empty_like(a);
  for (auto _ : st) {
    b.copy_(a);
    sync();
  }
  st.SetBytesProcessed(st.iterations() * 2 * kBig * 4);
}

void BM_CudaChainEager(benchmark::State& st) {
  if (skip_without_gpu(st)) return;
  at::Tensor x = at::randn({kBig}, at::kCUDA);
  for (auto _ : st) {
    benchmark::DoNotOptimize(chain6(x));
    sync();
  }
  st.SetBytesProcessed(st.iterations() * 2 * kBig * 4);
}

void BM_CudaChainFused(benchmark::State& st) {
  if (skip_without_gpu(st)) return;
  at::Tensor x = at::randn({kBig}, at::kCUDA);
  auto f = fusion_jit::trace([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{chain6(in[0])}; },
                             {x});
  std::vector<c10::IValue> args{x};
  f(args);  // compile
  f(args);
  sync();
  for (auto _ : st) {
    benchmark::DoNotOptimize(f(args));
    sync();
  }
  st.SetBytesProcessed(st.iterations() * 2 * kBig * 4);
  st.SetLabel(std::to_string(f.plan_for(args) ? 1 : 0) + " plan");
}

// A pointwise kernel with no vector path and three dims: x transposed in its last two dims plus y,
// [1024, 256, 256] float32 (256 MB each); each element's offsets are decomposed by the sizes, constants
// in the literal plan and run-time values with sizes as arguments (Note [CUDA size arguments]): the
// case where the two differ most. bytes_per_second over x and y read and the result written.
void transposed_add(benchmark::State& st, bool dynamic) {
  if (skip_without_gpu(st)) return;
  at::Tensor x = at::randn({1024, 256, 256}, at::kCUDA).transpose(1, 2), y = at::randn({1024, 256, 256}, at::kCUDA);
  fusion_jit::CompileOptions o;
  o.dynamic = dynamic ? "on" : "off";
  auto f = fusion_jit::trace(
      [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{(in[0] * 0.5 + in[1]).relu()}; }, {x, y}, o);
  std::vector<c10::IValue> args{x, y};
  f(args);
  sync();
  for (auto _ : st) {
    benchmark::DoNotOptimize(f(args));
    sync();
  }
  st.SetBytesProcessed(st.iterations() * 3 * x.numel() * 4);
}
void BM_CudaTransposedAddFused(benchmark::State& st) { transposed_add(st, false); }
void BM_CudaTransposedAddDynamic(benchmark::State& st) { transposed_add(st, true); }

// Host time per call, synchronizing every 64 calls outside the timed region.
template <class F>
void host_time(benchmark::State& st, F&& call) {
  double total_us = 0;
  int64_t n = 0;
  for (auto _ : st) {
    auto t0 = std::chrono::steady_clock::now();
    call();
    total_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (++n % 64 == 0) {
      st.PauseTiming();
      sync();
      st.ResumeTiming();
    }
  }
  sync();
  st.counters["host_us"] = total_us / static_cast<double>(std::max<int64_t>(n, 1));
}

void BM_CudaLaunchesEager(benchmark::State& st) {
  if (skip_without_gpu(st)) return;
  at::Tensor x = at::randn({kSmall}, at::kCUDA);
  host_time(st, [&] { benchmark::DoNotOptimize(chain10(x)); });
}

void BM_CudaReplay(benchmark::State& st) {
  if (skip_without_gpu(st)) return;
  at::Tensor x = at::randn({kSmall}, at::kCUDA);
  fusion_jit::CompileOptions o;
  o.enable_fusion = false;  // one kernel per op: a 10-kernel plan
  o.cuda_graphs = true;
  auto f = fusion_jit::trace([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{chain10(in[0])}; },
                             {x}, o);
  std::vector<c10::IValue> args{x};
  f(args);  // compile
  f(args);  // capture
  sync();
  host_time(st, [&] { benchmark::DoNotOptimize(f(args)); });
  st.SetLabel(std::to_string(f.plan_for(args)->kernels.size()) + " kernels, " +
              std::to_string(f.stats().graph_replays) + " replays");
}

// The reduction patterns of bench_reductions.py on [65536, 1024] float32 (256 MB per tensor): eager, and
// fused with bytes_per_second counting each input read once and each output written once, to compare with
// BM_CudaCopy's bandwidth (bar: 80%).
constexpr int64_t kRows = 65536, kCols = 1024;
using Pattern = std::vector<at::Tensor> (*)(const std::vector<at::Tensor>&);
std::vector<at::Tensor> softmax_masked(const std::vector<at::Tensor>& in) { return {at::softmax(in[0] * 0.125 + in[1], -1)}; }
std::vector<at::Tensor> layer_norm_res(const std::vector<at::Tensor>& in) {
  return {at::layer_norm(in[0] + in[2] + in[1], {kCols}, in[3], in[2])};
}
std::vector<at::Tensor> rms_norm_w(const std::vector<at::Tensor>& in) { return {at::rms_norm(in[0], {kCols}) * in[3]}; }
std::vector<at::Tensor> log_softmax_last(const std::vector<at::Tensor>& in) { return {at::log_softmax(in[0], -1)}; }
std::vector<at::Tensor> mean_var(const std::vector<at::Tensor>& in) { return {in[0].mean(-1), in[0].var(-1)}; }
std::vector<at::Tensor> gelu_mean(const std::vector<at::Tensor>& in) { return {at::gelu(in[0]).mean(-1)}; }

struct PatternCase {
  Pattern fn;
  int full_inputs;   // [kRows, kCols] inputs read
  int full_outputs;  // [kRows, kCols] outputs written
};

std::vector<at::Tensor> pattern_inputs() {
  return {at::randn({kRows, kCols}, at::kCUDA), at::randn({kRows, kCols}, at::kCUDA),
          at::randn({kCols}, at::kCUDA), at::rand({kCols}, at::kCUDA) + 0.5};
}

// fused: through fusion_jit; dynamic: with sizes as kernel arguments (Note [CUDA size arguments]), to
// compare with the same plan's literal sizes (bar: within 10%).
void run_pattern(benchmark::State& st, PatternCase c, bool fused, bool dynamic = false) {
  if (skip_without_gpu(st)) return;
  auto in = pattern_inputs();
  std::function<void()> call;
  std::optional<fusion_jit::CompiledModule> f;
  std::vector<c10::IValue> args(in.begin(), in.end());
  if (fused) {
    fusion_jit::CompileOptions o;
    o.dynamic = dynamic ? "on" : "off";
    f.emplace(fusion_jit::trace([c](const std::vector<at::Tensor>& x) { return c.fn(x); }, in, o));
    (*f)(args);
    call = [&] { benchmark::DoNotOptimize((*f)(args)); };
    st.SetLabel(std::to_string(f->plan_for(args)->kernels.size()) + " kernels");
  } else {
    call = [&] { benchmark::DoNotOptimize(c.fn(in)); };
  }
  call();
  sync();
  for (auto _ : st) {
    call();
    sync();
  }
  st.SetBytesProcessed(st.iterations() * (c.full_inputs + c.full_outputs) * kRows * kCols * 4);
}

const PatternCase kSoftmax{softmax_masked, 2, 1}, kLayerNorm{layer_norm_res, 2, 1}, kRmsNorm{rms_norm_w, 1, 1},
    kLogSoftmax{log_softmax_last, 1, 1}, kMeanVar{mean_var, 1, 0}, kGeluMean{gelu_mean, 1, 0};
#define FJ_PATTERN(name, c)                                                                   \
  void BM_Cuda##name##Eager(benchmark::State& st) { run_pattern(st, c, false); }             \
  void BM_Cuda##name##Fused(benchmark::State& st) { run_pattern(st, c, true); }              \
  BENCHMARK(BM_Cuda##name##Eager)->Unit(benchmark::kMillisecond)->UseRealTime();             \
  BENCHMARK(BM_Cuda##name##Fused)->Unit(benchmark::kMillisecond)->UseRealTime();
FJ_PATTERN(Softmax, kSoftmax)
FJ_PATTERN(LayerNorm, kLayerNorm)
FJ_PATTERN(RmsNorm, kRmsNorm)
FJ_PATTERN(LogSoftmax, kLogSoftmax)
FJ_PATTERN(MeanVar, kMeanVar)
FJ_PATTERN(GeluMean, kGeluMean)
void BM_CudaSoftmaxDynamic(benchmark::State& st) { run_pattern(st, kSoftmax, true, true); }
void BM_CudaLayerNormDynamic(benchmark::State& st) { run_pattern(st, kLayerNorm, true, true); }
BENCHMARK(BM_CudaSoftmaxDynamic)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CudaLayerNormDynamic)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CudaTransposedAddFused)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CudaTransposedAddDynamic)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK(BM_CudaCopy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CudaChainEager)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CudaChainFused)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_CudaLaunchesEager)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_CudaReplay)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
