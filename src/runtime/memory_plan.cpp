#include "runtime/memory_plan.h"

#include <algorithm>
#include <functional>
#include <set>
#include <string>

#include "ir/op_table.h"
#include "support/options.h"

namespace fusion_jit {

bool TableOpFacts::returns_alias(const Node& n) const {
  const OpInfo* op = n.op();
  return op ? op->has(OpFlag::kReturnsAlias) : others_.returns_alias(n);
}

bool TableOpFacts::may_mutate(const Node& n) const {
  return n.op() ? false : others_.may_mutate(n);  // the table's ops are pure (ir/graph.h)
}

// Note [Peak memory]
// The bytes a call allocates that are live at once at its worst point: intermediates and outputs, not the
// inputs or frozen constants. A step's tensor results take new storage of their type's extent, except
// views (the schema's alias annotation, OpFacts::returns_alias) and lists, which share their inputs'
// storage; storage is freed when the last value on it dies. The plan is counted step by step with the
// executor's releases, its arena (Note [Static memory plan]) whole from its first value's write to its
// last one's death; eager over the graph as captured, before the passes (its own ops, one result each,
// freed after their last use). It is what the plan's order, fusion and arena need, as an ideal allocator
// would place the rest: our CPU pool and torch's caching allocator round sizes up and keep freed blocks.
namespace {

class StorageTracker {
 public:
  struct Storage {
    const Value* value;  // the value it was made for
    int64_t bytes;
    int refs = 1;
    int born, died = -1;  // steps: made at, last alive at (-1: alive at the end)
    bool kernel;          // a kernel's output
    bool counted;         // in the live bytes (not an arena value's)
    bool pinned = false;  // must outlive the call or be left where an op mutates it
  };

  explicit StorageTracker(size_t num_values) : of_(num_values) {}
  void fresh(const Value* v, int step, bool kernel = false, bool counted = true) {
    if (!v->is_tensor()) return;
    const TensorType& t = v->tensor_type();
    storages_.push_back({v, t.extent() * static_cast<int64_t>(dtype_size(t.dtype)), 1, step, -1, kernel, counted});
    of_[v->id()] = {static_cast<int>(storages_.size()) - 1};
    if (counted) live_ += storages_.back().bytes;
    note_peak(step);
  }
  // `v` holds the storages of `from` too.
  void share(const Value* v, const std::vector<const Value*>& from) {
    std::set<int> s(of_[v->id()].begin(), of_[v->id()].end());
    for (const Value* f : from)
      for (int x : of_[f->id()])
        if (s.insert(x).second) ++storages_[x].refs;
    of_[v->id()].assign(s.begin(), s.end());
  }
  void release(int id, int step) {
    for (int x : of_[id])
      if (--storages_[x].refs == 0) {
        storages_[x].died = step;
        if (storages_[x].counted) live_ -= storages_[x].bytes;
      }
    of_[id].clear();
  }
  // Bytes outside any value's storage (the arena) taken (> 0) or given back at `step`.
  void hold(int64_t bytes, int step) {
    live_ += bytes;
    note_peak(step);
  }
  void pin(const Value* v) {
    for (int x : of_[v->id()]) storages_[x].pinned = true;
  }
  const std::vector<int>& of(const Value* v) const { return of_[v->id()]; }
  const std::vector<Storage>& storages() const { return storages_; }
  int64_t peak() const { return peak_; }
  int peak_step() const { return peak_step_; }

 private:
  void note_peak(int step) {
    if (live_ <= peak_) return;
    peak_ = live_;
    peak_step_ = step;
  }
  std::vector<std::vector<int>> of_;  // value id -> the storages it holds
  std::vector<Storage> storages_;
  int64_t live_ = 0, peak_ = 0;
  int peak_step_ = -1;
};

bool is_list_schema(const std::string& s) { return s == "prim::ListConstruct" || s == "prim::ListUnpack"; }

// The results of an ATen node (or a list node) into `t` at `step`: views and lists share their inputs'
// storage (a view its first tensor input's). `may_alias`: new results that may share every tensor input's
// storage too (an op without alias annotation that returns its input where it can: type_as, dropout).
void track_node(const Node& n, const OpFacts& ops, StorageTracker& t, int step, bool may_alias = false) {
  if (n.is_constant()) return;
  const bool list = is_list_schema(n.schema());
  const bool alias = !list && ops.returns_alias(n);
  std::vector<const Value*> from, all;
  for (const Value* v : n.value_inputs()) {
    if (list || (alias && from.empty() && v->is_tensor())) from.push_back(v);
    all.push_back(v);
  }
  for (const Value* o : n.outputs()) {
    if (list || alias) {
      t.share(o, from);
    } else {
      t.fresh(o, step);
      if (may_alias) t.share(o, all);
    }
  }
}

// Whether a step may change its arguments in place (OpFacts::may_mutate); constants and lists never do.
bool may_mutate(const Node& n, const OpFacts& ops) {
  return !n.is_constant() && !is_list_schema(n.schema()) && ops.may_mutate(n);
}

// Note [Results written into a dying argument]
// Some ops have an in-place form that computes the same result into one of their arguments
// (OpFacts::in_place_form). The one so far is a residual block's last convolution (torch/executor.cpp):
// mkldnn::_convolution_pointwise.binary(X, other, W, B, ..., "add", alpha, unary, ...), with its add (and
// relu) as post-ops (Note [Convolution rules]), computes into new storage and copies `other` first; its
// in-place form, mkldnn::_convolution_pointwise_.binary(other, X, W, B, ...), adds into `other` itself, as
// Inductor's freezing calls it, with the same bits (timed in bench/RESULTS.md, "A dying residual written
// in place"). A step takes the in-place form in two stages.
// - At plan build (plan_memory, in_place_input): the op has such a form for this node (the convolution's
//   post-ops are those its in-place form takes: add with alpha 1, then relu or none); the argument it
//   writes dies at the step, is read once by it and has the result's type (sizes, strides, dtype,
//   device); and its storage was made within the call and no other value holds it (not an input, a
//   constant, nor the base of a view still alive). The memory plan then gives the result that argument's
//   storage, kept out of the arena.
// - At run time (torch/executor.cpp): the tensor the step receives is the only reference to itself and to
//   its storage (use counts of 1: nothing else can see the write, whichever op made it, an op that returns
//   its input unannotated included), is plain and does not need autograd. Otherwise the step calls the
//   out-of-place form, whose result then has storage of its own (the plan's peak counted it as shared).
// Inputs and frozen constants are never written: the caller and the plan hold references to them.
// FUSION_JIT_DISABLE=in_place (or a module's disable option naming it) leaves every step out-of-place.

// The value input of step `st` whose storage its result may take (Note [Results written into a dying
// argument]), given the storages tracked up to the step; -1 where none may.
int in_place_input(const ExecStep& st, const StorageTracker& t, const OpFacts& ops) {
  if (st.kernel >= 0 || st.node->is_constant() || is_list_schema(st.node->schema())) return -1;
  const Node& n = *st.node;
  const OpFacts::InPlaceForm form = ops.in_place_form(n);
  if (!form.schema) return -1;
  const auto& ins = n.value_inputs();
  const Value* other = ins.at(form.input);
  if (std::count(ins.begin(), ins.end(), other) != 1) return -1;
  if (std::find(st.release.begin(), st.release.end(), other->id()) == st.release.end()) return -1;
  if (!other->is_tensor() || n.outputs().size() != 1 || !n.output()->is_tensor()) return -1;
  const TensorType& o = other->tensor_type();
  const TensorType& y = n.output()->tensor_type();
  if (o.sizes != y.sizes || o.strides != y.strides || o.dtype != y.dtype || o.device != y.device ||
      o.device_index != y.device_index)
    return -1;
  const auto& held = t.of(other);
  if (held.empty()) return -1;  // an input's or a constant's
  for (int x : held)
    if (t.storages()[x].refs != 1) return -1;
  return form.input;
}

// Note [Kernel results written over a dying input]
// A pointwise kernel reading an ATen step's result that dies at the kernel (a convolution's output, read
// by its batch norm and activation) writes its own output over it where the two have one type (sizes,
// strides, dtype; CPU): the kernel reads each element before it writes the same element, and no other
// element of that buffer, so the result is the same. It saves the output's memory and the kernel's time,
// since the write no longer reads lines it then overwrites (bench/RESULTS.md, "kernels writing over a
// dying result"). Inductor reuses such buffers too. As Note [Results written into a dying argument]:
// - at plan build (plan_memory): the kernel is pointwise (no reduction, no cat pieces, no gathered load,
//   no slices of an output), the input's buffer is the only one reading it, it dies at the kernel, it is
//   not a view, and its storage was made by an ATen step within the call and no other value holds it
//   (inputs and constants never are; kernel outputs are placed in the arena instead);
// - at run time: the input's tensor and its storage have no other reference (an op that returned its
//   argument unannotated leaves the caller's reference), else the output is allocated as usual.
// FUSION_JIT_DISABLE=in_place (or a module's disable option naming it) turns this off too.
std::vector<std::pair<int, int>> kernel_in_place_buffers(const ExecStep& st, const KernelSpec& k,
                                                         const StorageTracker& t) {
  std::vector<std::pair<int, int>> pairs;
  if (k.is_reduction() || !k.pieces.empty() || k.device != Device::kCPU) return pairs;
  for (const KernelBuffer& b : k.buffers)
    if (b.gather >= 0 || (b.is_output && b.offset != 0)) return pairs;
  std::vector<bool> taken(k.buffers.size(), false);
  for (size_t o = 0; o < k.buffers.size(); ++o) {
    const KernelBuffer& out = k.buffers[o];
    if (!out.is_output) continue;
    const TensorType& y = out.value->tensor_type();
    for (size_t i = 0; i < k.buffers.size(); ++i) {
      const KernelBuffer& in = k.buffers[i];
      if (in.is_output || taken[i] || in.strides != out.strides) continue;
      const Value* v = in.value;
      const TensorType& x = v->tensor_type();
      if (x.sizes != y.sizes || x.strides != y.strides || x.dtype != y.dtype || x.device != y.device) continue;
      if (std::count_if(k.buffers.begin(), k.buffers.end(), [&](const KernelBuffer& c) { return c.value == v; }) != 1)
        continue;
      if (std::find(st.release.begin(), st.release.end(), v->id()) == st.release.end()) continue;
      const auto& held = t.of(v);
      if (held.size() != 1) continue;
      const auto& s = t.storages()[held[0]];
      if (s.kernel || s.value != v || s.refs != 1) continue;
      taken[i] = true;
      pairs.emplace_back(static_cast<int>(o), static_cast<int>(i));
      break;
    }
  }
  return pairs;
}

// A kernel step's outputs in `t`: each shares the storage of the input it is written over, or is fresh
// (`alone(v)`: allocated on its own, counted in the live bytes; not an arena value).
void track_kernel_outputs(StorageTracker& t, const std::vector<KernelBuffer>& buffers,
                          const std::vector<std::pair<int, int>>* pairs, int step,
                          const std::function<bool(const Value*)>& alone) {
  for (size_t bi = 0; bi < buffers.size(); ++bi) {
    const KernelBuffer& b = buffers[bi];
    if (!b.is_output || b.offset != 0) continue;
    if (const KernelBuffer* into = written_over(buffers, pairs, bi)) t.share(b.value, {into->value});
    else t.fresh(b.value, step, true, alone(b.value));
  }
}

// plan_peak_bytes, and the step where it is reached.
std::pair<int64_t, int> plan_peak(const ExecutablePlan& plan, const OpFacts& ops, const MemoryPlan* memory) {
  StorageTracker t(plan.graph->num_value_ids());
  const bool arena = memory && memory->arena_bytes > 0;
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const ExecStep& st = plan.steps[si];
    const int step = static_cast<int>(si);
    if (arena && step == memory->first_step) t.hold(memory->arena_bytes, step);
    if (st.kernel >= 0) {
      const auto* pairs = memory && !memory->kernel_in_place.empty() ? &memory->kernel_in_place[si] : nullptr;
      track_kernel_outputs(t, plan.kernels[st.kernel].spec.buffers, pairs, step, [&](const Value* v) {
        return !memory || memory->arena_bytes == 0 || memory->offset[v->id()] < 0;
      });
    } else if (memory && !memory->in_place.empty() && memory->in_place[si] >= 0) {
      t.share(st.node->output(), {st.node->value_inputs().at(memory->in_place[si])});
    } else {
      track_node(*st.node, ops, t, step);
    }
    for (int id : st.release) t.release(id, step);
    if (arena && step == memory->last_step) t.hold(-memory->arena_bytes, step);
  }
  return {t.peak(), t.peak_step()};
}

}  // namespace

const KernelBuffer* written_over(const std::vector<KernelBuffer>& buffers, const std::vector<std::pair<int, int>>* pairs,
                                 size_t bi) {
  if (pairs)
    for (const auto& [o, i] : *pairs)
      if (o == static_cast<int>(bi)) return &buffers[i];
  return nullptr;
}

int64_t eager_peak_bytes(const Graph& g, const OpFacts& ops) {
  StorageTracker t(g.num_value_ids());
  const auto& nodes = g.nodes();
  std::vector<int> last(g.num_value_ids(), -1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const Value* v : nodes[i]->value_inputs()) last[v->id()] = static_cast<int>(i);
  for (const Value* v : g.outputs()) last[v->id()] = static_cast<int>(nodes.size());
  std::vector<std::vector<int>> dies(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const Value* o : nodes[i]->outputs()) {
      int l = last[o->id()];
      if (l < 0) dies[i].push_back(o->id());  // unused: freed at once
      else if (l < static_cast<int>(nodes.size())) dies[l].push_back(o->id());
    }
  for (size_t i = 0; i < nodes.size(); ++i) {
    track_node(*nodes[i], ops, t, static_cast<int>(i));
    for (int id : dies[i]) t.release(id, static_cast<int>(i));
  }
  return t.peak();
}

int64_t plan_peak_bytes(const ExecutablePlan& plan, const OpFacts& ops, const MemoryPlan* memory) {
  return plan_peak(plan, ops, memory).first;
}

// Note [Static memory plan]
// A kernel output that dies within the call gets a place in one arena, allocated once per call where the
// first placed value is written (from the CPU pool, or torch's caching allocator on CUDA: a CUDA Graph's
// private pool under capture) and freed when the last placed value dies. Liveness is storage liveness
// as Note [Peak memory] counts it: a storage is alive from the step that writes it to the step after
// which no value on it (its views, the lists holding it) is used. A kernel output is left out of the
// arena, allocated alone as before, where its storage
// - reaches a returned value (results never alias the arena: the caller keeps them past the call);
// - is an argument of a step that may mutate it (a mutating schema, or an op whose schema is unknown):
//   such an op may resize it, and it keeps eager's aliasing with the values the op returns;
// - or lies on another device than the arena's.
// An op that returns its input although its schema has no alias annotation (type_as, dropout in eval,
// contiguous through a composite) would hand out arena bytes as a new value: such steps are flagged and
// their tensor results that land in the arena are copied out at once (`check`); where such a result is
// mutated later, its inputs are treated as its aliases when planning, so they stay out of the arena.
// Places are chosen greedily, largest first, each at the lowest 64-byte aligned offset free over its
// lifetime (the "greedy by size" placement of TFLite's arena planner): storages whose lifetimes do not
// overlap share bytes. The arena then counts whole in the plan's peak over its own lifetime, so it may
// hold bytes for values not yet written or dead where the call's peak lies: while the plan's peak is
// above that of every output allocated alone, the largest placed value not alive at the peak's step is
// taken out and the rest placed again (with none left to take out, there is no arena). The arena never
// raises the peak; it trades a per-output allocation for one per call.
namespace {

// The storages of one call, step by step as the executor runs it; on the way, where `in_place`, the
// steps whose result takes a dying argument's storage go into `m` (its in_place and kernel_in_place,
// sized by the caller). Storages that an argument of a step that may mutate it holds, or that such a
// step's result takes, are pinned. `reads[step]`: the storages an ATen step's inputs hold.
StorageTracker track_call(const ExecutablePlan& plan, const OpFacts& ops, bool in_place, MemoryPlan& m,
                          std::vector<std::vector<int>>& reads) {
  const Graph& g = *plan.graph;
  std::vector<bool> mutated(g.num_value_ids(), false);
  for (const ExecStep& st : plan.steps)
    if (st.kernel < 0 && may_mutate(*st.node, ops))
      for (const Value* v : st.node->value_inputs()) mutated[v->id()] = true;
  StorageTracker t(g.num_value_ids());
  reads.assign(plan.steps.size(), {});
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const ExecStep& st = plan.steps[si];
    const int step = static_cast<int>(si);
    if (st.kernel >= 0) {
      const KernelSpec& k = plan.kernels[st.kernel].spec;
      if (in_place) m.kernel_in_place[si] = kernel_in_place_buffers(st, k, t);
      track_kernel_outputs(t, k.buffers, &m.kernel_in_place[si], step, [](const Value*) { return true; });
    } else if (!st.node->is_constant()) {
      const Node& n = *st.node;
      const bool mutates = may_mutate(n, ops);
      bool result_mutated = false;
      for (const Value* o : n.outputs()) result_mutated = result_mutated || mutated[o->id()];
      for (const Value* v : n.value_inputs()) {
        if (mutates) t.pin(v);
        reads[si].insert(reads[si].end(), t.of(v).begin(), t.of(v).end());
      }
      if (in_place && (m.in_place[si] = in_place_input(st, t, ops)) >= 0) {
        const Value* into = n.value_inputs()[m.in_place[si]];
        t.pin(into);
        t.share(n.output(), {into});
      } else {
        track_node(n, ops, t, step, result_mutated);
      }
    }
    for (int id : st.release) t.release(id, step);
  }
  return t;
}

// The storages the arena may hold, largest first: kernel outputs that die within the call, are not
// pinned, have bytes, and lie on the device of the first such (which becomes `m`'s device).
std::vector<int> arena_candidates(const std::vector<StorageTracker::Storage>& storages, MemoryPlan& m) {
  std::vector<int> order;
  for (size_t i = 0; i < storages.size(); ++i) {
    const auto& s = storages[i];
    if (!s.kernel || s.pinned || s.died < 0 || s.bytes == 0) continue;
    const TensorType& type = s.value->tensor_type();
    if (order.empty()) {
      m.device = type.device;
      m.device_index = type.device_index;
    } else if (type.device != m.device || type.device_index != m.device_index) {
      continue;
    }
    order.push_back(static_cast<int>(i));
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return storages[a].bytes > storages[b].bytes; });
  return order;
}

// Places `order`'s storages (largest first) in `m`'s arena, each at the lowest 64-byte aligned offset
// free over its lifetime; `place_of[i]`: storage i's offset, or -1.
void place(const std::vector<StorageTracker::Storage>& storages, const std::vector<int>& order, MemoryPlan& m,
           std::vector<int64_t>& place_of) {
  constexpr int64_t kAlign = 64;
  std::fill(m.offset.begin(), m.offset.end(), -1);
  place_of.assign(storages.size(), -1);
  m.arena_bytes = m.value_bytes = 0;
  m.values = 0;
  m.first_step = m.last_birth = m.last_step = -1;
  struct Placed {
    int64_t at, bytes;
    int born, died;
  };
  std::vector<Placed> placed;
  for (int i : order) {
    const auto& s = storages[i];
    const int64_t bytes = (s.bytes + kAlign - 1) / kAlign * kAlign;
    std::vector<std::pair<int64_t, int64_t>> busy;  // [at, end) of places alive with it
    for (const Placed& p : placed)
      if (p.born <= s.died && s.born <= p.died) busy.emplace_back(p.at, p.at + p.bytes);
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& [b, e] : busy) {
      if (b >= at + bytes) break;
      at = std::max(at, e);
    }
    placed.push_back({at, bytes, s.born, s.died});
    m.first_step = m.first_step < 0 ? s.born : std::min(m.first_step, s.born);
    m.last_birth = std::max(m.last_birth, s.born);
    m.last_step = std::max(m.last_step, s.died);
    place_of[i] = at;
    m.offset[s.value->id()] = at;
    m.arena_bytes = std::max(m.arena_bytes, at + bytes);
    ++m.values;
    m.value_bytes += s.bytes;
  }
}

// Places `order` as the Note says; then, while the arena raises the plan's peak above that of every
// output allocated alone, the largest placed value not alive at the peak's step leaves it and the rest
// are placed again; where none is left to take out, there is no arena. Returns each storage's offset in
// the arena, or -1.
std::vector<int64_t> place_within_peak(const ExecutablePlan& plan, const OpFacts& ops,
                                       const std::vector<StorageTracker::Storage>& storages, std::vector<int> order,
                                       MemoryPlan& m) {
  MemoryPlan alone_plan;  // no arena: every output allocated alone, results written in place as planned
  alone_plan.in_place = m.in_place;
  alone_plan.kernel_in_place = m.kernel_in_place;
  const int64_t alone = plan_peak(plan, ops, &alone_plan).first;
  std::vector<int64_t> place_of;
  for (;;) {
    place(storages, order, m, place_of);
    const auto [peak, step] = plan_peak(plan, ops, &m);
    if (peak <= alone || order.empty()) break;
    auto idle = std::find_if(order.begin(), order.end(),
                             [&, step = step](int i) { return storages[i].born > step || storages[i].died < step; });
    if (idle == order.end()) order.clear();
    else order.erase(idle);
  }
  return place_of;
}

// MemoryPlan::check: the ATen steps that read a placed storage (`reads`, `place_of`) and whose schema
// promises new results (no alias annotation: a view's results share the arena's bytes by plan).
void flag_arena_readers(const ExecutablePlan& plan, const OpFacts& ops, const std::vector<std::vector<int>>& reads,
                        const std::vector<int64_t>& place_of, MemoryPlan& m) {
  for (size_t si = 0; si < plan.steps.size(); ++si) {
    const ExecStep& st = plan.steps[si];
    if (st.kernel >= 0 || st.node->is_constant() || is_list_schema(st.node->schema())) continue;
    if (ops.returns_alias(*st.node)) continue;
    for (int x : reads[si]) m.check[si] = m.check[si] || place_of[x] >= 0;
  }
}

}  // namespace

MemoryPlan plan_memory(const ExecutablePlan& plan, const OpFacts& ops, bool in_place) {
  MemoryPlan m;
  m.offset.assign(plan.graph->num_value_ids(), -1);
  m.check.assign(plan.steps.size(), false);
  m.in_place.assign(plan.steps.size(), -1);
  m.kernel_in_place.assign(plan.steps.size(), {});
  in_place = in_place && !Options::get().is_disabled("in_place");
  std::vector<std::vector<int>> reads;
  StorageTracker t = track_call(plan, ops, in_place, m, reads);
  if (Options::get().is_disabled("arena")) return m;
  for (const Value* v : plan.graph->outputs()) t.pin(v);
  const std::vector<int64_t> place_of = place_within_peak(plan, ops, t.storages(), arena_candidates(t.storages(), m), m);
  flag_arena_readers(plan, ops, reads, place_of, m);
  return m;
}

}  // namespace fusion_jit
