#include "cost/calibration.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "support/hash.h"

namespace fusion_jit {
namespace {

std::mutex g_mu;
std::optional<Calibration>& installed() {
  static auto* c = new std::optional<Calibration>();
  return *c;
}

}  // namespace

std::string Calibration::fingerprint() const {
  std::string text = fmt::format("{} {} {} {} {} {}", machine, threads, kernel_us, parallel_kernel_us, aten_step_us,
                                 vector_floats);
  if (gemm_gflops > 0) text += fmt::format(" gemm:{}", gemm_gflops);
  if (kernel_step_us > 0) text += fmt::format(" kstep:{}", kernel_step_us);
  if (conv_step_us > 0) text += fmt::format(" conv:{}", conv_step_us);
  for (const Stream& s : streams) text += fmt::format(" {}:{}:{}", s.bytes, s.gbps_1, s.gbps_n);
  std::vector<std::pair<std::string, double>> ops = op_ns;  // in any order (JSON keeps them by name)
  std::sort(ops.begin(), ops.end());
  for (const auto& [op, ns] : ops) text += fmt::format(" {}:{}", op, ns);
  return sha256_hex(text).substr(0, 16);
}

std::string calibration_machine() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  std::string cpu = host_cpu_identity();  // "model name\t: NAME | FLAGS-HASH" from /proc/cpuinfo
  if (const size_t colon = cpu.find(": "); cpu.rfind("model name", 0) == 0 && colon != std::string::npos)
    cpu = cpu.substr(colon + 2);
  return fmt::format("{} | {} cores", cpu, n > 0 ? n : 1);
}

DeviceDescription calibrated(DeviceDescription d, const Calibration& c) {
  if (!c.streams.empty() && c.streams.back().gbps_n > 0) d.memory_gbps = c.streams.back().gbps_n;
  if (c.parallel_kernel_us > 0) d.launch_us = c.parallel_kernel_us;
  double sum = 0;
  int n = 0;
  for (const auto& [op, ns] : c.op_ns)
    if (ns > 0) sum += ns, ++n;
  if (n > 0) d.gflops = 20.0 / (sum / n) * std::max(1, c.threads);
  if (c.aten_step_us > 0) d.aten_step_us = c.aten_step_us;
  d.calibration = c.fingerprint();
  return d;
}

void install_host_calibration(std::optional<Calibration> c) {
  std::lock_guard<std::mutex> g(g_mu);
  installed() = std::move(c);
}

std::optional<Calibration> host_calibration() {
  std::lock_guard<std::mutex> g(g_mu);
  return installed();
}

}  // namespace fusion_jit
