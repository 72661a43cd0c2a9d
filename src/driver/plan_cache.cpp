#include "driver/plan_cache.h"

#include <fmt/format.h>

#include "cost/cost_model.h"
#include "driver/plan_io.h"
#include "kernels_cache/kernels_cache.h"
#include "support/error.h"
#include "support/log.h"
#include "support/options.h"

// The library's build identity, a hash of every source file (CMakeLists.txt).
#ifndef FJ_BUILD_ID
#define FJ_BUILD_ID "unknown"
#endif

namespace fusion_jit {
namespace {

// Compiles (or finds in the caches) a deserialized plan's kernels; false when that fails.
bool load_cached_kernels(ExecutablePlan* p) {
  try {
    if (!p->source.empty()) p->library = compile_cpu_source(p->source);
    if (!p->cuda_source.empty()) p->cuda_binary = compile_cuda_source(p->cuda_source, p->cuda_arch);
    for (auto& k : p->kernels)
      if (k.spec.device == Device::kCPU) k.fn = reinterpret_cast<CpuKernelFn>(p->library->symbol(k.spec.name));
    return true;
  } catch (const Error& e) {
    if (Options::get().assert_no_compile) throw;
    log_warn("a cached plan's kernels could not be loaded; building the plan again: {}", e.what());
    return false;
  }
}

}  // namespace

std::string plan_cache_key(const Graph& g, const PlanTarget& target, const std::string& cuda_arch) {
  const Options& opt = Options::get();
  std::string flags = fmt::format("fusion={}", target.enable_fusion && !opt.is_disabled("fusion"));
  std::string where = fmt::format("cpu cores {} | eager cpu math {} | cuda {}", host_cpu_description().cores,
                                  eager_cpu_math().key(), cuda_arch);
  return cache_key({"plan", print_graph(g), std::string("fusion_jit build ") + FJ_BUILD_ID, flags, where});
}

std::unique_ptr<ExecutablePlan> find_cached_plan(const std::string& key, std::unique_ptr<Graph>* graph) {
  auto text = KernelsCache::instance().get(key);
  if (!text) return nullptr;
  auto cached = std::make_unique<ExecutablePlan>();
  cached->graph = std::move(*graph);
  if (deserialize_plan(*text, cached.get()) && load_cached_kernels(cached.get())) return cached;
  *graph = std::move(cached->graph);
  return nullptr;
}

void store_plan(const std::string& key, const ExecutablePlan& plan) {
  KernelsCache::instance().put(key, serialize_plan(plan));
}

}  // namespace fusion_jit
