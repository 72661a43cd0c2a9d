// The NVRTC check of a batch graph's CUDA kernels (CheckOptions::nvrtc_arch): the fuzzer's one use of a
// target's own header (targets/cuda/nvrtc.h, for ptxas's spill report).
#include <fmt/format.h>

#include <chrono>
#include <optional>

#include "fuzz/fuzz_internal.h"
#include "passes/passes.h"
#include "support/error.h"
#include "support/options.h"
#include "targets/cuda/nvrtc.h"  // the NVRTC check: ptxas's spill report

namespace fusion_jit::fuzz {

namespace {

// NVRTC's verdict on the batch graph's kernels moved to a GPU: "" when they compile without spills.
std::string nvrtc_check(const Graph& g, const std::string& arch, int64_t* kernels) {
  // A class's graph (check_class) decides on its sizes under guards of its own (the CUDA printer
  // specializes some): this thread's.
  ShapeGuards guards;
  std::optional<GuardScope> scope;
  if (!g.symbols().empty()) scope.emplace(guards);
  auto gc = g.clone();
  set_device(*gc, Device::kCUDA, 0);
  PlanTarget target;
  target.arch["cuda"] = arch;
  target.compile = false;
  // FUSION_JIT_DYNAMIC=on: the kernels read their sizes, as on the CPU (Note [CUDA size arguments]).
  target.size_args = fusion_jit::Options::get().dynamic == DynamicSizes::kOn;
  auto plan = build_plan(std::move(gc), target);
  const TargetCode* code = plan->code_for(Device::kCUDA);
  if (!code) return "";
  try {
    auto bin = compile_cuda_source(code->source, arch);
    *kernels += static_cast<int64_t>(bin->kernels.size());
    for (const auto& k : bin->kernels)
      if (k.spill_stores + k.spill_loads > 0)
        return fmt::format("NVRTC {}: {} spills {} B", arch, k.name, k.spill_stores + k.spill_loads);
  } catch (const Error& e) {
    return fmt::format("NVRTC {} failed: {}", arch, e.what());
  }
  return "";
}

}  // namespace

std::atomic<int64_t> g_nvrtc_kernels{0};
std::atomic<int64_t> g_nvrtc_micros{0};

NvrtcCheck::NvrtcCheck(const Graph& g, const std::string& arch, std::vector<CaseResult>* results,
                       const std::vector<bool>& built)
    : results_(results), built_(built) {
  if (arch.empty()) return;
  f_ = std::async(std::launch::async, [gc = std::shared_ptr<Graph>(g.clone()), arch] {
    auto t0 = std::chrono::steady_clock::now();
    int64_t kernels = 0;
    std::string err = nvrtc_check(*gc, arch, &kernels);
    g_nvrtc_kernels += kernels;
    g_nvrtc_micros += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    return err;
  });
}

void NvrtcCheck::join() {
  if (!f_.valid()) return;
  std::string err = f_.get();
  if (err.empty()) return;
  for (size_t k = 0; k < results_->size(); ++k)
    if (built_[k] && (*results_)[k].ok) (*results_)[k] = {false, err};
}

}  // namespace fusion_jit::fuzz
