#include "runtime/run_loop.h"

#include <algorithm>
#include <chrono>

#include "runtime/profile.h"
#include "support/error.h"

namespace fusion_jit {

RunSchedule schedule_run(const ExecutablePlan& plan, const std::vector<int64_t>& view_offset) {
  const Graph& g = *plan.graph;
  const size_t n_steps = plan.steps.size();
  FJ_INTERNAL_ASSERT(view_offset.size() == n_steps, "{} view offsets for {} steps", view_offset.size(), n_steps);
  RunSchedule s;
  s.folded.assign(n_steps, false);
  for (const ExecStep& st : plan.steps) s.release.push_back(st.release);
  s.kernel_inputs.assign(plan.kernels.size(), {});
  for (size_t k = 0; k < plan.kernels.size(); ++k) s.kernel_inputs[k].resize(plan.kernels[k].spec.buffers.size());
  std::vector<int> step_of(g.num_value_ids(), -1);  // value id -> the ATen step making it
  for (size_t i = 0; i < n_steps; ++i) {
    const ExecStep& st = plan.steps[i];
    if (st.kernel < 0 && !st.node->is_constant())
      for (const Value* v : st.node->outputs()) step_of[v->id()] = static_cast<int>(i);
  }
  std::vector<bool> returned(g.num_value_ids(), false);
  for (const Value* v : g.outputs()) returned[v->id()] = true;
  const auto users = g.users();
  // Decided last to first: a view is folded if its readers are kernels or folded views.
  for (size_t i = n_steps; i-- > 0;) {
    if (view_offset[i] < 0) continue;
    const Value* v = plan.steps[i].node->output();
    bool ok = !returned[v->id()] && !users[v->id()].empty();
    for (const Node* u : users[v->id()]) {
      const int us = u->outputs().empty() ? -1 : step_of[u->output()->id()];
      if (us >= 0 && !s.folded[us]) ok = false;
    }
    s.folded[i] = ok;
  }
  // Roots and offsets, first to last.
  std::vector<FoldedInput> at(g.num_value_ids());
  for (size_t i = 0; i < n_steps; ++i) {
    if (!s.folded[i]) continue;
    const Node& n = *plan.steps[i].node;
    const Value* base = n.args()[0].value;
    const int64_t bytes = view_offset[i] * static_cast<int64_t>(dtype_size(n.output()->tensor_type().dtype));
    at[n.output()->id()] = at[base->id()].root >= 0
                               ? FoldedInput{at[base->id()].root, at[base->id()].offset_bytes + bytes}
                               : FoldedInput{base->id(), bytes};
  }
  std::vector<int> needed(g.num_value_ids(), -1);  // the last kernel step reading a root through a view
  for (size_t i = 0; i < n_steps; ++i) {
    const ExecStep& st = plan.steps[i];
    if (st.kernel < 0) continue;
    const auto& buffers = plan.kernels[st.kernel].spec.buffers;
    for (size_t b = 0; b < buffers.size(); ++b) {
      if (buffers[b].is_output) continue;
      const FoldedInput& f = at[buffers[b].value->id()];
      if (f.root < 0) continue;
      s.kernel_inputs[st.kernel][b] = f;
      needed[f.root] = std::max(needed[f.root], static_cast<int>(i));
    }
  }
  for (size_t i = 0; i < n_steps; ++i) {
    auto& rel = s.release[i];
    for (auto it = rel.begin(); it != rel.end();) {
      if (needed[*it] > static_cast<int>(i)) {
        s.release[needed[*it]].push_back(*it);
        it = rel.erase(it);
      } else {
        ++it;
      }
    }
  }
  return s;
}

namespace {

// The data of each buffer of kernel step `si`, made where the kernel writes it.
void kernel_buffers(const ExecutablePlan& plan, const RunSchedule& schedule, const MemoryPlan& memory, size_t si,
                    StepRunner& r, std::vector<void*>& ptrs) {
  const int kernel = plan.steps[si].kernel;
  const std::vector<KernelBuffer>& buffers = plan.kernels[kernel].spec.buffers;
  const std::vector<FoldedInput>& folded = schedule.kernel_inputs[kernel];
  const auto* over_pairs = memory.kernel_in_place.empty() ? nullptr : &memory.kernel_in_place[si];
  ptrs.clear();
  for (size_t bi = 0; bi < buffers.size(); ++bi) {
    const KernelBuffer& b = buffers[bi];
    if (!b.is_output) {
      // Read through views never made (Note [Views folded into kernel loads]), or the value itself.
      ptrs.push_back(folded[bi].root >= 0 ? const_cast<char*>(static_cast<const char*>(r.root(folded[bi].root)) +
                                                              folded[bi].offset_bytes)
                                          : const_cast<void*>(r.input(b)));
    } else if (static_cast<int64_t>(b.offset) > 0) {
      // A further slice of a cat's result, allocated for its first (Note [Concatenation in kernels]).
      ptrs.push_back(static_cast<char*>(r.made_output(b)) +
                     static_cast<int64_t>(b.offset) * static_cast<int64_t>(dtype_size(b.value->tensor_type().dtype)));
    } else if (const KernelBuffer* into = written_over(buffers, over_pairs, bi);
               into && r.sole_reference(into->value->id())) {
      // Note [Kernel results written over a dying input].
      ptrs.push_back(r.write_over(b, into->value->id()));
    } else {
      ptrs.push_back(r.allocate(b, memory.arena_bytes > 0 ? memory.offset[b.value->id()] : -1));
    }
  }
}

}  // namespace

void run_steps(const ExecutablePlan& plan, const RunSchedule& schedule, const MemoryPlan& memory, StepRunner& r) {
  FJ_INTERNAL_ASSERT(schedule.release.size() == plan.steps.size() && schedule.folded.size() == plan.steps.size(),
                     "the plan's run was not scheduled");
  const bool profile = profiling(), record = step_recording();
  using Clock = std::chrono::steady_clock;
  const auto run_start = profile ? Clock::now() : Clock::time_point();
  auto step_start = run_start;
  std::vector<void*> ptrs;
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const ExecStep& st = plan.steps[si];
    if (profile || record) step_start = Clock::now();
    bool timed = true;
    if (st.kernel >= 0) {
      kernel_buffers(plan, schedule, memory, si, r, ptrs);
      r.launch(st.kernel, ptrs.data());
    } else if (st.node->is_constant()) {
      r.constant(*st.node);
      timed = false;
    } else if (schedule.folded[si]) {
      timed = false;  // never made: its kernels read its root
    } else {
      r.call(si, *st.node);
    }
    for (int id : schedule.release[si]) r.release(id);
    if (static_cast<int>(si) == memory.last_birth) r.release_arena();
    if ((profile || record) && timed) {
      const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - step_start).count();
      if (record) record_step_time(&plan, si, ns);
      if (!profile) continue;
      if (st.kernel >= 0) profile_step(StepKind::kKernel, "", ns);
      else
        profile_step(is_compute_schema(st.node->schema()) ? StepKind::kAtenCompute : StepKind::kAtenOther,
                     st.node->schema(), ns);
    }
  }
  if (profile)
    profile_plan_run(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - run_start).count());
}

}  // namespace fusion_jit
