// The gemm rules' probe (Note [GEMM backend measured on this machine], passes/gemm_rules.cpp): MKL's GEMM
// against oneDNN's, on a plain weight (ATen's addmm against mkldnn::_linear_pointwise) or on a frozen one
// (MKL's packed GEMM against oneDNN's reordered weight), timed on this machine once per linear shape and
// thread count, and kept
// in the kernel cache: a restarted process takes the same decision without timing again, so its rewritten
// graph, and with it the plan cache's key, are the same as the first process's.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/arange.h>
#include <c10/core/GradMode.h>

#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "kernels_cache/kernels_cache.h"
#include "passes/passes.h"
#include "support/hash.h"
#include "support/log.h"
#include "support/options.h"
#include "torch/executor.h"

namespace fusion_jit {
namespace {

// Timed calls of each candidate after one warm-up call each, alternating (ABBA...) so that the machine's
// drift falls on both; fewer where one call is long (the measurement stays within about 0.2 s).
constexpr int kTimedCalls = 7;
constexpr double kBudgetUs = 100000;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double time_us(const F& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// Boxed calls through the dispatcher: mkldnn:: and mkl:: ops have no C++ functions in ATen's headers.
at::Tensor call(const char* schema, std::vector<c10::IValue> args) {
  torch::jit::Stack s(std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
  c10::Dispatcher::singleton().findSchemaOrThrow(schema, "").callBoxed(&s);
  return s.at(0).toTensor();
}

std::optional<GemmTiming> measure(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked) {
  if (!at::hasMKLDNN() || (prepacked && !at::hasMKL())) return std::nullopt;
  c10::AutoGradMode no_grad(false);
  // Values of order 1 made without a random generator: timing at plan build must not move the user's
  // random stream (a seeded model would draw other numbers than eager's).
  auto values = [](std::vector<int64_t> sizes) {
    int64_t count = 1;
    for (int64_t s : sizes) count *= s;
    return at::arange(count, at::TensorOptions().dtype(at::kFloat)).remainder_(7.0).sub_(3.0).mul_(0.25).reshape(sizes);
  };
  const at::Tensor x = values({rows, k}), w = values({n, k});
  const c10::IValue b = bias ? c10::IValue(values({n})) : c10::IValue();
  // The frozen weight's two prepared forms, made once as the plan makes them.
  const at::Tensor mkl_w = prepacked ? call("mkl::_mkl_reorder_linear_weight", {w, rows}) : at::Tensor();
  const at::Tensor onednn_w = prepacked ? call("mkldnn::_reorder_linear_weight", {w, rows}) : w;
  auto mkl = [&] {
    if (prepacked) return call("mkl::_mkl_linear", {x, mkl_w, w, b, rows});
    return bias ? at::addmm(b.toTensor(), x, w.t()) : at::mm(x, w.t());
  };
  auto onednn = [&] {
    return call("mkldnn::_linear_pointwise",
                {x, onednn_w, b, std::string("none"), c10::List<std::optional<at::Scalar>>(), c10::IValue()});
  };
  const double first = time_us(mkl) + time_us(onednn);
  const int calls = std::clamp(static_cast<int>(kBudgetUs / std::max(first, 1.0)), 3, kTimedCalls);
  std::vector<double> a, o;
  for (int i = 0; i < calls; ++i) {
    if (i % 2 == 0) {
      a.push_back(time_us(mkl));
      o.push_back(time_us(onednn));
    } else {
      o.push_back(time_us(onednn));
      a.push_back(time_us(mkl));
    }
  }
  return GemmTiming{median(a), median(o)};
}

}  // namespace

// The kernel cache's entry for a shape's timings: this CPU (model and flags), torch's version (its oneDNN
// and MKL), the thread count.
std::string gemm_timing_key(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked, int threads) {
  return cache_key({"gemm-timing",
                    fmt::format("[{}, {}] x [{}, {}] bias {} prepacked {}", rows, k, k, n, bias, prepacked),
                    std::string("torch ") + TORCH_VERSION, fmt::format("threads {}", threads), host_cpu_identity()});
}

// An entry read back: two positive finite numbers of microseconds and nothing else, or nothing (the bytes
// come from disk or from the fleet's cache: a bad entry is timed again and written over).
std::optional<GemmTiming> parse_gemm_timing(const std::string& text) {
  if (text.size() > 64) return std::nullopt;
  double a = 0, o = 0;
  int used = 0;
  if (std::sscanf(text.c_str(), "%lf %lf\n%n", &a, &o, &used) != 2 || used != static_cast<int>(text.size()))
    return std::nullopt;
  auto ok = [](double us) { return std::isfinite(us) && us > 0 && us < 1e9; };
  if (!ok(a) || !ok(o)) return std::nullopt;
  return GemmTiming{a, o};
}

namespace {

std::string format_timing(const GemmTiming& t) { return fmt::format("{:.3f} {:.3f}\n", t.mkl_us, t.onednn_us); }

std::optional<GemmTiming> time_linear(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked) {
  // One measurement at a time (two would time each other), each shape once per process.
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, int>, std::optional<GemmTiming>> memo;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(rows, k, n, bias, prepacked, at::get_num_threads());
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  const bool use_cache = !Options::get().is_disabled("cache");
  const std::string cache_entry = gemm_timing_key(rows, k, n, bias, prepacked, std::get<5>(key));
  std::optional<GemmTiming> t;
  if (use_cache)
    if (auto text = KernelsCache::instance().get(cache_entry)) t = parse_gemm_timing(*text);
  if (t) {
    log_info("gemm: [{}, {}] x [{}, {}]{}: {} {:.1f} us, oneDNN {:.1f} us (from the kernel cache)", rows, k, k, n,
             bias ? " + bias" : "", prepacked ? "MKL packed" : "ATen", t->mkl_us, t->onednn_us);
    memo.emplace(key, t);
    return t;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    t = measure(rows, k, n, bias, prepacked);
  } catch (const std::exception& e) {
    log_warn("timing a linear [{}, {}] x [{}, {}] failed, MKL's GEMM kept: {}", rows, k, k, n, e.what());
  }
  if (t) {
    log_info("gemm: [{}, {}] x [{}, {}]{}: {} {:.1f} us, oneDNN {:.1f} us (measured in {:.1f} ms)", rows, k, k, n,
             bias ? " + bias" : "", prepacked ? "MKL packed" : "ATen", t->mkl_us, t->onednn_us,
             std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (use_cache) KernelsCache::instance().put(cache_entry, format_timing(*t));
  }
  memo.emplace(key, t);
  return t;
}

[[maybe_unused]] const bool g_gemm_probe_registered = (set_gemm_probe(&time_linear), true);

}  // namespace
}  // namespace fusion_jit
