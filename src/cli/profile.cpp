// `explain --json` and `run --profile N`: each step of a plan under one name, with the time model's
// prediction (driver/predict.h, Note [Kernel times]) and, for --profile, the median the step measured
// over N calls (runtime/profile.h's step recording), so that the two can be compared by anyone.
// `explain --measure-decisions`: each fusion the fuser accepted, built both ways and timed both ways
// (Note [Decisions measured both ways], fusion/fusion.h).
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/cli.h"
#include "driver/calibrate.h"
#include "driver/predict.h"
#include "driver/step_times.h"
#include "fusion/fusion.h"
#include "fusion_jit/fusion_jit.h"
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
          {"threads", s.time.threads},
          {"source", s.measured ? "measured" : "model"}};
}

std::string figures_line(const TimeFigures& f) {
  return fmt::format("time model: {} ({} threads, grain {})", f.calibration.empty() ? "defaults" : "calibration " + f.calibration,
                     f.threads, f.grain);
}

template <typename T>
double median(std::vector<T> v) {
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
  e.median_pct = median(pct);
  double sum = 0;
  for (double p : pct) sum += p;
  e.mean_pct = sum / static_cast<double>(pct.size());
  return e;
}

// |predicted - measured| / measured in percent for each kernel step of a plan (`predicted`: its
// predict_plan) timed in `times`, appended.
void kernel_errors(const std::vector<StepPrediction>& predicted, const std::map<size_t, std::vector<int64_t>>& times,
                   std::vector<double>* pct) {
  for (const StepPrediction& s : predicted) {
    auto m = times.find(s.step);
    if (s.kind != "kernel" || m == times.end() || m->second.empty()) continue;
    const double us = median(m->second) / 1e3;
    if (us > 0) pct->push_back(std::abs(s.time.us - us) / us * 100);
  }
}

// What a step of a plan runs, to find the steps two plans of one model share: an ATen step's op on its
// values (its name and schema), a kernel's buffers (values, reads or writes, strides) over its iteration
// space. A kernel the decision did not touch has the same buffers in both plans.
std::string step_key(const ExecutablePlan& plan, const StepPrediction& s) {
  const ExecStep& st = plan.steps.at(s.step);
  if (st.kernel < 0) return "aten " + s.name + " " + s.op;
  const KernelSpec& k = plan.kernels.at(static_cast<size_t>(st.kernel)).spec;
  std::string key = "kernel [" + k.sizes.str() + "]";
  for (const KernelBuffer& b : k.buffers)
    key += fmt::format(" {}{}:{}", b.is_output ? "w" : "r", b.value->id(), b.strides.str());
  return key;
}

std::set<std::string> step_keys(const ExecutablePlan& plan, const std::vector<StepPrediction>& predicted) {
  std::set<std::string> keys;
  for (const StepPrediction& s : predicted) keys.insert(step_key(plan, s));
  return keys;
}

// The predicted and the measured time of the steps of `plan` not in `shared`: each step's median over
// `times`; steps never timed (views folded into kernel loads) count on neither side.
std::pair<double, double> differing_steps_us(const ExecutablePlan& plan, const std::vector<StepPrediction>& steps,
                                             const std::set<std::string>& shared,
                                             const std::map<size_t, std::vector<int64_t>>& times) {
  double predicted = 0, measured = 0;
  for (const StepPrediction& s : steps) {
    if (shared.count(step_key(plan, s))) continue;
    auto m = times.find(s.step);
    if (m == times.end() || m->second.empty()) continue;
    predicted += s.time.us;
    measured += median(m->second) / 1e3;
  }
  return {predicted, measured};
}

// The decision a plan built with one made the other way shows (Note [Decisions measured both ways]):
// its line of the fusion text, or "" where the plan has none (its fuser made fewer decisions).
std::string refused_line(const ExecutablePlan& plan) {
  size_t at = plan.fusion_text.find(kRefusedForMeasurement);
  if (at == std::string::npos) return "";
  const size_t start = plan.fusion_text.rfind('\n', at) + 1, end = plan.fusion_text.find('\n', at);
  std::string line = plan.fusion_text.substr(start, end - start);
  const size_t text = line.find("- ");
  return text == std::string::npos ? line : line.substr(text + 2);
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
  if (plan) {
    // What building the plan cost: compile_ms is 0 where the kernel or plan cache had the code.
    size_t source_bytes = 0;
    for (const auto& c : plan->code) source_bytes += c.source.size();
    j["build"] = {{"fusion_ms", plan->fusion_ms},       {"codegen_ms", plan->codegen_ms},
                  {"compile_ms", plan->compile_ms},     {"source_bytes", source_bytes},
                  {"from_plan_cache", plan->from_plan_cache}};
  }
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
  std::map<std::string, double> aten_medians;  // stored for later predictions (Note [Measured step times])
  int from_stored = 0;
  double predicted_total = 0, measured_total = 0;
  std::string text = fmt::format("profile: {} calls, each step's median; {}\n", calls, figures_line(f));
  text += fmt::format("  {:<16} {:<6} {:<34} {:>12} {:>12} {:>8}\n", "step", "kind", "op", "predicted us", "measured us",
                      "error");
  for (const StepPrediction& s : predict_plan(plan, f)) {
    nlohmann::json sj = step_json(s);
    auto m = by_step.find(s.step);
    std::string measured = "-", error = "-";
    if (m != by_step.end() && !m->second.empty()) {
      const double us = median(m->second) / 1e3;
      predicted_total += s.time.us;  // the steps that ran, both ways
      if (s.kind == "aten") {
        aten_medians[aten_step_signature(*plan.steps.at(s.step).node)] = us;
        from_stored += s.measured;
      }
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
                      "mean {:.0f}% over {} ({} priced by an earlier measurement); the steps that ran: predicted "
                      "{:.1f} us, measured {:.1f} us per call\n",
                      ke.median_pct, ke.mean_pct, ke.count, se.median_pct, se.mean_pct, se.count, from_stored,
                      predicted_total, measured_total);
  store_step_times(aten_medians);
  if (!json) return text;
  nlohmann::json j;
  j["calls"] = calls;
  j["time_model"] = figures_line(f);
  j["steps"] = steps;
  j["kernel_error"] = {{"count", ke.count}, {"median_pct", ke.median_pct}, {"mean_pct", ke.mean_pct}};
  j["aten_error"] = {{"count", se.count}, {"median_pct", se.median_pct}, {"mean_pct", se.mean_pct},
                     {"from_stored", from_stored}};
  j["predicted_us"] = predicted_total;
  j["measured_us"] = measured_total;
  return j.dump();
}

}  // namespace fusion_jit::cli

namespace fusion_jit::cli {

int measure_decisions(const std::string& model, const torch::jit::Module& module, CompiledModule& fused,
                      const std::vector<c10::IValue>& inputs, int calls, bool json) {
  const ExecutablePlan* base = fused.plan_for(inputs);
  if (!base) {
    std::printf("%s", json ? "{\"decisions\": [], \"eager_fallback\": true}\n" : "no plan: the inputs run eagerly\n");
    return 0;
  }
  const TimeFigures f = figures();
  // The plan as decided is predicted once: what every decision's split plan is compared with.
  const std::vector<StepPrediction> base_pred = predict_plan(*base, f);
  const std::set<std::string> a = step_keys(*base, base_pred);
  int accepted = 0;  // the fusions the fuser accepted: lines "  + " of its explanation
  for (size_t at = 0; (at = base->fusion_text.find("\n  + ", at)) != std::string::npos; ++at) ++accepted;
  if (base->fusion_text.rfind("  + ", 0) == 0) ++accepted;
  using Clock = std::chrono::steady_clock;
  auto timed = [](CompiledModule& m, const std::vector<c10::IValue>& in) {
    const auto t0 = Clock::now();
    m(in);
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  };
  nlohmann::json rows = nlohmann::json::array();
  std::vector<double> kernel_pct, call_fused, call_split;
  int agree = 0, disagree = 0, close = 0, model_agree = 0;
  std::string text = fmt::format("{} fusion decisions, each built both ways and timed over {} calls of each, "
                                 "interleaved; the times are the steps the two plans do not share (each step's "
                                 "median: kernels with other buffers, ATen steps only one runs); {}\n",
                                 accepted, calls, figures_line(f));
  text += fmt::format("  {:>3}  {:>10} {:>10}  {:>10} {:>10}  {:<8} {}\n", "#", "pred fused", "pred split",
                      "meas fused", "meas split", "verdict", "decision");
  for (int i = 0; i < accepted; ++i) {
    CompileOptions o;
    o.refuse_fusion_decision = i;
    CompiledModule alt = compile(module, o);
    const ExecutablePlan* split = alt.plan_for(inputs);
    const std::string line = split ? refused_line(*split) : "";
    if (line.empty()) continue;  // decided fewer ways once this one went the other way
    fused(inputs);  // both warm
    alt(inputs);
    profile_reset();
    set_step_recording(true);
    std::vector<double> tf, ts;
    for (int c = 0; c < calls; ++c) {  // interleaved, the order swapped each call
      if (c % 2) {
        ts.push_back(timed(alt, inputs));
        tf.push_back(timed(fused, inputs));
      } else {
        tf.push_back(timed(fused, inputs));
        ts.push_back(timed(alt, inputs));
      }
    }
    set_step_recording(false);
    const StepTimes steps = step_times_snapshot();
    profile_reset();
    const std::map<size_t, std::vector<int64_t>> none;
    auto times_of = [&](const ExecutablePlan* p) -> const std::map<size_t, std::vector<int64_t>>& {
      auto it = steps.find(p);
      return it == steps.end() ? none : it->second;
    };
    const std::vector<StepPrediction> split_pred = predict_plan(*split, f);
    kernel_errors(base_pred, times_of(base), &kernel_pct);
    kernel_errors(split_pred, times_of(split), &kernel_pct);
    // What the decision changes: the two plans' steps but those they share.
    std::set<std::string> shared;
    const std::set<std::string> b = step_keys(*split, split_pred);
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(shared, shared.end()));
    const auto [pf, mf] = differing_steps_us(*base, base_pred, shared, times_of(base));
    const auto [ps, ms] = differing_steps_us(*split, split_pred, shared, times_of(split));
    call_fused.push_back(median(tf));
    call_split.push_back(median(ts));
    const bool within = std::abs(mf - ms) < 0.05 * std::max(mf, ms);
    const bool right = mf < ms;
    if (within) ++close;
    else (right ? agree : disagree) += 1;
    model_agree += (pf < ps) == right && !within;
    const std::string verdict = within ? "within5%" : right ? "agrees" : "WRONG";
    rows.push_back({{"index", i},
                    {"decision", line},
                    {"predicted_fused_us", pf},
                    {"predicted_split_us", ps},
                    {"measured_fused_us", mf},
                    {"measured_split_us", ms},
                    {"call_fused_us", call_fused.back()},
                    {"call_split_us", call_split.back()},
                    {"verdict", verdict}});
    text += fmt::format("  {:>3}  {:>10.1f} {:>10.1f}  {:>10.1f} {:>10.1f}  {:<8} {}\n", i, pf, ps, mf, ms, verdict,
                        line.substr(0, 110));
  }
  const Errors ke = errors_of(kernel_pct);
  const int counted = agree + disagree;
  const std::string summary = fmt::format(
      "decisions: {} of {} agree ({} within 5%, not counted); time model: {} of {} agree; kernel time error: "
      "median {:.0f}%, mean {:.0f}% over {} kernel timings",
      agree, counted, close, model_agree, counted, ke.median_pct, ke.mean_pct, ke.count);
  if (!json) {
    std::printf("%s%s\n", text.c_str(), summary.c_str());
    return 0;
  }
  nlohmann::json j;
  j["model"] = model;
  j["calls"] = calls;
  j["time_model"] = figures_line(f);
  j["decisions"] = rows;
  j["summary"] = {{"counted", counted},          {"agree", agree},
                  {"within_5pct", close},        {"time_model_agrees", model_agree},
                  {"kernel_error", {{"count", ke.count}, {"median_pct", ke.median_pct}, {"mean_pct", ke.mean_pct}}}};
  j["summary_line"] = summary;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace fusion_jit::cli
