// The conv probe (Note [Convolutions timed on this machine], passes/conv_common.h): a convolution's forms
// timed once per shape and thread count, kept in the kernel cache as the GEMM times are.
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
#include <ATen/ops/conv2d.h>
#include <c10/core/GradMode.h>

#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels_cache/kernels_cache.h"
#include "passes/conv_common.h"
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

// Values of order 1 made without a random generator: timing at plan build must not move the user's random
// stream (a seeded model would draw other numbers than eager's).
at::Tensor probe_values(const std::vector<int64_t>& sizes, at::ScalarType dtype = at::kFloat) {
  int64_t count = 1;
  for (int64_t s : sizes) count *= s;
  return at::arange(count, at::TensorOptions().dtype(at::kFloat)).remainder_(7.0).sub_(3.0).mul_(0.25).reshape(sizes).to(dtype);
}

// The median time of each of `forms` (microseconds): each called once untimed, then in turn, ABC CBA ...,
// so that the machine's drift falls on all alike; as many rounds as fit `budget_us` after the
// first, within [min_calls, max_calls].
std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& forms, double budget_us,
                                        int min_calls, int max_calls) {
  double first = 0;
  for (const auto& f : forms) first += time_us(f);
  const int calls = std::clamp(static_cast<int>(budget_us / std::max(first, 1.0)), min_calls, max_calls);
  std::vector<std::vector<double>> t(forms.size());
  for (int i = 0; i < calls; ++i)
    for (size_t j = 0; j < forms.size(); ++j) {
      const size_t f = i % 2 == 0 ? j : forms.size() - 1 - j;
      t[f].push_back(time_us(forms[f]));
    }
  std::vector<double> medians;
  for (auto& v : t) medians.push_back(median(std::move(v)));
  return medians;
}

std::optional<GemmTiming> measure(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked) {
  if (!at::hasMKLDNN() || (prepacked && !at::hasMKL())) return std::nullopt;
  c10::AutoGradMode no_grad(false);
  PooledAllocations pooled;  // as a plan's run allocates
  const at::Tensor x = probe_values({rows, k}), w = probe_values({n, k});
  const c10::IValue b = bias ? c10::IValue(probe_values({n})) : c10::IValue();
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
  const std::vector<double> t = interleaved_medians({[&] { mkl(); }, [&] { onednn(); }}, kBudgetUs, 3, kTimedCalls);
  return GemmTiming{t[0], t[1]};
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

std::string conv_timing_key(const ConvShape& s, int threads) {
  return cache_key({"conv-timing",
                    fmt::format("x [{}] w [{}] stride [{}] padding [{}] dilation [{}] groups {} {} bias {}",
                                fmt::join(s.x, ","), fmt::join(s.w, ","), fmt::join(s.stride, ","),
                                fmt::join(s.padding, ","), fmt::join(s.dilation, ","), s.groups, dtype_name(s.dtype),
                                s.bias),
                    std::string("torch ") + TORCH_VERSION, fmt::format("threads {}", threads), host_cpu_identity()});
}

std::optional<ConvTiming> parse_conv_timing(const std::string& text) {
  if (text.size() > 128) return std::nullopt;
  ConvTiming t;
  int used = 0;
  if (std::sscanf(text.c_str(), "%lf %lf %lf %lf\n%n", &t.aten_us, &t.onednn_cl_us, &t.onednn_nchw_us, &t.copy_us,
                  &used) != 4 ||
      used != static_cast<int>(text.size()))
    return std::nullopt;
  for (double us : {t.aten_us, t.onednn_cl_us, t.onednn_nchw_us, t.copy_us})
    if (!std::isfinite(us) || us <= 0 || us >= 1e9) return std::nullopt;
  return t;
}

namespace {

std::string format_timing(const GemmTiming& t) { return fmt::format("{:.3f} {:.3f}\n", t.mkl_us, t.onednn_us); }

std::string trimmed(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Times `measure` once per process and cache entry (a key of the kernel cache): read back where the cache
// has a valid entry (`parse`), measured and written (`format`) otherwise. `what` names it in the log.
// One measurement at a time: two would time each other.
template <typename T, typename Measure, typename Parse, typename Format>
std::optional<T> timed_once(const std::string& cache_entry, const std::string& what, const Measure& measure,
                            const Parse& parse, const Format& format) {
  static std::mutex mu;
  static std::map<std::string, std::optional<T>> memo;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = memo.find(cache_entry); it != memo.end()) return it->second;
  const bool use_cache = !Options::get().is_disabled("cache");
  std::optional<T> t;
  if (use_cache)
    if (auto text = KernelsCache::instance().get(cache_entry)) t = parse(*text);
  if (t) {
    log_info("{}: {} (from the kernel cache)", what, trimmed(format(*t)));
    memo.emplace(cache_entry, t);
    return t;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    t = measure();
  } catch (const std::exception& e) {
    log_warn("timing {} failed, the default kept: {}", what, e.what());
  }
  if (t) {
    log_info("{}: {} (measured in {:.1f} ms)", what, trimmed(format(*t)),
             std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (use_cache) KernelsCache::instance().put(cache_entry, format(*t));
  }
  memo.emplace(cache_entry, t);
  return t;
}

std::optional<GemmTiming> time_linear(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked) {
  const std::string what = fmt::format("gemm [{}, {}] x [{}, {}]{} ({} against oneDNN, us)", rows, k, k, n,
                                       bias ? " + bias" : "", prepacked ? "MKL packed" : "ATen");
  return timed_once<GemmTiming>(
      gemm_timing_key(rows, k, n, bias, prepacked, at::get_num_threads()), what,
      [&] { return measure(rows, k, n, bias, prepacked); }, parse_gemm_timing, format_timing);
}

// ---- Convolutions (Note [Convolutions timed on this machine], passes/conv_common.h) ----

// Timed calls of each form after one warm-up call each, fewer where one round is long.
constexpr int kConvTimedCalls = 5;
constexpr double kConvBudgetUs = 60000;

std::optional<ConvTiming> measure_conv(const ConvShape& s) {
  if (!at::hasMKLDNN() || !conv_rules::onednn_refuses(s.dtype).empty()) return std::nullopt;
  c10::AutoGradMode no_grad(false);
  PooledAllocations pooled;  // as a plan's run allocates
  const at::ScalarType dtype = s.dtype == DType::kBFloat16 ? at::kBFloat16 : at::kFloat;
  const at::Tensor x = probe_values(s.x, dtype), w = probe_values(s.w, dtype);
  const c10::IValue b = s.bias ? c10::IValue(probe_values({s.w[0]}, dtype)) : c10::IValue();
  const at::Tensor x_cl = x.contiguous(at::MemoryFormat::ChannelsLast);
  std::vector<int64_t> hint = s.x;  // the plan's reorder: the batch by octave (conv_rules::onednn_call)
  hint[0] = size_octave(hint[0]);
  const at::Tensor packed =
      call("mkldnn::_reorder_convolution_weight", {w, s.padding, s.stride, s.dilation, s.groups, hint});
  auto onednn = [&](const at::Tensor& in, const at::Tensor& weight) {
    return call("mkldnn::_convolution_pointwise", {in, weight, b, s.padding, s.stride, s.dilation, s.groups,
                                                   std::string("none"), c10::List<std::optional<at::Scalar>>(),
                                                   c10::IValue()});
  };
  const std::optional<at::Tensor> bias = s.bias ? std::optional<at::Tensor>(b.toTensor()) : std::nullopt;
  const at::Tensor y_cl = onednn(x_cl, packed);
  const std::vector<std::function<void()>> forms = {
      [&] { at::conv2d(x, w, bias, s.stride, s.padding, s.dilation, s.groups); },
      [&] { onednn(x_cl, packed); },
      [&] { onednn(x, w); },
      [&] { y_cl.contiguous(); },
  };
  const std::vector<double> t = interleaved_medians(forms, kConvBudgetUs, 1, kConvTimedCalls);
  return ConvTiming{t[0], t[1], t[2], t[3]};
}

std::string format_conv_timing(const ConvTiming& t) {
  return fmt::format("{:.3f} {:.3f} {:.3f} {:.3f}\n", t.aten_us, t.onednn_cl_us, t.onednn_nchw_us, t.copy_us);
}

std::optional<ConvTiming> time_conv(const ConvShape& s) {
  if (Options::get().is_disabled("conv_timing")) return std::nullopt;
  return time_convolution(s);
}

}  // namespace

std::optional<ConvTiming> time_convolution(const ConvShape& s) {
  if (s.x.size() != 4 || s.w.size() != 4 || (s.dtype != DType::kFloat32 && s.dtype != DType::kBFloat16)) return std::nullopt;
  const std::string what =
      fmt::format("conv x [{}] w [{}] stride [{}] padding [{}] dilation [{}] groups {} {}{} (ATen NCHW, oneDNN "
                  "channels-last, oneDNN NCHW, copy to NCHW, us)",
                  fmt::join(s.x, ", "), fmt::join(s.w, ", "), fmt::join(s.stride, ", "), fmt::join(s.padding, ", "),
                  fmt::join(s.dilation, ", "), s.groups, dtype_name(s.dtype), s.bias ? " + bias" : "");
  return timed_once<ConvTiming>(
      conv_timing_key(s, at::get_num_threads()), what, [&] { return measure_conv(s); }, parse_conv_timing,
      format_conv_timing);
}

namespace {

[[maybe_unused]] const bool g_gemm_probe_registered = (set_gemm_probe(&time_linear), true);
[[maybe_unused]] const bool g_conv_probe_registered = (set_conv_probe(&time_conv), true);

}  // namespace
}  // namespace fusion_jit
