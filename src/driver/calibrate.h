// Measuring this machine's constants for the cost model (Note [Calibration], cost/calibration.h), and
// keeping them in the kernel cache. Torch-free: the caller gives the thread pool and the ATen step's
// timer (the torch adapter's, for `fusion-jit calibrate`).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "codegen/target.h"
#include "cost/calibration.h"

namespace fusion_jit {

struct CalibrateOptions {
  ParallelFor parallel_for;  // the pool our kernels are split across (null: serial only)
  int threads = 1;           // its thread count
  // Microseconds of one step of a plan's run loop on a small tensor (16 KB), among other steps: an ATen
  // step, and one of our kernels (its buffers found, its output allocated, the kernel run); null: not
  // measured.
  std::function<double()> aten_step_us;
  std::function<double()> kernel_step_us;
  // Microseconds of a small convolution step (1x8x8x8 by 8x8x3x3) beyond its flops at the GEMM rate: what
  // a convolution costs whatever its size; null: not measured.
  std::function<double(double gemm_gflops)> conv_step_us;
  // GFLOP/s of ATen's float32 GEMM at 512x512x512 on the pool; null: not measured.
  std::function<double()> gemm_gflops;
  // Called with a line for each step measured (progress), or null.
  std::function<void(const std::string&)> progress;
};

// Measures this machine (about 5 to 15 s, most of it compiling the kernels on a cold cache).
Calibration calibrate_host(const CalibrateOptions& options);

// The calibration as JSON, and back: every field checked (types, finite numbers in plausible ranges,
// the machine named); nullopt with `why` set otherwise.
std::string calibration_to_json(const Calibration& c);
std::optional<Calibration> calibration_from_json(const std::string& text, std::string* why);

// The kernel cache's key for this machine's calibration (one per machine: it records the thread count it
// was measured at).
std::string calibration_key();
// Stores `c` in the kernel cache (where every process on this machine finds it).
void store_calibration(const Calibration& c);
// This machine's stored calibration, or nullopt (none, or an entry that fails its checks:
// then one warning naming why, and it is not used).
std::optional<Calibration> load_calibration();
// Installs this machine's stored calibration for the process (install_host_calibration), once; later
// calls do nothing. build_plan calls it before its first decision; FUSION_JIT_DISABLE=calibration leaves
// the defaults.
void install_stored_calibration();

// The figures as a table, each beside the default it replaces.
std::string format_calibration(const Calibration& c);

}  // namespace fusion_jit
