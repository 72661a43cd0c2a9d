// The time model: a prediction, in microseconds, of one call of a CPU kernel or of an ATen step, from the
// facts its kernel IR or its node gives and the machine's measured figures (Note [Kernel times]).
//
// Note [Kernel times]
// A CPU kernel's call is its step's dispatch, its memory traffic and the work of its expensive ops:
//   us = dispatch + first_bytes / bandwidth(working set, threads) + reread_bytes / bandwidth(row, threads)
//        + sum over op classes of applications * ns(class) / threads / 1000
// where `threads` is how many chunks the launch splits its range into (1 when the range fits one grain,
// codegen/target.h's LaunchContext), at most the pool's threads, and dispatch is the run loop's step on
// one element (its buffers found, its outputs allocated, the serial kernel run) plus, split, what
// splitting adds (the split kernel's dispatch less the serial one's). Bandwidth is the calibration's streaming figure at the working set
// (read plus written bytes), interpolated in log(bytes) between its points and held flat beyond them;
// it is the one-thread figure for a serial kernel and the pool's for a split one. A multi-pass row
// (Note [Reduction kernels]) reads its row again in each later pass at the bandwidth of a working set of
// one row. ns(class) is the calibration's time per element of the op class beyond a copy (exp, log,
// tanh, sigmoid, sin, erf, sqrt, reciprocal): the classes add to the copy's time, since the copy's own
// arithmetic is part of what the stream measured. Other arithmetic is taken as free beside the traffic
// (vectorized, a few cycles per element).
// An ATen step is the run loop's step on one element plus, for a compute op (GEMM, convolution,
// attention), its flops at the calibrated GEMM rate or its operands' bytes at the streaming bandwidth,
// whichever is longer (a GEMV is its weights' bytes), plus a convolution's fixed cost; for any other op
// that makes a new tensor, its bytes at the streaming bandwidth; a view costs the step alone.
// Without a calibration the figures are this project's 2-core machine's (bench/RESULTS.md, "Kernel
// times"), so a prediction is a prediction, not a rank. What this model does not see: cache contention
// between threads, SIMD lanes lost to a kernel the compiler leaves scalar, a GEMM's shape beyond its
// flops. `fusion-jit run --profile N` sets the predictions beside measured medians.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cost/calibration.h"

namespace fusion_jit {

// The figures the time model reads: a calibration's, or the defaults where it has none.
struct TimeFigures {
  int threads = 1;          // the pool kernels are split across
  int64_t grain = 32768;    // elements per chunk of a split launch (FUSION_JIT_CPU_GRAIN)
  std::vector<Calibration::Stream> streams;  // smallest working set first
  double kernel_us = 0;           // a serial kernel's dispatch
  double parallel_kernel_us = 0;  // a split kernel's
  double kernel_step_us = 0;      // a one-element kernel step of the run loop (the serial kernel included)
  double aten_step_us = 0;        // a one-element ATen step of the run loop
  double gemm_gflops = 0;         // ATen's GEMM rate at `threads`
  double conv_step_us = 0;        // a convolution step beyond its flops
  std::map<std::string, double> op_ns;  // op class -> ns per element beyond a copy, one thread
  std::string calibration;        // its fingerprint, or "" for the defaults
};

// The figures of `c` (or the defaults) for a pool of `threads` and a grain of `grain` elements. A
// calibration measured at another thread count is used as it is (Note [Calibration]).
TimeFigures time_figures(const std::optional<Calibration>& c, int threads, int64_t grain);
// The figures of the calibration installed for this process (host_calibration), or the defaults.
TimeFigures host_time_figures(int threads, int64_t grain);

// Streaming bandwidth in GB/s at a working set of `bytes`, one thread or the pool's (Note [Kernel times]).
double bandwidth_gbps(const TimeFigures& f, int64_t bytes, bool split);

// A step time measured on the step probes (kStepProbeBytes), less the probe's traffic.
double step_dispatch_us(const TimeFigures& f, double step_us);

// What the model reads of one kernel.
struct KernelFacts {
  int64_t range = 0;          // what its launch splits: elements, or rows of a reduction
  int64_t elements_per_unit = 1;  // elements per unit of range (a reduction's row length)
  int64_t bytes = 0;          // each buffer's distinct bytes, read or written once
  int64_t reread_bytes = 0;   // rows read again by passes after the first
  int64_t row_bytes = 0;      // what one row's passes read (their working set)
  std::map<std::string, int64_t> op_counts;  // op class -> applications per call
};

// The op class a kernel IR call counts as (Note [Kernel times]): "exp", "log", ... or "" for cheap
// arithmetic. Some functions count as several (softplus: exp and log), hence a list.
std::vector<std::string> op_classes_of_call(const std::string& fn);

struct TimePrediction {
  double us = 0;          // the whole call
  double dispatch_us = 0;
  double memory_us = 0;
  double compute_us = 0;
  int threads = 1;        // chunks the call runs on
};

TimePrediction predict_kernel(const KernelFacts& k, const TimeFigures& f);

// What the model reads of one ATen step.
struct StepFacts {
  bool view = false;   // makes no new data (a view, a list op)
  bool compute = false;  // a GEMM, convolution or attention: priced by its flops
  bool conv = false;     // a convolution (its fixed cost added)
  int64_t bytes = 0;   // tensor inputs read and outputs written
  double flops = 0;    // compute ops: multiply-adds times two
};

TimePrediction predict_aten_step(const StepFacts& s, const TimeFigures& f);

}  // namespace fusion_jit
