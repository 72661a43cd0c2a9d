// fusion_jit::calibrate (include/fusion_jit/cache.h): the driver's measurement (driver/calibrate.h) with
// torch's thread pool, the one our kernels are split across, and one ATen step timed as the run loop
// calls it (a boxed call through the dispatcher).
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/ones.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "driver/calibrate.h"
#include "fusion_jit/cache.h"

namespace fusion_jit {
namespace {

// Microseconds of aten::add.Tensor on two one-element tensors, called boxed as an ATen step is: the
// median of 9 batches of 2,000 calls.
double aten_step_us() {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
  const at::Tensor a = at::ones({1}), b = at::ones({1});
  std::vector<double> batches;
  for (int round = 0; round < 10; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i) {
      torch::jit::Stack stack{a, b, at::Scalar(1)};
      op.callBoxed(&stack);
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 2000;
    if (round > 0) batches.push_back(us);  // the first warms up
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

}  // namespace

std::string calibrate(const std::function<void(const std::string&)>& progress) {
  CalibrateOptions o;
  o.threads = at::get_num_threads();
  o.parallel_for = [](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    at::parallel_for(0, n, grain, fn);
  };
  o.aten_step_us = aten_step_us;
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
