#include "driver/step_times.h"

#include <fmt/format.h>

#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>

#include "cost/calibration.h"
#include "kernels_cache/kernels_cache.h"
#include "support/hash.h"
#include "support/log.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

constexpr int kFormat = 1;

bool enabled() { return !Options::get().is_disabled("cache") && !Options::get().is_disabled("calibration"); }

std::mutex g_mu;
std::map<std::string, double>& table() {
  static auto* t = new std::map<std::string, double>();
  return *t;
}
bool g_loaded = false;

// Reads the stored record once (callers hold g_mu).
void load_locked() {
  if (g_loaded) return;
  g_loaded = true;
  if (!enabled()) return;
  const std::optional<std::string> text = KernelsCache::instance().get_record(step_times_key());
  if (!text) return;
  std::string why;
  std::optional<std::map<std::string, double>> t = step_times_from_json(*text, &why);
  if (!t) {
    log_warn("the stored ATen step times are not used: {}; `fusion-jit run --profile` measures them again", why);
    return;
  }
  table() = std::move(*t);
}

}  // namespace

std::string step_times_key() {
  return cache_key({"aten step times", calibration_machine(), "", fmt::format("format {}", kFormat), host_cpu_identity()});
}

std::string aten_step_signature(const Node& n) {
  std::string s = n.schema() + "(";
  for (size_t i = 0; i < n.args().size(); ++i) {
    const Arg& a = n.args()[i];
    s += (i ? ", " : "") + (a.value ? a.value->type().str() : literal_str(a.literal));
  }
  return s + ")";
}

std::map<std::string, double> stored_step_times() {
  std::lock_guard<std::mutex> g(g_mu);
  load_locked();
  return table();
}

void store_step_times(const std::map<std::string, double>& medians) {
  std::lock_guard<std::mutex> g(g_mu);
  load_locked();
  if (!enabled()) return;
  std::map<std::string, double> merged = table();
  for (const auto& [sig, us] : medians) {
    if (merged.size() >= kMaxStepTimes && !merged.count(sig)) continue;  // full: known steps still update
    merged[sig] = us;
  }
  const std::string text = step_times_to_json(merged);
  std::string why;
  if (!step_times_from_json(text, &why)) {
    log_warn("ATen step times not stored: {}", why);
    return;
  }
  KernelsCache& cache = KernelsCache::instance();
  if (!cache.writable()) return;
  cache.put(step_times_key(), text);
  table() = std::move(merged);
}

void forget_step_times() {
  std::lock_guard<std::mutex> g(g_mu);
  table().clear();
  g_loaded = false;
}

std::string step_times_to_json(const std::map<std::string, double>& times) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["machine"] = calibration_machine();
  j["steps"] = times;
  return j.dump();
}

std::optional<std::map<std::string, double>> step_times_from_json(const std::string& text, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<std::map<std::string, double>> {
    *why = w;
    return std::nullopt;
  };
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return fail("not a JSON object");
  if (!j.contains("format") || !j["format"].is_number_integer() || j["format"].get<int>() != kFormat)
    return fail("format is not " + std::to_string(kFormat));
  if (!j.contains("machine") || !j["machine"].is_string() || j["machine"].get<std::string>() != calibration_machine())
    return fail("another machine's");
  if (!j.contains("steps") || !j["steps"].is_object()) return fail("no steps");
  if (j["steps"].size() > kMaxStepTimes) return fail("more than " + std::to_string(kMaxStepTimes) + " steps");
  std::map<std::string, double> out;
  for (const auto& [sig, us] : j["steps"].items()) {
    if (sig.empty() || sig.size() > 1000) return fail("a step's signature is empty or too long");
    if (!us.is_number() || !std::isfinite(us.get<double>()) || us.get<double>() <= 0 || us.get<double>() >= 1e7)
      return fail("the time of " + sig.substr(0, 60) + " is out of range");
    out[sig] = us.get<double>();
  }
  return out;
}

}  // namespace fusion_jit
