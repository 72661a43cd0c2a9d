// The step profiler: where a plan's time goes, per step kind (our kernels, ATen compute, ATen other) and
// per ATen schema, summed over every plan run while it is on. Off by default; turned on by
// set_profiling(true) (Python: fusion_jit.profile()). On CPU a step's time is its wall time; on CUDA it is
// the host time to launch it (launches are asynchronous), so the figures name host overhead there.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fusion_jit {

enum class StepKind { kKernel, kAtenCompute, kAtenOther };

// Compute ops (convolution, GEMM, attention, oneDNN/cuDNN/cuBLASLt calls): the work a fusion compiler
// leaves to a library. Everything else ATen runs for a plan is "other".
bool is_compute_schema(const std::string& schema);

struct ProfileEntry {
  int64_t calls = 0;
  int64_t ns = 0;
};

struct Profile {
  int64_t plan_runs = 0;
  int64_t plan_ns = 0;                         // run_plan's own wall time, steps included
  ProfileEntry kernels, aten_compute, aten_other;
  std::map<std::string, ProfileEntry> by_op;   // ATen steps by schema; kernels as "fj::kernel"
};

void set_profiling(bool on);
bool profiling();
// What was measured since the last reset (thread-safe).
Profile profile_snapshot();
void profile_reset();
// Adds one step (`schema`: the ATen schema, or empty for one of our kernels).
void profile_step(StepKind kind, const std::string& schema, int64_t ns);
void profile_plan_run(int64_t ns);

// Step times one by one (`fusion-jit run --profile N`): while on, every timed step of every plan run
// keeps its time, by plan and step index, so that a step's median over the calls can be set beside its
// prediction (driver/predict.h). Off by default; independent of set_profiling.
void set_step_recording(bool on);
bool step_recording();
// Plan (its address) -> step index -> each call's nanoseconds, since the last reset.
using StepTimes = std::map<const void*, std::map<size_t, std::vector<int64_t>>>;
StepTimes step_times_snapshot();
void record_step_time(const void* plan, size_t step, int64_t ns);

}  // namespace fusion_jit
