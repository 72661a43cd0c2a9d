// The campaign loop: batches generated, checked (at a second size too), and their failures confirmed
// alone, shrunk and written as repros.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "fuzz/fuzz_internal.h"
#include "fusion_jit/cache.h"

namespace fusion_jit::fuzz {
namespace {

// Where each failure was found: at the batch's sizes, at the second sizes with plans of their own, or
// through one plan of the class at both (Note [The fuzzer's shape classes]).
enum class Found { kFirst, kSecond, kClass };

// Options::second_size: the batch through one plan of its class at both sizes (check_class), the rest at
// the second size with plans of their own. A graph passing at its first size that fails there fails, and
// one failing at the second size with a plan of its own is replaced in `batch` by its resized recipe.
void check_second_size(const Options& opt, std::vector<Recipe>& batch, std::vector<CaseResult>& results,
                       std::vector<Found>& found, Report& rep, const std::function<void(const std::string&)>& log) {
  const int64_t compiles0 = counters().compiles();
  ClassCheck cc = check_class(batch, opt.check);
  rep.second_batches++;
  rep.class_graphs += std::count(cc.covered.begin(), cc.covered.end(), true);
  if (cc.why.empty()) {
    rep.class_batches++;
  } else if (cc.outside) {
    rep.class_outside++;
    if (rep.class_outside_example.empty()) rep.class_outside_example = cc.why;
  } else if (cc.why.rfind("no graph", 0) != 0) {
    rep.class_not_generalized++;
    if (log) log("not generalized: " + cc.why);
  }
  // The rest at the second size, with plans of their own: a failure there is the graph's, replayed at
  // those extents.
  const std::vector<Recipe> second = resized(batch);
  std::vector<size_t> rest;
  std::vector<Recipe> rest_recipes;
  for (size_t k = 0; k < batch.size(); ++k)
    if (!cc.covered[k]) rest.push_back(k), rest_recipes.push_back(second[k]);
  auto again = check_batch(rest_recipes, opt.check);
  if (counters().compiles() == compiles0) rep.second_shared++;
  for (size_t k = 0; k < batch.size(); ++k)
    if (results[k].ok && cc.covered[k] && !cc.results[k].ok) results[k] = cc.results[k], found[k] = Found::kClass;
  for (size_t j = 0; j < rest.size(); ++j) {
    const size_t k = rest[j];
    if (!results[k].ok || again[j].ok) continue;
    batch[k] = second[k];
    results[k] = {false, "at its second size: " + again[j].message};
    found[k] = Found::kSecond;
  }
}

// Counts the batch's graphs and records its failures: each graph's that also fails alone (shrunk, with
// its repro). One that fails only beside the others (a fused run that raised fails them all) is reported
// once, for the batch.
void record_failures(const Options& opt, const std::vector<Recipe>& batch, const std::vector<CaseResult>& results,
                     const std::vector<Found>& found, Report& rep, const std::function<void(const std::string&)>& log) {
  // One recipe checked as its failure was found, alone.
  auto check_alone = [&](const Recipe& r, Found f) {
    if (f != Found::kClass) return check_batch({r}, opt.check).at(0);
    ClassCheck c = check_class({r}, opt.check);
    return c.covered[0] ? c.results[0] : CaseResult{};
  };
  std::string together;
  bool any_alone = false;
  for (size_t k = 0; k < batch.size(); ++k) {
    rep.graphs++;
    rep.ops += static_cast<int64_t>(batch[k].ops.size());
    rep.rejected += results[k].rejected;
    if (results[k].ok) continue;
    auto alone = check_alone(batch[k], found[k]);
    if (alone.ok) {
      if (together.empty()) together = fmt::format("graph seed {}: {}", batch[k].seed, results[k].message);
      continue;
    }
    any_alone = true;
    CheckOptions co = opt.check;
    co.through_class = found[k] == Found::kClass;
    Recipe small = opt.shrink ? shrink(batch[k], log, co) : batch[k];
    auto small_result = check_alone(small, found[k]);
    std::string msg = fmt::format("graph seed {}: {}", batch[k].seed, small_result.ok ? alone.message : small_result.message);
    if (found[k] == Found::kClass) {
      // The repro is the recipe at its second size, whose own plan may pass: the fuzzer checks the class.
      msg += fmt::format("\n  again through its class: {} fuzz --graph-seeds {} --second-size", opt.cli, batch[k].seed);
      small = resized({small}).at(0);
    }
    if (!opt.repro_dir.empty()) msg += "\n  replay: " + write_repro(small, msg, opt.repro_dir, opt.cli);
    msg += "\n" + small.describe();
    if (log) log("FAIL " + msg);
    rep.failures.push_back(msg);
    if (opt.stop_at_first_failure) break;
  }
  if (!together.empty() && !any_alone) {
    std::string seeds;
    for (const Recipe& r : batch) seeds += (seeds.empty() ? "" : ",") + std::to_string(r.seed);
    // The message says "at its second size" where the batch failed there (--second-size).
    std::string msg = fmt::format("a batch fails where each of its graphs passes alone (--graph-seeds {}): {}", seeds, together);
    if (log) log("FAIL " + msg);
    rep.failures.push_back(msg);
  }
}

}  // namespace

Report run(const Options& opt, const std::function<void(const std::string&)>& log) {
  Report rep;
  const int64_t nvrtc_kernels0 = g_nvrtc_kernels, nvrtc_micros0 = g_nvrtc_micros;
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_log = 0;
  uint64_t index = 0;
  while (rep.graphs < opt.max_graphs && (opt.max_seconds <= 0 || elapsed() < opt.max_seconds)) {
    std::vector<Recipe> batch;
    if (!opt.graph_seeds.empty()) {
      if (index >= opt.graph_seeds.size()) break;
      while (index < opt.graph_seeds.size() && batch.size() < static_cast<size_t>(opt.batch))
        batch.push_back(generate(opt.graph_seeds[index++], opt.gen));
    }
    int64_t n = opt.graph_seeds.empty() ? std::min<int64_t>(opt.batch, opt.max_graphs - rep.graphs) : 0;
    for (int64_t i = 0; i < n; ++i) batch.push_back(generate(mix(opt.seed, index++), opt.gen));
    auto results = check_batch(batch, opt.check);
    std::vector<Found> found(batch.size(), Found::kFirst);
    if (opt.second_size) check_second_size(opt, batch, results, found, rep, log);
    record_failures(opt, batch, results, found, rep, log);
    if (opt.stop_at_first_failure && !rep.failures.empty()) break;
    if (log && elapsed() - last_log > 10) {
      last_log = elapsed();
      log(fmt::format("{} graphs, {} failures, {:.1f} ms per graph", rep.graphs, rep.failures.size(),
                      1e3 * elapsed() / static_cast<double>(rep.graphs)));
    }
  }
  rep.seconds = elapsed();
  rep.nvrtc_kernels = g_nvrtc_kernels - nvrtc_kernels0;
  rep.nvrtc_seconds = static_cast<double>(g_nvrtc_micros - nvrtc_micros0) / 1e6;
  return rep;
}

}  // namespace fusion_jit::fuzz
