#include "cost/cost_model.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "cost/calibration.h"

namespace fusion_jit {

DeviceDescription default_host_cpu_description() {
  DeviceDescription d;
  d.name = "host-cpu";
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  d.cores = n > 0 ? static_cast<int>(n) : 1;
  d.gflops = 25.0 * d.cores;
  return d;
}

DeviceDescription host_cpu_description() {
  const std::optional<Calibration> c = host_calibration();
  return c ? calibrated(default_host_cpu_description(), *c) : default_host_cpu_description();
}

DeviceDescription cuda_gpu_description(int sm_count) {
  DeviceDescription d;
  d.name = "cuda-gpu";
  d.cores = sm_count > 0 ? sm_count : 132;
  d.memory_gbps = 3000.0;
  d.gflops = 50000.0 * d.cores / 132.0;
  d.launch_us = 5.0;
  d.on_chip_row_bytes = 64 * 1024;
  return d;
}

double RooflineCostModel::estimate_us(const WorkEstimate& w) const {
  double memory_us = static_cast<double>(w.bytes) / (d_.memory_gbps * 1e3);
  double compute_us = static_cast<double>(w.flops) / (d_.gflops * 1e3);
  return memory_us + compute_us - d_.overlap * std::min(memory_us, compute_us) + w.launches * d_.launch_us;
}

LayoutEstimate channels_last_estimate(const DeviceDescription& d, int64_t written, int64_t weights, int64_t copied,
                                      int64_t edges) {
  LayoutEstimate e;
  e.gain_us = static_cast<double>(written) * d.cl_gain_ns_per_written / 1000.0;
  e.cost_us = (static_cast<double>(weights) * d.cl_ns_per_weight + static_cast<double>(copied) * d.cl_ns_per_copied +
               static_cast<double>(edges) * d.cl_ns_per_edge) /
              1000.0;
  return e;
}

std::string describe_device(const DeviceDescription& d) {
  return fmt::format("{} ({}): {:.1f} GB/s, {:.0f} GFLOP/s, {:.2f} us per kernel", d.name,
                     d.calibration.empty() ? "defaults" : "calibration " + d.calibration, d.memory_gbps, d.gflops,
                     d.launch_us);
}

std::string format_bytes(int64_t b) {
  if (b >= (1 << 20)) return fmt::format("{:.1f} MB", b / 1048576.0);
  if (b >= 1024) return fmt::format("{:.1f} KB", b / 1024.0);
  return fmt::format("{} B", b);
}

}  // namespace fusion_jit
