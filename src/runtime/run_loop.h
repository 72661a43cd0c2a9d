// Note [The run loop]
// A call of a plan is its steps in order. For a kernel step: each buffer's data found (an input's; a
// root's plus the offset of views folded into the load; a further slice of a cat's output; a dying input's
// storage that the output takes; the arena at the value's offset; memory of its own), then the kernel
// launched. For an ATen step: the step called. After each step: the values dead there released, the arena
// let go once its last value is born, the step's time profiled (runtime/profile.h). The loop is the
// runtime's and knows no tensor type: what holds the call's values, allocates, calls ATen and launches is a
// StepRunner, which the torch adapter gives (torch/executor.cpp: run_plan) and the runtime's tests give
// with buffers of their own (tests/unit/run_loop_test.cpp). What the loop follows is decided once per plan
// instance: the RunSchedule (which views are never made, where each is read, when each value dies) and the
// MemoryPlan (the arena, the kernels writing over a dying input).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/memory_plan.h"
#include "runtime/plan.h"

namespace fusion_jit {

// A kernel input read through folded views (Note [Views folded into kernel loads]): the value whose data
// it reads and the byte offset.
struct FoldedInput {
  int root = -1;  // value id; -1: the buffer's own value
  int64_t offset_bytes = 0;
};

struct RunSchedule {
  std::vector<std::vector<int>> release;  // per step: value ids dead after it (the plan's, with the roots of
                                          // folded views kept until their last kernel)
  std::vector<std::vector<FoldedInput>> kernel_inputs;  // per kernel, per buffer
  std::vector<bool> folded;               // per step: a view never made (its kernels read its root)
};

// Note [Views folded into kernel loads]
// A view made at plan build (Note [Views made at plan build], torch/executor.cpp) whose every reader is a
// kernel (or another such view) and that nothing returns is never made: a kernel reads a buffer through
// the strides of its type already, so it needs only the view's first element, the root's data pointer
// plus the offsets of the views between (bytes; views keep the dtype). The root is the first value of the
// chain that is not so folded. Its release moves to after the last kernel that reads it this way (the
// plan released it after its last reader, the view). Storage lifetimes (Note [Peak memory]) are
// unchanged: the folded view still holds its root's storage until its own release.
//
// `view_offset`: per step, for a view made at plan build (its first value argument the base), the
// elements its start lies past its base's; -1 for every other step.
RunSchedule schedule_run(const ExecutablePlan& plan, const std::vector<int64_t>& view_offset);

// What the run loop asks of whoever holds a call's values. Value ids are the plan graph's.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // The data of kernel input `b`'s value, whose sizes and strides must be those of its type.
  virtual const void* input(const KernelBuffer& b) = 0;
  // The data of value `id`, the root of views a kernel reads folded into its load.
  virtual const void* root(int id) = 0;
  // The data of output `b`'s value, made by an earlier buffer of the same kernel (a cat's result,
  // allocated for its first slice).
  virtual void* made_output(const KernelBuffer& b) = 0;
  // Whether value `id` is held by nothing but the call, nor its storage: a kernel may write over it.
  virtual bool sole_reference(int id) = 0;
  // Makes output `b`'s value, of its type, on the storage of value `over` (which dies at this kernel and
  // has the same bytes: MemoryPlan::kernel_in_place), at that value's start; returns its data.
  virtual void* write_over(const KernelBuffer& b, int over) = 0;
  // Makes output `b`'s value at byte `offset` of the call's arena (allocating the arena, of
  // `memory.arena_bytes`, at its first use), or in memory of its own where `offset` is -1; returns its data.
  virtual void* allocate(const KernelBuffer& b, int64_t offset) = 0;
  // Launches kernel `kernel` (ExecutablePlan::kernels) over `buffers`, one per buffer of its spec.
  virtual void launch(int kernel, void* const* buffers) = 0;
  // A constant step: its value becomes the constant.
  virtual void constant(const Node& n) = 0;
  // ATen step `step`: its value inputs read, its results made.
  virtual void call(size_t step, const Node& n) = 0;
  virtual void release(int id) = 0;
  // The arena is let go: no later step places a value in it (the values placed hold its bytes).
  virtual void release_arena() = 0;
};

// Runs the plan's steps through `runner` (Note [The run loop]); the results are then the runner's values
// of the graph's outputs.
void run_steps(const ExecutablePlan& plan, const RunSchedule& schedule, const MemoryPlan& memory, StepRunner& runner);

}  // namespace fusion_jit
