#include "driver/plan_cache.h"

#include <fmt/format.h>

#include "cost/cost_model.h"
#include "driver/plan_io.h"
#include "kernels_cache/kernels_cache.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"
#include "targets/targets.h"

// The library's build identity, a hash of every source file (CMakeLists.txt).
#ifndef FJ_BUILD_ID
#define FJ_BUILD_ID "unknown"
#endif

namespace fusion_jit {
namespace {

// Compiles (or finds in the caches) a deserialized plan's kernels; false when that fails.
bool load_cached_kernels(ExecutablePlan* p) {
  try {
    for (auto& c : p->code) {
      c.artifact = c.target->compile(c.source, c.arch);
      for (int k : c.kernels) {
        const std::string& name = p->kernels.at(k).spec.name;
        FJ_CHECK(c.artifact->has_kernel(name), "its {} kernel {} is missing from the compiled library", c.target->name(),
                 name);
      }
    }
    return true;
  } catch (const Error& e) {
    if (Options::get().assert_no_compile) throw;
    log_warn("a cached plan's kernels could not be loaded; building the plan again: {}", e.what());
    return false;
  }
}

}  // namespace

std::string plan_source_key(const std::string& source) {
  return cache_key({"plan source", source, "", "", ""});
}

std::string plan_cache_key(const Graph& g, const PlanTarget& target, const std::string& devices) {
  const Options& opt = Options::get();
  std::string flags = fmt::format("fusion={} horizontal={} cat={} gather={} size_args={}",
                                  target.enable_fusion && !opt.is_disabled("fusion"), !opt.is_disabled("horizontal"),
                                  !opt.is_disabled("cat"), !opt.is_disabled("gather"), target.size_args);
  if (target.refuse_decision >= 0) flags += fmt::format(" refuse={}", target.refuse_decision);
  const DeviceDescription cpu = host_cpu_description();
  std::string where = fmt::format("cpu cores {} calibration {} | {}", cpu.cores, cpu.calibration, devices);
  for (const Target* t : all_targets()) where += fmt::format(" | {} policy {}", t->name(), t->policy_key());
  // A class's graph without its hints (Note [Symbolic sizes in the plan cache]): its plan serves the class
  // whichever size it was first seen at, where the plan's guards hold there.
  std::string text = print_graph(g);
  if (text.rfind("graph[", 0) == 0) {
    const size_t close = text.find(']');
    std::string names;
    for (const auto& [name, hint] : g.symbols()) names += (names.empty() ? "" : ",") + name;
    text = "graph[" + names + text.substr(close);
  }
  return cache_key({"plan", text, std::string("fusion_jit build ") + FJ_BUILD_ID, flags, where});
}

// Note [Plan sources stored once]
// A plan entry names its generated sources by reference: the cache key of the source's text, under which
// the text is an entry of its own, written before the first plan that names it. The signatures of a shape
// class (Note [Sizes as kernel arguments]) print one source, so a model served at many sizes keeps that
// source once instead of once per plan (gpt2_tiny: 74 KB per plan before, of it 50 KB of source), and
// storing a new size's plan writes and hashes only the plan's own part. The reference is checked when read:
// the text found must hash to the key that names it, or the plan is a miss (built again) and the entry is
// removed. A source evicted while plans still name it makes those plans misses too; a plan is never read
// without its source.
std::unique_ptr<ExecutablePlan> find_cached_plan(const std::string& key, std::unique_ptr<Graph>* graph) {
  KernelsCache& cache = KernelsCache::instance();
  auto text = cache.get(key);
  if (!text) return nullptr;
  auto cached = std::make_unique<ExecutablePlan>();
  cached->graph = std::move(*graph);
  auto find = [&cache](const std::string& ref) -> std::optional<std::string> {
    std::optional<std::string> source = cache.get(ref);
    if (!source) return std::nullopt;
    if (plan_source_key(*source) != ref) {
      cache.erase(ref);  // so that the plan built again stores its source again
      return std::nullopt;
    }
    return source;
  };
  if (deserialize_plan(*text, cached.get(), find) && load_cached_kernels(cached.get())) return cached;
  *graph = std::move(cached->graph);
  return nullptr;
}

void store_plan(const std::string& key, const ExecutablePlan& plan) {
  KernelsCache& cache = KernelsCache::instance();
  auto keep = [&cache](const std::string& source) {
    std::string ref = plan_source_key(source);
    if (!cache.contains(ref)) cache.put(ref, source);
    return ref;
  };
  cache.put(key, serialize_plan(plan, keep));
}

}  // namespace fusion_jit
