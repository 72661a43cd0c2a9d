// fusion_jit::calibrate (include/fusion_jit/cache.h): the driver's measurement (driver/calibrate.h) with
// torch's thread pool, the one our kernels are split across; the run loop's steps (an ATen step, a
// kernel step, a convolution) timed as `fusion-jit run --profile` times them, through plans of traced
// probes; and ATen's GEMM rate.
#include <ATen/Parallel.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "driver/calibrate.h"
#include "fusion_jit/cache.h"
#include "fusion_jit/fusion_jit.h"
#include "runtime/plan.h"
#include "runtime/profile.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

// The median over the steps of `fn`'s plan that are kernels (`kernel`) or ATen steps of each one's median
// time, on `inputs`: `calls` calls after one that compiles, each step timed as `fusion-jit run --profile`
// times it.
double run_loop_step_us(const TensorFunction& fn, const std::vector<at::Tensor>& inputs, bool kernel, int calls) {
  CompiledModule m = trace(fn, inputs);
  std::vector<c10::IValue> args(inputs.begin(), inputs.end());
  const ExecutablePlan* plan = m.plan_for(args);
  FJ_CHECK(plan != nullptr, "calibration: the probe's plan runs eagerly");
  m(args);
  profile_reset();
  set_step_recording(true);
  for (int i = 0; i < calls; ++i) m(args);
  set_step_recording(false);
  const StepTimes times = step_times_snapshot();
  profile_reset();
  auto it = times.find(plan);
  FJ_CHECK(it != times.end(), "calibration: the probe's plan recorded no step");
  std::vector<double> medians;
  for (const auto& [step, ns] : it->second) {
    if ((plan->steps.at(step).kernel >= 0) != kernel || ns.empty()) continue;
    std::vector<int64_t> v = ns;
    std::sort(v.begin(), v.end());
    medians.push_back(static_cast<double>(v[v.size() / 2]) / 1e3);
  }
  FJ_CHECK(!medians.empty(), "calibration: the probe's plan has no {} step", kernel ? "kernel" : "ATen");
  std::sort(medians.begin(), medians.end());
  return medians[medians.size() / 2];
}

// Eight one-op kernels (neg) and eight ATen steps (flip runs through ATen), alternating over a
// [16, 256] tensor: steps as a plan runs them, each after another's code and data, not one step in a
// loop with everything in cache.
std::vector<at::Tensor> step_chain(const std::vector<at::Tensor>& x) {
  at::Tensor y = x[0];
  for (int i = 0; i < 8; ++i) y = y.neg().flip(1);
  return {y};
}
double aten_step_us() { return run_loop_step_us(step_chain, {at::ones({16, 256})}, false, 500); }
double kernel_step_us() { return run_loop_step_us(step_chain, {at::ones({16, 256})}, true, 500); }

// A 1x8x8x8 by 8x8x3x3 convolution step, less its flops at the GEMM rate: a convolution's fixed cost.
double conv_step_us(double gemm_gflops) {
  const at::Tensor w = at::ones({8, 8, 3, 3});
  const double us = run_loop_step_us(
      [w](const std::vector<at::Tensor>& x) { return std::vector<at::Tensor>{at::conv2d(x[0], w)}; },
      {at::ones({1, 8, 8, 8})}, false, 300);
  const double flops = 2.0 * (8 * 6 * 6) * (8 * 3 * 3);
  return std::max(0.0, us - flops / (gemm_gflops * 1e3));
}

// GFLOP/s of at::mm on two float32 512x512 matrices at torch's thread count: the median of 7 calls after
// two that warm up.
double gemm_gflops() {
  const at::Tensor a = at::ones({512, 512}), b = at::ones({512, 512});
  std::vector<double> times;
  for (int round = 0; round < 9; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    at::mm(a, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (round > 1) times.push_back(s);
  }
  std::sort(times.begin(), times.end());
  return 2.0 * 512 * 512 * 512 / times[times.size() / 2] / 1e9;
}

}  // namespace

std::string calibrate(const std::function<void(const std::string&)>& progress) {
  CalibrateOptions o;
  o.threads = at::get_num_threads();
  o.parallel_for = [](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    at::parallel_for(0, n, grain, fn);
  };
  o.aten_step_us = aten_step_us;
  o.kernel_step_us = kernel_step_us;
  o.gemm_gflops = gemm_gflops;
  o.conv_step_us = conv_step_us;
  o.progress = progress;
  const Calibration c = calibrate_host(o);
  store_calibration(c);
  install_host_calibration(c);  // this process plans with it from now on, as later ones will
  return format_calibration(c);
}

std::string calibration() {
  const std::optional<Calibration> c = load_calibration();
  return c ? format_calibration(*c) : std::string();
}

}  // namespace fusion_jit
