#include "cost/kernel_time.h"

#include <algorithm>
#include <cmath>

namespace fusion_jit {
namespace {

// The defaults: `fusion-jit calibrate` on this project's 2-core machine (AMD EPYC, 2 threads; bench/
// RESULTS.md, "Kernel times").
TimeFigures default_figures() {
  TimeFigures f;
  f.streams = {{32 << 10, 115.7, 115.8},
               {256 << 10, 87.7, 94.5},
               {2 << 20, 80.0, 79.4},
               {16 << 20, 48.1, 63.6},
               {int64_t{128} << 20, 21.5, 22.7}};
  f.kernel_us = 0.01;
  f.parallel_kernel_us = 2.58;
  f.kernel_step_us = 0.39;
  f.aten_step_us = 1.67;
  f.gemm_gflops = 180.0;
  f.conv_step_us = 7.6;
  f.op_ns = {{"exp", 0.22}, {"log", 0.25},  {"tanh", 0.35}, {"sigmoid", 0.27},
             {"sin", 0.22}, {"erf", 0.56},  {"sqrt", 0.10}, {"reciprocal", 0.03}};
  return f;
}

int64_t ceil_div(int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : a; }

}  // namespace

// A step's measured time less its probe's traffic (kStepProbeBytes at the smallest working set's
// bandwidth): what the step costs beyond its data.
double step_dispatch_us(const TimeFigures& f, double step_us) {
  return std::max(f.kernel_us, step_us - static_cast<double>(kStepProbeBytes) / (bandwidth_gbps(f, kStepProbeBytes, false) * 1e3));
}

namespace {

}  // namespace

TimeFigures time_figures(const std::optional<Calibration>& c, int threads, int64_t grain) {
  TimeFigures f = default_figures();
  f.threads = std::max(1, threads);
  f.grain = std::max<int64_t>(1, grain);
  if (!c) return f;
  if (!c->streams.empty()) f.streams = c->streams;
  if (c->kernel_us > 0) f.kernel_us = c->kernel_us;
  if (c->parallel_kernel_us > 0) f.parallel_kernel_us = c->parallel_kernel_us;
  if (c->aten_step_us > 0) f.aten_step_us = c->aten_step_us;
  if (c->kernel_step_us > 0) f.kernel_step_us = c->kernel_step_us;
  if (c->gemm_gflops > 0) f.gemm_gflops = c->gemm_gflops;
  if (c->conv_step_us > 0) f.conv_step_us = c->conv_step_us;
  for (const auto& [op, ns] : c->op_ns) f.op_ns[op] = ns;
  f.calibration = c->fingerprint();
  return f;
}

TimeFigures host_time_figures(int threads, int64_t grain) { return time_figures(host_calibration(), threads, grain); }

double bandwidth_gbps(const TimeFigures& f, int64_t bytes, bool split) {
  if (f.streams.empty()) return 20.0;
  auto at = [&](size_t i) { return split ? f.streams[i].gbps_n : f.streams[i].gbps_1; };
  if (bytes <= f.streams.front().bytes) return at(0);
  for (size_t i = 1; i < f.streams.size(); ++i) {
    if (bytes > f.streams[i].bytes) continue;
    const double lo = std::log(static_cast<double>(f.streams[i - 1].bytes));
    const double hi = std::log(static_cast<double>(f.streams[i].bytes));
    const double t = (std::log(static_cast<double>(bytes)) - lo) / (hi - lo);
    return at(i - 1) + t * (at(i) - at(i - 1));
  }
  return at(f.streams.size() - 1);
}

std::vector<std::string> op_classes_of_call(const std::string& call) {
  std::string fn = call.rfind("fj_", 0) == 0 ? call.substr(3) : call;
  static const std::map<std::string, std::vector<std::string>> kClasses = {
      {"exp", {"exp"}},           {"exp2", {"exp"}},          {"expm1", {"exp"}},
      {"exp_inline", {"exp"}},    {"elu", {"exp"}},           {"log", {"log"}},
      {"log2", {"log"}},          {"log1p", {"log"}},         {"tanh", {"tanh"}},
      {"gelu_tanh", {"tanh"}},    {"sigmoid", {"sigmoid"}},   {"silu", {"sigmoid"}},
      {"sin", {"sin"}},           {"cos", {"sin"}},           {"tan", {"sin"}},
      {"erf", {"erf"}},           {"gelu", {"erf"}},          {"gelu_erf", {"erf"}},
      {"erf_as", {"erf"}},        {"gelu_as", {"erf"}},       {"gelu_poly", {"erf"}},
      {"sqrt", {"sqrt"}},         {"rsqrt", {"sqrt"}},        {"reciprocal", {"reciprocal"}},
      {"div", {"reciprocal"}},    {"softplus", {"exp", "log"}}, {"pow", {"exp", "log"}},
      {"mish", {"tanh", "exp", "log"}}};
  auto it = kClasses.find(fn);
  return it == kClasses.end() ? std::vector<std::string>{} : it->second;
}

TimePrediction predict_kernel(const KernelFacts& k, const TimeFigures& f) {
  TimePrediction p;
  // The launch's chunks: ranges of about `grain` elements (codegen/target.h), never fewer than one unit.
  const int64_t unit_grain = std::max<int64_t>(1, f.grain / std::max<int64_t>(1, k.elements_per_unit));
  const bool split = f.threads > 1 && k.range > unit_grain;
  p.threads = split ? static_cast<int>(std::min<int64_t>(f.threads, ceil_div(k.range, unit_grain))) : 1;
  p.dispatch_us = step_dispatch_us(f, f.kernel_step_us) + (split ? std::max(0.0, f.parallel_kernel_us - f.kernel_us) : 0.0);
  p.memory_us = static_cast<double>(k.bytes) / (bandwidth_gbps(f, k.bytes, split) * 1e3);
  if (k.reread_bytes > 0)
    p.memory_us += static_cast<double>(k.reread_bytes) / (bandwidth_gbps(f, std::max<int64_t>(1, k.row_bytes), split) * 1e3);
  double ns = 0;
  for (const auto& [op, count] : k.op_counts) {
    auto it = f.op_ns.find(op);
    if (it != f.op_ns.end()) ns += it->second * static_cast<double>(count);
  }
  p.compute_us = ns / p.threads / 1e3;
  p.us = p.dispatch_us + p.memory_us + p.compute_us;
  return p;
}

TimePrediction predict_aten_step(const StepFacts& s, const TimeFigures& f) {
  TimePrediction p;
  p.dispatch_us = step_dispatch_us(f, f.aten_step_us);
  if (s.compute) {
    // The flops at the GEMM rate or the operands' bytes from memory, whichever is longer (a GEMV's
    // weights), and a convolution's fixed cost.
    p.compute_us = s.flops / (std::max(1e-3, f.gemm_gflops) * 1e3);
    p.memory_us = static_cast<double>(s.bytes) / (bandwidth_gbps(f, s.bytes, true) * 1e3);
    if (p.memory_us > p.compute_us) p.compute_us = 0;
    else p.memory_us = 0;
    p.compute_us += s.conv ? f.conv_step_us : 0.0;
    p.threads = f.threads;
  } else if (!s.view) {
    // ATen's elementwise loops split at its own grain (32768 elements, about 128 KB of float32).
    const bool split = f.threads > 1 && s.bytes > (int64_t{256} << 10);
    p.threads = split ? f.threads : 1;
    p.memory_us = static_cast<double>(s.bytes) / (bandwidth_gbps(f, s.bytes, split) * 1e3);
  }
  p.us = p.dispatch_us + p.memory_us + p.compute_us;
  return p;
}

}  // namespace fusion_jit
