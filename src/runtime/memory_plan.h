// The memory of a plan's call, without torch: storage liveness, the peak bytes of a call (Note [Peak
// memory]), the static memory plan and its arena (Note [Static memory plan]), and the steps whose result
// takes a dying argument's storage (Note [Results written into a dying argument], Note [Kernel results
// written over a dying input]). What this needs to know of an ATen step's op (does it return a view, may
// it mutate an argument, has it an in-place form) it asks an OpFacts: TableOpFacts answers for the ops of the
// op table from its data (ir/ops.def: every op pure, kReturnsAlias), and asks another OpFacts of the rest;
// the torch adapter gives that one from the dispatcher's schemas (torch/executor.h: plan_op_facts), tests a
// table of their own. The
// executor (torch/executor.cpp) allocates the arena and places tensors as the MemoryPlan says.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/plan.h"

namespace fusion_jit {

// What the memory plan needs to know of an ATen step's op, from its schema. Asked only of nodes that are
// neither constants nor lists (prim::ListConstruct, prim::ListUnpack: their results share their inputs'
// storage).
class OpFacts {
 public:
  virtual ~OpFacts() = default;
  // Whether the op's first result aliases an argument (a view: the schema's alias annotation on its first
  // return). Its results then share the storage of its first tensor input.
  virtual bool returns_alias(const Node& n) const = 0;
  // Whether the op may change its arguments in place: a mutating schema, or an op whose schema is unknown.
  virtual bool may_mutate(const Node& n) const = 0;
  // The op's in-place form for this node, where one exists and computes the same result (Note [Results
  // written into a dying argument]): its schema, called with value input `input` moved to the front of
  // the arguments, writes the result into that input's storage.
  struct InPlaceForm {
    const char* schema = nullptr;  // nullptr: none
    int input = -1;                // the value input (index into Node::value_inputs) written
  };
  virtual InPlaceForm in_place_form(const Node& n) const = 0;
};

// The facts of the op table's ops from its data (ir/ops.def): none mutates an argument, and one returns an
// alias of its first tensor argument where its kReturnsAlias flag says. An op the table does not have
// (a library call, a random draw, anything opaque) is asked of `others`, as is every in-place form.
class TableOpFacts final : public OpFacts {
 public:
  explicit TableOpFacts(const OpFacts& others) : others_(others) {}
  bool returns_alias(const Node& n) const override;
  bool may_mutate(const Node& n) const override;
  InPlaceForm in_place_form(const Node& n) const override { return others_.in_place_form(n); }

 private:
  const OpFacts& others_;
};

// Note [Static memory plan]: where a call's intermediates live. Kernel outputs that die within the call
// (never returned, never a view's base that is returned, never an argument of a mutating op) get a byte
// offset in one arena, allocated once per call; lifetimes that do not overlap share bytes.
struct MemoryPlan {
  int64_t arena_bytes = 0;              // 0: no arena (every output allocated alone)
  Device device = Device::kCPU;         // the arena's device: that of its first intermediate
  int device_index = 0;
  std::vector<int64_t> offset;          // by value id: the value's byte offset in the arena, or -1
  std::vector<bool> check;              // by step: an ATen step reading the arena, whose new results are
                                        // checked for aliasing it (an op returning its input unannotated)
  int first_step = -1;                  // the step writing the first placed value: the arena is allocated
  int last_birth = -1;                  // there, and the executor lets it go after the last placed value
  int last_step = -1;                   // is written; its bytes are freed after the last one dies
  int values = 0;                       // intermediates placed
  int64_t value_bytes = 0;              // their bytes, before sharing
  std::vector<int> in_place;            // by step: the value input whose storage the result takes (Note
                                        // [Results written into a dying argument]), or -1
  // By step: a kernel's (output buffer, input buffer) pairs whose output takes the input's storage (Note
  // [Kernel results written over a dying input]); empty for other steps.
  std::vector<std::vector<std::pair<int, int>>> kernel_in_place;
};

// Note [Peak memory]: the bytes of results live at once at the worst point of a call, in the order of the
// graph's nodes (eager: the graph as captured) or of the plan's steps.
int64_t eager_peak_bytes(const Graph& g, const OpFacts& ops);
// With a memory plan, the arena counts whole while it lives and its values not again.
int64_t plan_peak_bytes(const ExecutablePlan& plan, const OpFacts& ops, const MemoryPlan* memory = nullptr);
// Note [Static memory plan]: places the plan's intermediates in one arena (none where FUSION_JIT_DISABLE
// has "arena"), and picks the steps that write their result into a dying argument (Note [Results written
// into a dying argument], Note [Kernel results written over a dying input]; none where `in_place` is false
// or FUSION_JIT_DISABLE has "in_place").
MemoryPlan plan_memory(const ExecutablePlan& plan, const OpFacts& ops, bool in_place = true);
// The input buffer whose storage kernel output buffer `bi` takes (`pairs`: the step's
// MemoryPlan::kernel_in_place; null: none), or null.
const KernelBuffer* written_over(const std::vector<KernelBuffer>& buffers, const std::vector<std::pair<int, int>>* pairs,
                                 size_t bi);

}  // namespace fusion_jit
