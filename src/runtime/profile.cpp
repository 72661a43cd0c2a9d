#include "runtime/profile.h"

#include <atomic>
#include <mutex>

namespace fusion_jit {
namespace {

std::atomic<bool> g_on{false};
std::atomic<bool> g_steps_on{false};
std::mutex g_mu;
Profile g_profile;
StepTimes g_steps;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

bool is_compute_schema(const std::string& s) {
  static const char* const kCompute[] = {
      "aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
      "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::linear",
      "aten::addmm", "aten::_addmm_activation", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
      "aten::matmul", "aten::scaled_dot_product_attention", "aten::_scaled_dot_product",
      "aten::cudnn_convolution", "aten::mkldnn_convolution", "aten::_native_multi_head_attention"};
  if (starts_with(s, "mkldnn::") || starts_with(s, "mkl::")) return true;  // oneDNN, MKL's packed GEMM
  for (const char* c : kCompute)
    if (starts_with(s, c)) return true;
  return false;
}

void set_profiling(bool on) { g_on.store(on, std::memory_order_relaxed); }
bool profiling() { return g_on.load(std::memory_order_relaxed); }

Profile profile_snapshot() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_profile;
}

void profile_reset() {
  std::lock_guard<std::mutex> g(g_mu);
  g_profile = Profile();
  g_steps.clear();
}

void set_step_recording(bool on) { g_steps_on.store(on, std::memory_order_relaxed); }
bool step_recording() { return g_steps_on.load(std::memory_order_relaxed); }

StepTimes step_times_snapshot() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_steps;
}

void record_step_time(const void* plan, size_t step, int64_t ns) {
  std::lock_guard<std::mutex> g(g_mu);
  g_steps[plan][step].push_back(ns);
}

void profile_step(StepKind kind, const std::string& schema, int64_t ns) {
  std::lock_guard<std::mutex> g(g_mu);
  ProfileEntry& e = kind == StepKind::kKernel        ? g_profile.kernels
                    : kind == StepKind::kAtenCompute ? g_profile.aten_compute
                                                     : g_profile.aten_other;
  ++e.calls;
  e.ns += ns;
  ProfileEntry& op = g_profile.by_op[kind == StepKind::kKernel ? std::string("fj::kernel") : schema];
  ++op.calls;
  op.ns += ns;
}

void profile_plan_run(int64_t ns) {
  std::lock_guard<std::mutex> g(g_mu);
  ++g_profile.plan_runs;
  g_profile.plan_ns += ns;
}

}  // namespace fusion_jit
