#include "runtime/plan.h"

#include <fmt/format.h>

#include "codegen/cuda/cuda_schedule.h"
#include "runtime/cuda_driver.h"
#include "support/error.h"

namespace fusion_jit {

std::string ExecutablePlan::explain() const {
  std::string s;
  if (graph)
    for (const auto& note : graph->notes()) s += note + "\n";
  s += fusion_text;
  if (from_plan_cache) s += "(plan from the plan cache: fusion and code generation skipped)\n";
  for (const auto& f : fallback_groups) s += "fallback: " + f + " failed to compile and runs through ATen\n";
  for (const auto& k : kernels) {
    const KernelSpec& ks = k.spec;
    if (ks.is_reduction() && ks.device == Device::kCPU)
      s += fmt::format("cpu {}: {} rows of {}, {} pass{}, {}{}\n", ks.name, ks.rows, ks.row_len, ks.passes.size(),
                       ks.passes.size() == 1 ? "" : "es",
                       reduction_is_column(ks) ? "column tiles of 32 rows vectorized across rows"
                                               : "rows over threads, 16 lanes per row",
                       ks.scratch.empty() ? "" : fmt::format(", {} value(s) kept in a scratch row", ks.scratch.size()));
    if (k.spec.device != Device::kCUDA) continue;
    const CudaKernelInfo* info = cuda_binary ? cuda_binary->kernel(k.spec.name) : nullptr;
    if (ks.is_reduction())
      s += fmt::format("cuda {} ({}): {} rows of {}, {} threads per row{}, {}, {} offsets", ks.name, cuda_arch, ks.rows,
                       ks.row_len, cuda_threads_per_row(ks), reduction_is_column(ks) ? " (column tile)" : "",
                       cuda_row_in_registers(ks) ? fmt::format("{} elements per thread in registers", cuda_elements_per_thread(ks))
                                                 : std::string("rows read once per pass"),
                       ks.index32 ? "int32" : "int64");
    else
      s += fmt::format("cuda {} ({}): {} elements, vector width {}, {} offsets", k.spec.name, cuda_arch, k.spec.numel,
                       k.cuda_vector, k.spec.index32 ? "int32" : "int64");
    if (info)
      s += fmt::format(", {} registers, {} B shared, {} B stack, spills {} B stored / {} B loaded", info->registers,
                       info->shared_bytes, info->stack_bytes, info->spill_stores, info->spill_loads);
    s += "\n";
  }
  s += fmt::format("{} kernel{}, {} fused op{}, {} ATen step{}; ", kernels.size(), kernels.size() == 1 ? "" : "s",
                   fused_ops, fused_ops == 1 ? "" : "s", steps.size() - kernels.size(),
                   steps.size() - kernels.size() == 1 ? "" : "s");
  if (from_plan_cache)
    s += fmt::format("plan cache {:.2f} ms (lookup and kernels loaded)\n", fusion_ms);
  else
    s += fmt::format("fusion {:.2f} ms, codegen {:.2f} ms, compile {:.1f} ms\n", fusion_ms, codegen_ms, compile_ms);
  return s;
}

ExecutablePlan::ExecutablePlan() = default;
ExecutablePlan::~ExecutablePlan() = default;

const std::vector<void*>& ExecutablePlan::cuda_functions(int device) const {
  std::lock_guard<std::mutex> g(cuda_mu_);
  if (cuda_module_) {
    FJ_CHECK(cuda_module_->device() == device, "a plan compiled for cuda:{} was run on cuda:{}", cuda_module_->device(),
             device);
    return cuda_functions_;
  }
  FJ_INTERNAL_ASSERT(cuda_binary != nullptr, "the plan has no CUDA binary");
  auto module = std::make_unique<CudaModule>(*cuda_binary, device);
  std::vector<void*> fns(kernels.size(), nullptr);
  for (size_t i = 0; i < kernels.size(); ++i)
    if (kernels[i].spec.device == Device::kCUDA) fns[i] = module->function(kernels[i].spec.name);
  cuda_module_ = std::move(module);
  cuda_functions_ = std::move(fns);
  return cuda_functions_;
}

}  // namespace fusion_jit
