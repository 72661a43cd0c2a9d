#include "driver/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "cost/kernel_time.h"
#include "driver/build_plan.h"
#include "kernels_cache/kernels_cache.h"
#include "support/error.h"
#include "support/hash.h"
#include "support/log.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

using Clock = std::chrono::steady_clock;

double elapsed_us(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Microseconds per call of `fn`: the median over batches of calls that each take at least 1 ms (at least
// 5 batches, more while `budget_ms` lasts), after one call that warms caches and loads the kernels.
double time_us(const std::function<void()>& fn, double budget_ms = 30) {
  fn();
  int64_t reps = 1;
  for (;;) {
    auto t0 = Clock::now();
    for (int64_t i = 0; i < reps; ++i) fn();
    if (elapsed_us(t0) >= 1000 || reps >= (int64_t{1} << 24)) break;
    reps *= 4;
  }
  std::vector<double> per_call;
  auto start = Clock::now();
  while (per_call.size() < 5 || (elapsed_us(start) < budget_ms * 1000 && per_call.size() < 200)) {
    auto t0 = Clock::now();
    for (int64_t i = 0; i < reps; ++i) fn();
    per_call.push_back(elapsed_us(t0) / static_cast<double>(reps));
  }
  std::nth_element(per_call.begin(), per_call.begin() + per_call.size() / 2, per_call.end());
  return per_call[per_call.size() / 2];
}

// A one-op kernel over f32[s0], compiled once for every size (its size is an argument), and buffers to
// run an instance of it on.
class OpKernel {
 public:
  explicit OpKernel(const std::string& op) : op_(op) {
    auto g = parse_graph(fmt::format("graph[s0=65536](%0 : f32[s0]):\n  %1 : f32[s0] = {}\n  return (%1)\n", op));
    verify_graph(*g);
    PlanTarget target;
    target.size_args = true;
    ShapeGuards guards;  // the class's decisions (int32 offsets: its sizes stay far below the bound)
    {
      GuardScope scope(guards);
      cls_ = build_plan(std::move(g), target);
    }
    FJ_CHECK(cls_->kernels.size() == 1 && cls_->steps.size() == 1,
             "calibration: {} did not become one kernel ({} kernels, {} steps)", op, cls_->kernels.size(),
             cls_->steps.size());
  }

  // Microseconds of one call over `n` elements, split by `ctx`.
  double time_at(int64_t n, const LaunchContext& ctx) {
    auto plan = instantiate_plan(*cls_, {{"s0", n}});
    std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) in[static_cast<size_t>(i)] = 0.5f + static_cast<float>(i % 1024) / 683.0f;
    const KernelSpec& spec = plan->kernels[0].spec;
    std::vector<void*> buffers;
    for (const KernelBuffer& b : spec.buffers) buffers.push_back(b.is_output ? out.data() : in.data());
    return time_us([&] { plan->launch(0, 0, buffers.data(), ctx); });
  }

 private:
  std::string op_;
  std::unique_ptr<ExecutablePlan> cls_;
};

int vector_floats_of_this_cpu() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    line += ' ';
    if (line.find(" avx512f ") != std::string::npos) return 16;
    if (line.find(" avx2 ") != std::string::npos || line.find(" avx ") != std::string::npos) return 8;
    return 4;
  }
  return 4;
}

// The op classes measured, as the one-op kernels that stand for them.
const std::vector<std::pair<std::string, std::string>>& op_classes() {
  static const std::vector<std::pair<std::string, std::string>> ops = {
      {"exp", "aten::exp(%0)"},         {"log", "aten::log(%0)"},   {"tanh", "aten::tanh(%0)"},
      {"sigmoid", "aten::sigmoid(%0)"}, {"sin", "aten::sin(%0)"},   {"erf", "aten::erf(%0)"},
      {"sqrt", "aten::sqrt(%0)"},       {"reciprocal", "aten::reciprocal(%0)"},
  };
  return ops;
}

constexpr int kFormat = 1;

bool finite_in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

}  // namespace

Calibration calibrate_host(const CalibrateOptions& options) {
  const auto start = Clock::now();
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  Calibration c;
  c.machine = calibration_machine();
  c.threads = options.parallel_for ? std::max(1, options.threads) : 1;
  c.vector_floats = vector_floats_of_this_cpu();
  LaunchContext serial;
  serial.grain = int64_t{1} << 62;
  LaunchContext parallel = serial;
  if (options.parallel_for) {
    parallel.parallel_for = options.parallel_for;
    parallel.grain = Options::get().cpu_grain;
  }

  say("compiling the calibration kernels (one per op class; cached after the first run)");
  OpKernel copy("aten::neg(%0)");
  std::vector<std::pair<std::string, std::unique_ptr<OpKernel>>> ops;
  for (const auto& [name, op] : op_classes()) ops.emplace_back(name, std::make_unique<OpKernel>(op));
  say(fmt::format("compiled in {:.1f} s", elapsed_us(start) / 1e6));

  // Working sets (bytes read plus written) from L1 to memory.
  for (int64_t bytes : {int64_t{32} << 10, int64_t{256} << 10, int64_t{2} << 20, int64_t{16} << 20,
                        int64_t{128} << 20}) {
    const int64_t n = bytes / 8;
    Calibration::Stream s;
    s.bytes = bytes;
    s.gbps_1 = static_cast<double>(bytes) / (copy.time_at(n, serial) * 1e3);
    s.gbps_n = c.threads > 1 ? static_cast<double>(bytes) / (copy.time_at(n, parallel) * 1e3) : s.gbps_1;
    c.streams.push_back(s);
    say(fmt::format("stream {}: {:.1f} GB/s on 1 thread, {:.1f} GB/s on {}", format_bytes(bytes), s.gbps_1, s.gbps_n,
                    c.threads));
  }

  c.kernel_us = copy.time_at(1, serial);
  c.parallel_kernel_us = c.kernel_us;
  if (c.threads > 1) {
    // Two chunks of the pool's grain: what splitting costs beyond the work itself.
    const int64_t n = std::min<int64_t>(2 * parallel.grain, int64_t{1} << 22);  // FUSION_JIT_CPU_GRAIN has no cap
    const double split = copy.time_at(n, parallel), alone = copy.time_at(n, serial);
    c.parallel_kernel_us = c.kernel_us + std::max(0.0, split - alone / c.threads);
  }
  say(fmt::format("kernel dispatch: {:.2f} us serial, {:.2f} us split across {} threads", c.kernel_us,
                  c.parallel_kernel_us, c.threads));
  if (options.aten_step_us) {
    c.aten_step_us = options.aten_step_us();
    say(fmt::format("ATen step: {:.2f} us", c.aten_step_us));
  }
  if (options.kernel_step_us) {
    c.kernel_step_us = options.kernel_step_us();
    say(fmt::format("kernel step of the run loop: {:.2f} us", c.kernel_step_us));
  }
  if (options.gemm_gflops) {
    c.gemm_gflops = options.gemm_gflops();
    say(fmt::format("ATen GEMM (512x512x512, {} threads): {:.1f} GFLOP/s", c.threads, c.gemm_gflops));
  }
  if (options.conv_step_us) {
    c.conv_step_us = options.conv_step_us(c.gemm_gflops > 0 ? c.gemm_gflops : 100.0);
    say(fmt::format("convolution step beyond its flops: {:.2f} us", c.conv_step_us));
  }

  // Op classes over 16K elements (128 KB in and out: in L2), one thread, beyond a copy's time.
  const int64_t n = 16384;
  const double base = copy.time_at(n, serial);
  for (auto& [name, kernel] : ops) {
    const double ns = std::max(0.0, (kernel->time_at(n, serial) - base) * 1e3 / static_cast<double>(n));
    c.op_ns.emplace_back(name, ns);
  }
  std::string line = "op classes (ns per element beyond a copy):";
  for (const auto& [name, ns] : c.op_ns) line += fmt::format(" {} {:.2f}", name, ns);
  say(line);
  c.seconds = elapsed_us(start) / 1e6;
  return c;
}

std::string calibration_to_json(const Calibration& c) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["machine"] = c.machine;
  j["threads"] = c.threads;
  nlohmann::json streams = nlohmann::json::array();
  for (const auto& s : c.streams) streams.push_back({{"bytes", s.bytes}, {"gbps_1", s.gbps_1}, {"gbps_n", s.gbps_n}});
  j["streams"] = streams;
  j["kernel_us"] = c.kernel_us;
  j["parallel_kernel_us"] = c.parallel_kernel_us;
  j["aten_step_us"] = c.aten_step_us;
  j["gemm_gflops"] = c.gemm_gflops;
  j["kernel_step_us"] = c.kernel_step_us;
  j["conv_step_us"] = c.conv_step_us;
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [name, ns] : c.op_ns) ops[name] = ns;
  j["op_ns"] = ops;
  j["vector_floats"] = c.vector_floats;
  j["seconds"] = c.seconds;
  return j.dump(1);
}

std::optional<Calibration> calibration_from_json(const std::string& text, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<Calibration> {
    *why = w;
    return std::nullopt;
  };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return fail("not a JSON object");
  auto number = [&](const nlohmann::json& o, const char* key, double lo, double hi, double* out) {
    if (!o.contains(key) || !o[key].is_number()) return false;
    *out = o[key].get<double>();
    return finite_in(*out, lo, hi);
  };
  double v = 0;
  if (!number(j, "format", kFormat, kFormat, &v)) return fail("format is not " + std::to_string(kFormat));
  Calibration c;
  if (!j.contains("machine") || !j["machine"].is_string()) return fail("no machine");
  c.machine = j["machine"].get<std::string>();
  auto whole = [](double x) { return x == std::floor(x); };
  if (!number(j, "threads", 1, 4096, &v) || !whole(v)) return fail("threads missing or out of range");
  c.threads = static_cast<int>(v);
  if (!j.contains("streams") || !j["streams"].is_array() || j["streams"].empty() || j["streams"].size() > 64)
    return fail("streams missing");
  for (const auto& s : j["streams"]) {
    Calibration::Stream st;
    double bytes = 0;
    if (!s.is_object() || !number(s, "bytes", 1, 1e13, &bytes) || !number(s, "gbps_1", 1e-3, 1e5, &st.gbps_1) ||
        !number(s, "gbps_n", 1e-3, 1e5, &st.gbps_n))
      return fail("a stream entry is malformed or out of range");
    if (!whole(bytes) || (!c.streams.empty() && bytes <= static_cast<double>(c.streams.back().bytes)))
      return fail("stream working sets are not whole, increasing numbers of bytes");
    st.bytes = static_cast<int64_t>(bytes);
    c.streams.push_back(st);
  }
  if (!number(j, "kernel_us", 1e-4, 1e5, &c.kernel_us) ||
      !number(j, "parallel_kernel_us", 1e-4, 1e5, &c.parallel_kernel_us))
    return fail("kernel times missing or out of range");
  if (!number(j, "aten_step_us", -1, 1e5, &c.aten_step_us)) return fail("aten_step_us out of range");
  // Absent from records stored before it was measured: not measured.
  if (j.contains("gemm_gflops") && !number(j, "gemm_gflops", -1, 1e7, &c.gemm_gflops))
    return fail("gemm_gflops out of range");
  if (j.contains("kernel_step_us") && !number(j, "kernel_step_us", -1, 1e5, &c.kernel_step_us))
    return fail("kernel_step_us out of range");
  if (j.contains("conv_step_us") && !number(j, "conv_step_us", -1, 1e6, &c.conv_step_us))
    return fail("conv_step_us out of range");
  if (!j.contains("op_ns") || !j["op_ns"].is_object() || j["op_ns"].size() > 64) return fail("op_ns missing");
  for (const auto& [name, ns] : j["op_ns"].items()) {
    if (!ns.is_number() || !finite_in(ns.get<double>(), 0, 1e5)) return fail("op_ns " + name + " out of range");
    c.op_ns.emplace_back(name, ns.get<double>());
  }
  if (!number(j, "vector_floats", 1, 64, &v) || !whole(v)) return fail("vector_floats out of range");
  c.vector_floats = static_cast<int>(v);
  if (!number(j, "seconds", 0, 1e5, &c.seconds)) return fail("seconds out of range");
  return c;
}

std::string calibration_key() {
  return cache_key({"calibration", calibration_machine(), "", fmt::format("format {}", kFormat), host_cpu_identity()});
}

void store_calibration(const Calibration& c) {
  FJ_CHECK(!Options::get().is_disabled("cache"), "the kernel cache is disabled (FUSION_JIT_DISABLE=cache): "
                                                 "there is nowhere to keep the calibration");
  std::string why;
  FJ_CHECK(calibration_from_json(calibration_to_json(c), &why), "the calibration measured is not plausible: {}", why);
  KernelsCache& cache = KernelsCache::instance();
  FJ_CHECK(cache.writable(), "cannot store the calibration: the kernel cache is not usable ({})",
           cache.unusable_reason());
  cache.put(calibration_key(), calibration_to_json(c));
}

std::optional<Calibration> load_calibration() {
  if (Options::get().is_disabled("cache")) return std::nullopt;
  const std::optional<std::string> text = KernelsCache::instance().get_record(calibration_key());
  if (!text) return std::nullopt;
  std::string why;
  std::optional<Calibration> c = calibration_from_json(*text, &why);
  if (c && c->machine != calibration_machine()) why = "it was measured on another machine (" + c->machine + ")";
  if (!why.empty()) {
    log_warn("the stored calibration is not used: {}; `fusion-jit calibrate` measures this machine again", why);
    return std::nullopt;
  }
  return c;
}

void install_stored_calibration() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!Options::get().is_disabled("calibration")) install_host_calibration(load_calibration());
  });
}

std::string format_calibration(const Calibration& c) {
  const DeviceDescription d = default_host_cpu_description();
  const DeviceDescription m = calibrated(d, c);
  std::string out = fmt::format("calibration of {} ({} threads, measured in {:.1f} s):\n", c.machine, c.threads,
                                c.seconds);
  out += fmt::format("  {:<28} {:>12} {:>12}\n", "constant", "measured", "default");
  out += fmt::format("  {:<28} {:>12.1f} {:>12.1f}\n", "memory bandwidth, GB/s", m.memory_gbps, d.memory_gbps);
  out += fmt::format("  {:<28} {:>12.2f} {:>12.2f}\n", "kernel launch, us", m.launch_us, d.launch_us);
  out += fmt::format("  {:<28} {:>12.2f} {:>12.2f}\n", "ATen step, us", m.aten_step_us, d.aten_step_us);
  out += fmt::format("  {:<28} {:>12.1f} {:>12.1f}\n", "expensive-op GFLOP/s", m.gflops, d.gflops);
  const TimeFigures tf = time_figures(c, c.threads, Options::get().cpu_grain);
  const TimeFigures td = time_figures(std::nullopt, c.threads, Options::get().cpu_grain);
  out += fmt::format("  {:<28} {:>12.1f} {:>12.1f}\n", "ATen GEMM GFLOP/s", tf.gemm_gflops, td.gemm_gflops);
  out += fmt::format("  {:<28} {:>12.2f} {:>12.2f}\n", "kernel step, us", tf.kernel_step_us, td.kernel_step_us);
  out += fmt::format("  {:<28} {:>12.2f} {:>12.2f}\n", "convolution step, us", tf.conv_step_us, td.conv_step_us);
  out += "  streaming bandwidth by working set (GB/s, 1 thread / all):";
  for (const auto& s : c.streams) out += fmt::format(" {} {:.1f}/{:.1f};", format_bytes(s.bytes), s.gbps_1, s.gbps_n);
  out += fmt::format("\n  serial kernel {:.2f} us; vector width {} floats\n  op classes, ns per element beyond a copy:",
                     c.kernel_us, c.vector_floats);
  for (const auto& [name, ns] : c.op_ns) out += fmt::format(" {} {:.2f};", name, ns);
  return out + "\n";
}

}  // namespace fusion_jit
