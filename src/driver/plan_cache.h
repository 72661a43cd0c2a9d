// The plan cache: plans of the JIT path kept in the on-disk kernel cache (kernels_cache/) as plan_io's
// JSON, so that a warm start with the same graph skips fusion and code generation. The key is cache_key
// over the printed graph, the options that shape the plan, the CPU core count, what each target's lowering
// policy depends on (how eager's CPU kernels compute on this machine), the architecture of each device of
// the graph, and the library's build (FJ_BUILD_ID).
#pragma once

#include <memory>
#include <string>

#include "driver/build_plan.h"

namespace fusion_jit {

// The plan cache key of `g` built for `target`; `devices` names the graph's devices' targets and their
// architectures ("cpu  | cuda sm_90 | "; no architecture for a device without a driver).
std::string plan_cache_key(const Graph& g, const PlanTarget& target, const std::string& devices);

// The plan stored under `key`, its kernels compiled or found in the kernel caches, owning `*graph`; null
// when there is none or it does not fit the graph or its kernels fail to load (a warning says so), and
// `*graph` is left as it was.
std::unique_ptr<ExecutablePlan> find_cached_plan(const std::string& key, std::unique_ptr<Graph>* graph);

// Stores `plan` under `key`, its sources each under plan_source_key (Note [Plan sources stored once]).
void store_plan(const std::string& key, const ExecutablePlan& plan);

// The key a plan's generated source is kept under: the cache key of its text.
std::string plan_source_key(const std::string& source);

}  // namespace fusion_jit
