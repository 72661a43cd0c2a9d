// The gemm rules' probe (Note [GEMM backend measured on this machine], passes/conv_rules.cpp): ATen's GEMM
// against oneDNN's on a plain weight, timed on this machine once per linear shape and thread count.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "passes/passes.h"
#include "support/log.h"

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

std::optional<GemmTiming> measure(int64_t rows, int64_t k, int64_t n, bool bias) {
  if (!at::hasMKLDNN()) return std::nullopt;
  c10::AutoGradMode no_grad(false);
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor x = at::randn({rows, k}, opts), w = at::randn({n, k}, opts);
  const at::Tensor b = bias ? at::randn({n}, opts) : at::Tensor();
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  auto aten = [&] { return bias ? at::addmm(b, x, w.t()) : at::mm(x, w.t()); };
  auto onednn = [&] {
    torch::jit::Stack s;
    s.emplace_back(x);
    s.emplace_back(w);
    s.emplace_back(bias ? c10::IValue(b) : c10::IValue());
    s.emplace_back(std::string("none"));
    s.emplace_back(c10::List<std::optional<at::Scalar>>());
    s.emplace_back(c10::IValue());
    op.callBoxed(&s);
  };
  const double first = time_us(aten) + time_us(onednn);
  const int calls = std::clamp(static_cast<int>(kBudgetUs / std::max(first, 1.0)), 3, kTimedCalls);
  std::vector<double> a, o;
  for (int i = 0; i < calls; ++i) {
    if (i % 2 == 0) {
      a.push_back(time_us(aten));
      o.push_back(time_us(onednn));
    } else {
      o.push_back(time_us(onednn));
      a.push_back(time_us(aten));
    }
  }
  return GemmTiming{median(a), median(o)};
}

std::optional<GemmTiming> time_linear(int64_t rows, int64_t k, int64_t n, bool bias) {
  // One measurement at a time (two would time each other), each shape once per process.
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t, bool, int>, std::optional<GemmTiming>> memo;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(rows, k, n, bias, at::get_num_threads());
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  std::optional<GemmTiming> t;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    t = measure(rows, k, n, bias);
  } catch (const std::exception& e) {
    log_warn("timing a linear [{}, {}] x [{}, {}] failed, ATen's GEMM kept: {}", rows, k, k, n, e.what());
  }
  if (t)
    log_info("gemm: [{}, {}] x [{}, {}]{}: ATen {:.1f} us, oneDNN {:.1f} us (measured in {:.1f} ms)", rows, k, k, n,
             bias ? " + bias" : "", t->aten_us, t->onednn_us,
             std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  memo.emplace(key, t);
  return t;
}

[[maybe_unused]] const bool g_gemm_probe_registered = (set_gemm_probe(&time_linear), true);

}  // namespace
}  // namespace fusion_jit
