// `explain --json` and `run --profile N`: each step of a plan under one name, with the time model's
// prediction (driver/predict.h, Note [Kernel times]) and, for --profile, the median the step measured
// over N calls (runtime/profile.h's step recording), so that the two can be compared by anyone.
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "driver/calibrate.h"
#include "driver/predict.h"
#include "runtime/profile.h"
#include "support/options.h"

namespace fusion_jit::cli {
namespace {

TimeFigures figures() {
  install_stored_calibration();  // as build_plan does: a plan read from the plan cache skips it
  return host_time_figures(at::get_num_threads(), Options::get().cpu_grain);
}

nlohmann::json step_json(const StepPrediction& s) {
  return {{"name", s.name},
          {"kind", s.kind},
          {"op", s.op},
          {"predicted_us", s.time.us},
          {"dispatch_us", s.time.dispatch_us},
          {"memory_us", s.time.memory_us},
          {"compute_us", s.time.compute_us},
          {"threads", s.time.threads}};
}

std::string figures_line(const TimeFigures& f) {
  return fmt::format("time model: {} ({} threads, grain {})", f.calibration.empty() ? "defaults" : "calibration " + f.calibration,
                     f.threads, f.grain);
}

double median(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? static_cast<double>(v[n / 2]) : (static_cast<double>(v[n / 2 - 1]) + static_cast<double>(v[n / 2])) / 2;
}

// Median and mean of |predicted - measured| / measured, in percent.
struct Errors {
  int count = 0;
  double median_pct = 0, mean_pct = 0;
};
Errors errors_of(std::vector<double> pct) {
  Errors e;
  e.count = static_cast<int>(pct.size());
  if (pct.empty()) return e;
  std::sort(pct.begin(), pct.end());
  const size_t n = pct.size();
  e.median_pct = n % 2 ? pct[n / 2] : (pct[n / 2 - 1] + pct[n / 2]) / 2;
  double sum = 0;
  for (double p : pct) sum += p;
  e.mean_pct = sum / static_cast<double>(n);
  return e;
}

}  // namespace

std::string explain_json(const std::string& model, const ExecutablePlan* plan, const std::string& fallback) {
  const TimeFigures f = figures();
  nlohmann::json j;
  j["model"] = model;
  j["time_model"] = figures_line(f);
  j["calibration"] = f.calibration.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.calibration);
  j["steps"] = nlohmann::json::array();
  double total = 0;
  if (plan) {
    for (const StepPrediction& s : predict_plan(*plan, f)) {
      j["steps"].push_back(step_json(s));
      total += s.time.us;
    }
  }
  j["predicted_us"] = total;
  j["eager_fallback"] = plan ? nlohmann::json(nullptr) : nlohmann::json(fallback);
  return j.dump() + "\n";
}

std::string profile_report(const ExecutablePlan& plan, int calls, const std::function<void()>& call, bool json) {
  const TimeFigures f = figures();
  profile_reset();
  set_step_recording(true);
  try {
    for (int i = 0; i < calls; ++i) call();
  } catch (...) {
    set_step_recording(false);
    throw;
  }
  set_step_recording(false);
  const StepTimes times = step_times_snapshot();
  profile_reset();
  auto it = times.find(&plan);
  if (it == times.end() && times.size() == 1) it = times.begin();  // the signature's plan, however it is held
  const std::map<size_t, std::vector<int64_t>> none;
  const auto& by_step = it == times.end() ? none : it->second;

  nlohmann::json steps = nlohmann::json::array();
  std::vector<double> kernel_pct, step_pct;
  double predicted_total = 0, measured_total = 0;
  std::string text = fmt::format("profile: {} calls, each step's median; {}\n", calls, figures_line(f));
  text += fmt::format("  {:<16} {:<6} {:<34} {:>12} {:>12} {:>8}\n", "step", "kind", "op", "predicted us", "measured us",
                      "error");
  for (const StepPrediction& s : predict_plan(plan, f)) {
    nlohmann::json sj = step_json(s);
    auto m = by_step.find(s.step);
    std::string measured = "-", error = "-";
    predicted_total += s.time.us;
    if (m != by_step.end() && !m->second.empty()) {
      const double us = median(m->second) / 1e3;
      sj["measured_us"] = us;
      measured_total += us;
      measured = fmt::format("{:.2f}", us);
      if (us > 0) {
        const double pct = std::abs(s.time.us - us) / us * 100;
        (s.kind == "kernel" ? kernel_pct : step_pct).push_back(pct);
        error = fmt::format("{:+.0f}%", (s.time.us - us) / us * 100);
      }
    } else {
      sj["measured_us"] = nullptr;  // not timed: a view the run folds into its kernels' loads
    }
    steps.push_back(sj);
    text += fmt::format("  {:<16} {:<6} {:<34} {:>12.2f} {:>12} {:>8}\n", s.name, s.kind, s.op.substr(0, 34), s.time.us,
                        measured, error);
  }
  const Errors ke = errors_of(kernel_pct), se = errors_of(step_pct);
  text += fmt::format("kernel time error: median {:.0f}%, mean {:.0f}% over {} kernels; ATen steps: median {:.0f}%, "
                      "mean {:.0f}% over {}; predicted {:.1f} us, measured {:.1f} us per call (steps alone)\n",
                      ke.median_pct, ke.mean_pct, ke.count, se.median_pct, se.mean_pct, se.count, predicted_total,
                      measured_total);
  if (!json) return text;
  nlohmann::json j;
  j["calls"] = calls;
  j["time_model"] = figures_line(f);
  j["steps"] = steps;
  j["kernel_error"] = {{"count", ke.count}, {"median_pct", ke.median_pct}, {"mean_pct", ke.mean_pct}};
  j["aten_error"] = {{"count", se.count}, {"median_pct", se.median_pct}, {"mean_pct", se.mean_pct}};
  j["predicted_us"] = predicted_total;
  j["measured_us"] = measured_total;
  return j.dump();
}

}  // namespace fusion_jit::cli
