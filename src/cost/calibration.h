// This machine's measured constants (`fusion-jit calibrate`, driver/calibrate.h) and what the cost model
// takes from them.
//
// Note [Calibration]
// The cost model's device description starts from defaults (cost_model.h); a calibration measured on this
// machine replaces them where it has a figure. It is measured by running our own generated kernels (a
// one-op elementwise kernel over sizes from L1 to memory, at one thread and at the thread count torch
// uses; the same kernel over one element, serially and split across the pool; one kernel per op class over
// an L2-sized buffer) and one ATen step, and stored in the kernel cache under a key naming the CPU and its
// core count (driver/calibrate.h), where every process on the machine finds it. The record says the thread
// count it was measured at; a process running with fewer threads still uses its figures (a limit: the
// key does not name the thread count, since the layers that read it do not know torch's). What the cost
// model takes:
//   memory_gbps = streaming bandwidth at the largest working set, at the calibrated thread count;
//   launch_us   = one kernel split across the pool (the run loop's dispatch plus the pool's wake-up);
//   gflops      = 20 flops (an expensive op, work.h) per the op classes' mean time per element, times the
//                 threads: the work model counts 20 flops per expensive op, so this prices them as
//                 measured;
//   aten_step_us = one ATen step of the run loop on a small tensor, among other steps.
// The time model (cost/kernel_time.h, Note [Kernel times]) reads the whole record: the streams by working
// set, the serial and split dispatch, the op classes, the ATen step and ATen's GEMM rate.
// A plan's cache key names the calibration it was built under (plan_cache.cpp), since its decisions
// depend on it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cost/cost_model.h"

namespace fusion_jit {

// The bytes (read plus written) of each step of the step probes (driver/calibrate.h: a [16, 256] float
// tensor in and out), which the time model takes out of the step times it reads.
constexpr int64_t kStepProbeBytes = 2 * 16 * 256 * 4;

struct Calibration {
  std::string machine;  // calibration_machine() where it was measured
  int threads = 1;      // the thread count the parallel figures were measured at
  // Streaming bandwidth of a one-op kernel (bytes read plus written per second) by working set.
  struct Stream {
    int64_t bytes = 0;   // read plus written per call
    double gbps_1 = 0;   // one thread
    double gbps_n = 0;   // `threads` threads
  };
  std::vector<Stream> streams;  // smallest working set first
  double kernel_us = 0;           // one of our kernels over one element, run serially
  double parallel_kernel_us = 0;  // one over two chunks, split across the thread pool
  double aten_step_us = -1;       // one ATen step of the run loop (kStepProbeBytes); -1: not measured
  double gemm_gflops = -1;        // ATen's float32 GEMM at 512x512x512 on `threads`; -1: not measured
  double kernel_step_us = -1;     // one kernel step of the run loop (kStepProbeBytes); -1: not measured
  double conv_step_us = -1;       // a convolution step beyond its flops; -1: not measured
  // Per op class, nanoseconds per element beyond a copy's, one thread, the data in L2.
  std::vector<std::pair<std::string, double>> op_ns;
  int vector_floats = 0;  // float lanes of the widest vector unit the kernels are compiled for
  double seconds = 0;     // how long measuring took

  // A short fingerprint of the figures (for plan cache keys).
  std::string fingerprint() const;
};

// The machine a calibration belongs to: the CPU model and feature flags, and the online core count.
std::string calibration_machine();

// `d` with the figures of `c` put in (Note [Calibration]).
DeviceDescription calibrated(DeviceDescription d, const Calibration& c);

// The calibration host_cpu_description() applies, for this process (the driver installs the stored one,
// driver/calibrate.h); none: the defaults.
void install_host_calibration(std::optional<Calibration> c);
std::optional<Calibration> host_calibration();

}  // namespace fusion_jit
