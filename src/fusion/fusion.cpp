#include "fusion/fusion.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "cost/work.h"
#include "ir/op_table.h"
#include "support/error.h"

namespace fusion_jit {
namespace {

std::string shape_str(const SymSizes& s) { return "[" + s.str() + "]"; }

std::string node_name(const Node* n) {
  return n->schema() + (n->outputs().empty() ? "" : " " + n->output()->name());
}

// Note [Reduction groups]
// A group with reductions iterates over S, the shape every reduction of it reduces, split into rows (the
// kept dims) of `row_len` elements (the reduced dims R). Each value of the group is either
//  - a row value, computed once per row: a reduction's result, or an elementwise op whose group inputs
//    are all row values and whose shape is a row shape (S with R set to 1, or S without R: keepdim or not);
//  - an element value, computed per element of S: every other op. Its shape must be S, or broadcast to S
//    with all its users inside the group (it is recomputed per element, never written).
// An element value may read a row value (x - max): the row value's dims must land on the kept dims when
// broadcast, which holds for keepdim shapes and for reductions over leading dims.
// Passes: the kernel walks each row once per pass. A reduction accumulates in the pass where its input is
// first known and its result is known after that pass; an element value is known in the first pass
// after every row value it reads. softmax needs three passes (max; sum of exp; the output), layer_norm
// two (mean and variance together; the output). The kernel keeps the row on chip between passes when it
// fits (DeviceDescription::on_chip_row_bytes); the cost model charges a re-read per pass otherwise.
bool is_reduction(const Node* n) { return n->op() && n->op()->category == OpCategory::kReduction; }
bool is_gather(const Node* n) { return n->op() && n->op()->category == OpCategory::kGather; }

bool row_shape(const SymSizes& v, const SymSizes& S, const std::vector<int64_t>& R) {
  if (v.size() == S.size()) {
    SymSizes srow = S;
    for (int64_t d : R) srow[d] = 1;
    return broadcasts_to(v, srow);
  }
  SymSizes sr;
  for (size_t d = 0; d < S.size(); ++d)
    if (!std::count(R.begin(), R.end(), static_cast<int64_t>(d))) sr.push_back(S[d]);
  return v == sr;
}

// Whether a row value of shape v, read by an element value (broadcast to S, right-aligned), lands on the
// kept dims its row frame gives it.
bool row_consistent(const SymSizes& v, const SymSizes& S, const std::vector<int64_t>& R) {
  if (v.size() == S.size()) return true;
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < static_cast<int64_t>(S.size()); ++d)
    if (!std::count(R.begin(), R.end(), d)) kept.push_back(d);
  const int64_t off = static_cast<int64_t>(S.size() - v.size());
  for (size_t k = 0; k < v.size(); ++k)
    if (v[k] != 1 && kept.at(k) != off + static_cast<int64_t>(k)) return false;
  return true;
}

}  // namespace

std::optional<ReductionForm> reduction_form(const std::vector<const Node*>& nodes,
                                            const std::set<const Value*>& outside, std::string* why) {
  auto no = [&](std::string r) -> std::optional<ReductionForm> {
    if (why) *why = std::move(r);
    return std::nullopt;
  };
  ReductionForm f;
  bool first = true;
  for (const Node* n : nodes) {
    if (!is_reduction(n)) continue;
    auto info = reduction_info(*n);
    FJ_INTERNAL_ASSERT(info.has_value(), "{}: not a reduction", n->schema());
    const auto& in = n->args()[0].value->tensor_type().sizes;
    if (first) {
      f.shape = in;
      f.dims = info->dims;
      first = false;
    } else if (in != f.shape || info->dims != f.dims) {
      return no(fmt::format("{} reduces {} over dims {}, the group reduces {} over dims {}", node_name(n),
                            shape_str(in), shape_str(info->dims), shape_str(f.shape), shape_str(f.dims)));
    }
  }
  FJ_INTERNAL_ASSERT(!first, "reduction_form of a group without reductions");
  f.row_len = 1;
  for (int64_t d : f.dims) f.row_len *= f.shape[d];
  std::set<const Node*> members(nodes.begin(), nodes.end());
  auto member_value = [&](const Value* v) { return v->producer() && members.count(v->producer()) > 0; };
  for (const Node* n : nodes) {
    const Value* o = n->output();
    const auto& os = o->tensor_type().sizes;
    if (is_reduction(n)) {
      const Value* in = n->args()[0].value;
      if (member_value(in) && f.row_values.count(in))
        return no(fmt::format("{} reduces a value computed once per row", node_name(n)));
      int p = member_value(in) ? f.phase.at(in) : 0;
      f.row_values.insert(o);
      f.ready[o] = p + 1;
      f.passes = std::max(f.passes, p + 1);
      continue;
    }
    bool all_row = true;
    int ready = 0, phase = 0;
    for (const Value* v : n->value_inputs()) {
      if (!v->is_tensor() || !member_value(v)) continue;
      if (f.row_values.count(v)) ready = std::max(ready, f.ready.at(v));
      else all_row = false, phase = std::max(phase, f.phase.at(v));
    }
    // A gather reads no member value, yet is computed per element (Note [Gathered loads]).
    if (all_row && !is_gather(n) && row_shape(os, f.shape, f.dims)) {
      f.row_values.insert(o);
      f.ready[o] = ready;
      continue;
    }
    // An element value.
    if (os != f.shape) {
      if (!broadcasts_to(os, f.shape))
        return no(fmt::format("{} has shape {}, which does not broadcast to the reduced shape {}", node_name(n),
                              shape_str(os), shape_str(f.shape)));
      if (outside.count(o))
        return no(fmt::format("{} has shape {}, not the reduced shape {}, and is used outside the group",
                              node_name(n), shape_str(os), shape_str(f.shape)));
    }
    for (const Value* v : n->value_inputs())
      if (v->is_tensor() && member_value(v) && f.row_values.count(v) &&
          !row_consistent(v->tensor_type().sizes, f.shape, f.dims))
        return no(fmt::format("{} reads the per-row value {} of shape {} across the rows", node_name(n), v->name(),
                              shape_str(v->tensor_type().sizes)));
    f.phase[o] = std::max(phase, ready);
    if (outside.count(o)) f.passes = std::max(f.passes, f.phase[o] + 1);
  }
  f.passes = std::max(f.passes, 1);
  return f;
}

namespace {

// Note [Greedy fusion]
// Nodes are visited from last to first. An unassigned fusible node starts a group (its output shape is the
// group's iteration space); the group then grows by absorbing unassigned fusible neighbours, producers and
// consumers, one at a time, while each step is legal and the cost model says it pays:
//  - shape: a neighbour whose output has the iteration shape joins; one whose output only broadcasts to it
//    joins when every user is inside the group (it is recomputed per element, never written out);
//  - per-channel arguments (batch_norm's) are read as inputs, their producers never absorbed;
//  - no cycle: contracting the group with the neighbour must leave the graph of groups acyclic, checked by
//    searching a path between them through other nodes or groups;
//  - cost: the roofline time of the merged kernel must be below that of the two run apart.
// Values used outside the group, or returned by the graph, become extra outputs of the kernel.
class GreedyFuser {
 public:
  GreedyFuser(const Graph& g, const CostModel& cost, bool enable, bool horizontal, bool cat, bool gather, int refuse)
      : g_(g), cost_(cost), enable_(enable), horizontal_(horizontal), cat_(cat), gather_(gather), refuse_(refuse) {
    nodes_ = g.nodes();
    for (size_t i = 0; i < nodes_.size(); ++i) index_[nodes_[i]] = static_cast<int>(i);
    users_ = g.users();
    // Nodes with side effects (random draws) keep their order: each is an edge to the next one.
    next_effect_.assign(nodes_.size(), -1);
    for (int i = 0, prev = -1; i < static_cast<int>(nodes_.size()); ++i)
      if (nodes_[i]->side_effects()) {
        if (prev >= 0) next_effect_[prev] = i;
        prev = i;
      }
    group_of_.assign(nodes_.size(), -1);
    for (const Value* o : g.outputs()) graph_outputs_.insert(o);
    // A cat or stack and the list it alone reads run as one unit (Note [Concatenation in kernels]).
    companion_.assign(nodes_.size(), -1);
    owner_.assign(nodes_.size(), -1);
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (const Node* list = cat ? cat_list(*nodes_[i]) : nullptr) {
        const Value* lv = list->output();
        if (users_[lv->id()].size() != 1 || graph_outputs_.count(lv)) continue;
        int l = index_.at(list);
        companion_[i] = l;
        owner_[l] = static_cast<int>(i);
      }
  }

  FusionPlan run() {
    std::vector<std::string> why_not(nodes_.size());
    std::vector<bool> fusible(nodes_.size());
    for (size_t i = 0; i < nodes_.size(); ++i) {
      fusible[i] = can_fuse_node(*nodes_[i], &why_not[i]);
      if (fusible[i] && cat_list(*nodes_[i]) && companion_[i] < 0) {
        fusible[i] = false;
        why_not[i] = cat_ ? "its list is read by another node too: runs through ATen"
                          : "runs through ATen (FUSION_JIT_DISABLE=cat)";
      }
      if (fusible[i] && !gather_ && is_gather(nodes_[i])) {
        fusible[i] = false;
        why_not[i] = "runs through ATen (FUSION_JIT_DISABLE=gather)";
      }
    }
    // Reductions seed groups first (the last first), so that the row values after them (log(sum),
    // rsqrt(var + eps)) are judged as computed once per row, not once per element of a pointwise group.
    std::vector<int> order;
    for (int pass = 0; pass < 2; ++pass)
      for (int i = static_cast<int>(nodes_.size()) - 1; i >= 0; --i)
        if (is_reduction(nodes_[i]) == (pass == 0)) order.push_back(i);
    for (int i : order) {
      if (!fusible[i] || group_of_[i] >= 0) continue;
      int gid = static_cast<int>(members_.size());
      members_.push_back(unit(i));
      decisions_.emplace_back();
      for (int m : members_.back()) group_of_[m] = gid;
      if (is_reduction(nodes_[i])) {
        forms_.push_back(form_of({i}, nullptr));
        shapes_.push_back(forms_.back()->shape);
      } else {
        forms_.emplace_back();
        shapes_.push_back(iteration_shape(i));
      }
      if (enable_) grow(gid, fusible);
    }
    if (enable_ && horizontal_) merge_horizontal();
    return finish(why_not);
  }

 private:
  void grow(int gid, const std::vector<bool>& fusible) {
    std::set<int> rejected;
    bool progress = true;
    while (progress) {
      progress = false;
      for (int cand : neighbours(gid)) {
        if (!fusible[cand] || group_of_[cand] >= 0 || rejected.count(cand)) continue;
        std::string reason;
        bool ok = try_add(gid, cand, &reason);
        decisions_[gid].push_back({ok, node_name(nodes_[cand]) + ": " + reason});
        if (ok) {
          progress = true;
          break;  // neighbours changed
        }
        rejected.insert(cand);
      }
    }
  }

  // Note [Horizontal fusion]
  // After the groups have grown, pointwise groups over the same iteration space that read a tensor of
  // that size in common and have no path between them (neither reads what the other writes, directly or
  // through other steps), whose outputs share one device and one layout, are merged into one kernel when
  // the cost model prices the merged kernel below the two apart: one launch fewer, and the shared inputs
  // read once. Groups with nothing in common (or only a scalar or a broadcast row) stay apart: a launch is
  // all they would save, and each other buffer of a kernel costs registers on a GPU (its offsets). Groups
  // with reductions are left apart (their siblings already join in grow()). Pairs are tried in order of
  // first node; a group merges with as many later groups as pay.
  void merge_horizontal() {
    for (size_t a = 0; a < members_.size(); ++a) {
      if (forms_[a] || has_cat(members_[a])) continue;
      for (size_t b = a + 1; b < members_.size();) {
        // The same iteration space as expressions (no guard): in a shape class, groups whose spaces are
        // equal only at the hints ([s0,64] and [64,64] at s0 = 64) would fix the class's size to merge.
        if (forms_[b] || has_cat(members_[b]) || !shapes_[b].same(shapes_[a]) ||
            !shares_input(members_[a], members_[b], shapes_[a]) ||
            !same_layout(members_[a], members_[b]) || reaches(static_cast<int>(a), static_cast<int>(b)) ||
            reaches(static_cast<int>(b), static_cast<int>(a))) {
          ++b;
          continue;
        }
        std::vector<int> merged = members_[a];
        merged.insert(merged.end(), members_[b].begin(), members_[b].end());
        std::sort(merged.begin(), merged.end());
        WorkEstimate apart = group_work(members_[a], shapes_[a]);
        apart += group_work(members_[b], shapes_[b]);
        WorkEstimate together = group_work(merged, shapes_[a]);
        double t_apart = cost_.estimate_us(apart), t_together = cost_.estimate_us(together);
        std::string what = node_name(nodes_[members_[b][0]]);
        if (members_[b].size() > 1) what += fmt::format(" and {} more op{}", members_[b].size() - 1,
                                                        members_[b].size() == 2 ? "" : "s");
        what += fmt::format(", independent, over {}", shape_str(shapes_[a]));
        if (t_together >= t_apart) {
          decisions_[a].push_back({false, fmt::format("{}: not profitable side by side: {:.1f} us merged vs {:.1f} us apart",
                                                      what, t_together, t_apart)});
          ++b;
          continue;
        }
        if (refused_now()) {
          decisions_[a].push_back({false, fmt::format("{}: {} (would merge side by side: est. {:.1f} -> {:.1f} us)",
                                                      what, kRefusedForMeasurement, t_apart, t_together)});
          ++b;
          continue;
        }
        for (auto& d : decisions_[b]) decisions_[a].push_back(d);
        decisions_[a].push_back(
            {true, fmt::format("{}: merged side by side (horizontal): saves {} of traffic and {} launch "
                               "(est. {:.1f} -> {:.1f} us)",
                               what, format_bytes(apart.bytes - together.bytes), apart.launches - together.launches,
                               t_apart, t_together)});
        members_[a] = std::move(merged);
        // Drop group b; later groups move down by one.
        members_.erase(members_.begin() + b);
        shapes_.erase(shapes_.begin() + b);
        forms_.erase(forms_.begin() + b);
        decisions_.erase(decisions_.begin() + b);
        for (int& g : group_of_)
          if (g == static_cast<int>(b)) g = static_cast<int>(a);
          else if (g > static_cast<int>(b)) --g;
      }
    }
  }

  // Whether the two groups read in common a tensor (from outside both) with an element per point of the
  // iteration space `shape`: a shared scalar or broadcast row saves next to nothing.
  // A question of cost, answered at the hints (Note [Symbolic sizes]).
  bool shares_input(const std::vector<int>& a, const std::vector<int>& b, const SymSizes& shape) const {
    int64_t points = 1;
    for (const SymInt& s : shape) points *= s.hint();
    auto inputs = [&](const std::vector<int>& ms) {
      std::set<int> members(ms.begin(), ms.end());
      std::set<const Value*> in;
      for (int m : ms)
        for (const Value* v : nodes_[m]->value_inputs())
          if (v->is_tensor() && v->tensor_type().sym_numel().hint() == points &&
              !(v->producer() && members.count(index_.at(v->producer()))))
            in.insert(v);
      return in;
    };
    std::set<const Value*> ia = inputs(a);
    for (const Value* v : inputs(b))
      if (ia.count(v)) return true;
    return false;
  }

  // Whether every value the two groups write has one device and one memory layout: a kernel walks its
  // iteration space in one order, which would be strided for a group written in another layout.
  bool same_layout(const std::vector<int>& a, const std::vector<int>& b) const {
    std::optional<TensorType> first;
    for (const auto* ms : {&a, &b})
      for (const Value* v : outside_of(*ms)) {
        const TensorType& t = v->tensor_type();
        if (!first) first = t;
        else if (t.strides != first->strides || t.device != first->device || t.device_index != first->device_index)
          return false;
      }
    return first.has_value();
  }

  // A path from super node `from` to `to`, direct or through other steps.
  bool reaches(int from, int to) const {
    for (int s : super_succ(from))
      if (s == to) return true;
    return indirect_path(from, to);
  }

  // Unassigned neighbours of a group, nearest first (latest producers, then earliest consumers).
  std::vector<int> neighbours(int gid) {
    std::set<int> members(members_[gid].begin(), members_[gid].end());
    std::set<int> producers, consumers;
    for (int m : members_[gid]) {
      const Node* n = nodes_[m];
      for (size_t a = 0; a < n->args().size(); ++a) {
        const Arg& arg = n->args()[a];
        if (!arg.is_value() || !arg.value->producer()) continue;
        int p = index_.at(arg.value->producer());
        if (!members.count(p)) producers.insert(p);
      }
      for (const Value* o : n->outputs())
        for (const Node* u : users_[o->id()]) {
          int c = index_.at(u);
          if (owner_[c] >= 0) c = owner_[c];  // a list is reached through its cat
          if (!members.count(c)) consumers.insert(c);
        }
    }
    // Siblings: reductions reading a tensor a reduction of the group reads (mean and var of the same
    // input), so that one kernel reads it once.
    std::set<int> siblings;
    if (forms_[gid])
      for (int m : members_[gid]) {
        if (!is_reduction(nodes_[m])) continue;
        const Value* in = nodes_[m]->args()[0].value;
        for (const Node* u : users_[in->id()]) {
          int c = index_.at(u);
          if (!members.count(c) && is_reduction(u) && !producers.count(c) && !consumers.count(c)) siblings.insert(c);
        }
      }
    std::vector<int> out(producers.rbegin(), producers.rend());
    out.insert(out.end(), consumers.begin(), consumers.end());
    out.insert(out.end(), siblings.begin(), siblings.end());
    return out;
  }

  bool try_add(int gid, int cand, std::string* reason) {
    const Node* n = nodes_[cand];
    const auto& shape = shapes_[gid];
    std::set<int> members(members_[gid].begin(), members_[gid].end());
    std::vector<int> merged = members_[gid];
    for (int m : unit(cand)) merged.push_back(m);
    std::sort(merged.begin(), merged.end());
    // Per-channel arguments (batch_norm's) are read from memory through a channel map: their producer is
    // never in the kernel of their reader (either way round).
    for (int m : merged) {
      const Node* mn = nodes_[m];
      if (!mn->op()) continue;
      for (size_t a = 0; a < mn->args().size() && a < mn->op()->args.size(); ++a) {
        if (mn->op()->args[a].kind != ArgKind::kChannel || !mn->args()[a].is_value()) continue;
        const Node* p = mn->args()[a].value->producer();
        auto it = p ? index_.find(p) : index_.end();
        if (it != index_.end() && std::binary_search(merged.begin(), merged.end(), it->second)) {
          *reason = fmt::format("{} reads {} as a per-channel argument, from memory; not fused together",
                                node_name(mn), node_name(p));
          return false;
        }
      }
    }
    // Note [Gathered loads]: a gather reads its table and its indices from memory.
    for (int m : merged)
      if (auto gf = gather_form(*nodes_[m]))
        for (const Value* v : {gf->table, gf->index}) {
          const Node* p = v->producer();
          if (p && std::binary_search(merged.begin(), merged.end(), index_.at(p))) {
            *reason = fmt::format("{} reads its {} from memory, not from the kernel", node_name(nodes_[m]),
                                  v == gf->table ? "table" : "indices");
            return false;
          }
        }
    const SymSizes out_shape = iteration_shape(cand);
    bool recompute = false;
    std::optional<ReductionForm> form;
    SymSizes new_shape = shape;
    std::string two_cats;
    const Node* ragged = ragged_cat(merged, &two_cats);
    if (!two_cats.empty()) {
      *reason = two_cats;
      return false;
    }
    if (ragged) {
      // Note [Cats of unequal items]: a kernel over the cat's result, no reduction.
      if (forms_[gid] || is_reduction(n)) {
        *reason = "a concatenation is not fused with reductions";
        return false;
      }
      if (!ragged_fits(merged, *ragged, reason)) return false;
      new_shape = ragged->output()->tensor_type().sizes;
    } else if (cat_list(*n)) {
      // Note [Concatenation in kernels]: a group over the items' shape; no reduction; its result read by
      // no member unless it is a copy of one item.
      auto cf = cat_form(*n, nullptr);
      if (out_shape != shape) {
        *reason = fmt::format("{} joins a kernel over its items' shape {}, not the group's {}", n->schema(),
                              shape_str(out_shape), shape_str(shape));
        return false;
      }
      if (!cf->copies())
        for (const Node* u : users_[n->output()->id()])
          if (members.count(index_.at(u))) {
            *reason = "its result is read inside the group";
            return false;
          }
    }
    if ((forms_[gid] || is_reduction(n)) && has_cat(merged)) {
      *reason = "a concatenation is not fused with reductions";
      return false;
    }
    if (forms_[gid] || is_reduction(n)) {
      form = form_of(merged, reason);
      if (!form) return false;
      new_shape = form->shape;
    } else if (!ragged && out_shape != shape) {
      if (!broadcasts_to(out_shape, shape)) {
        *reason = fmt::format("output shape {} does not broadcast to the group's {}", shape_str(out_shape),
                              shape_str(shape));
        return false;
      }
      bool all_inside = !graph_outputs_.count(n->output());
      for (const Node* u : users_[n->output()->id()]) all_inside &= members.count(index_.at(u)) > 0;
      if (!all_inside) {
        *reason = fmt::format("output shape {} differs from the group's {} and is used outside the group",
                              shape_str(out_shape), shape_str(shape));
        return false;
      }
      recompute = true;
    }
    if (creates_cycle(gid, cand)) {
      *reason = "would create a cycle: a path between it and the group runs through another step";
      return false;
    }
    // Cost: the group and the candidate apart, against together.
    WorkEstimate apart = group_work(members_[gid], shape, forms_[gid]);
    apart += group_work(unit(cand), is_reduction(n) ? n->args()[0].value->tensor_type().sizes : out_shape,
                        is_reduction(n) ? form_of({cand}, nullptr) : std::nullopt);
    WorkEstimate together = group_work(merged, new_shape, form);
    double t_apart = cost_.estimate_us(apart), t_together = cost_.estimate_us(together);
    std::string row_note;
    if (form) {
      int64_t row_bytes = row_input_bytes(nodes_of(merged), row_walk(*form));
      bool fits = row_fits_on_chip(row_bytes, cost_.device());
      row_note = form->passes == 1 ? ", one pass per row"
                 : fits ? fmt::format(", persistent row: {} passes over a row of {} kept on chip", form->passes,
                                      format_bytes(row_bytes))
                        : fmt::format(", {} passes over rows of {}, larger than the {} on chip: each pass reads "
                                      "them again",
                                      form->passes, format_bytes(row_bytes),
                                      format_bytes(cost_.device().on_chip_row_bytes));
    }
    if (t_together >= t_apart) {
      *reason = fmt::format("not profitable: {:.1f} us fused vs {:.1f} us apart{}", t_together, t_apart, row_note);
      return false;
    }
    if (refused_now()) {
      *reason = fmt::format("{} (would fuse: est. {:.1f} -> {:.1f} us{})", kRefusedForMeasurement, t_apart, t_together,
                            row_note);
      return false;
    }
    members_[gid] = merged;
    for (int m : unit(cand)) group_of_[m] = gid;
    shapes_[gid] = new_shape;
    forms_[gid] = std::move(form);
    *reason = fmt::format("fused{}: saves {} of traffic and {} launch (est. {:.1f} -> {:.1f} us){}",
                          recompute ? " (broadcast, recomputed per element)" : "",
                          format_bytes(apart.bytes - together.bytes), apart.launches - together.launches, t_apart,
                          t_together, row_note);
    return true;
  }

  // Note [Cats of unequal items]: the cat of unequal items among `ms` that the others lie in, or nullptr;
  // nullptr with a reason when there are two apart.
  const Node* ragged_cat(const std::vector<int>& ms, std::string* reason) const {
    std::vector<const Node*> ragged;
    std::set<const Node*> members;
    for (int m : ms) {
      members.insert(nodes_[m]);
      if (companion_[m] < 0) continue;
      auto cf = cat_form(*nodes_[m], nullptr);
      if (cf && cf->ragged) ragged.push_back(nodes_[m]);
    }
    if (ragged.size() < 2) return ragged.empty() ? nullptr : ragged[0];
    const Node* root = ragged.back();  // the others lie in the last one's items, if anywhere
    auto pieces = cat_pieces(*root, members, nullptr);
    for (const Node* c : ragged)
      if (c != root && (!pieces || !pieces->owner.count(c))) {
        *reason = fmt::format("{} and {} are cats of unequal items apart: one per kernel", node_name(c),
                              node_name(root));
        return nullptr;
      }
    return root;
  }

  // Whether `ms`, holding the cat of unequal items `cat`, can be one kernel over the cat's result: the
  // nodes that compute an item are read only by that piece's nodes and its cat's list, over a shape that
  // broadcasts to the item's; the other nodes have the result's shape, or broadcast to it and are read
  // only inside, and none is another cat.
  bool ragged_fits(const std::vector<int>& ms, const Node& cat, std::string* reason) const {
    std::set<const Node*> members;
    for (int m : ms) members.insert(nodes_[m]);
    auto pieces = cat_pieces(cat, members, reason);
    if (!pieces) return false;
    const auto& shape = cat.output()->tensor_type().sizes;
    for (int m : ms) {
      const Node* n = nodes_[m];
      if (n->schema() == "prim::ListConstruct") continue;
      auto own = pieces->owner.find(n);
      const Value* out = n->output();
      bool inside = !graph_outputs_.count(out);
      for (const Node* u : users_[out->id()]) inside &= members.count(u) > 0;
      if (own != pieces->owner.end()) {
        const CatPiece& piece = pieces->pieces[own->second];
        const Node* list = cat_list(*piece.cat);
        const auto& item = cat_form(*piece.cat, nullptr)->items[piece.item]->tensor_type().sizes;
        for (const Node* u : users_[out->id()]) {
          auto uo = pieces->owner.find(u);
          inside &= u == list || (uo != pieces->owner.end() && uo->second == own->second);
        }
        if (!inside) {
          *reason = fmt::format("{} computes item {} of {} and is read by others", node_name(n), piece.item,
                                node_name(piece.cat));
          return false;
        }
        if (!broadcasts_to(out->tensor_type().sizes, item)) {
          *reason = fmt::format("{} has shape {}, item {} of {} {}", node_name(n), shape_str(out->tensor_type().sizes),
                                piece.item, node_name(piece.cat), shape_str(item));
          return false;
        }
        continue;
      }
      if (n != &cat && cat_list(*n)) {
        *reason = fmt::format("{} is not inside an item of {}: one cat per kernel of unequal items", node_name(n),
                              node_name(&cat));
        return false;
      }
      const auto& os = out->tensor_type().sizes;
      if (os != shape && (!broadcasts_to(os, shape) || !inside)) {
        *reason = fmt::format("{} has shape {}, not that of {}'s result {}", node_name(n), shape_str(os),
                              node_name(&cat), shape_str(shape));
        return false;
      }
    }
    return true;
  }

  // Values of `ms` read by other nodes or returned by the graph.
  std::set<const Value*> outside_of(const std::vector<int>& ms) const {
    std::set<int> members(ms.begin(), ms.end());
    std::set<const Value*> out;
    for (int m : ms)
      for (const Value* o : nodes_[m]->outputs()) {
        bool outside = graph_outputs_.count(o) > 0;
        for (const Node* u : users_[o->id()]) outside |= !members.count(index_.at(u));
        if (outside) out.insert(o);
      }
    return out;
  }

  std::optional<ReductionForm> form_of(const std::vector<int>& ms, std::string* why) const {
    return reduction_form(nodes_of(ms), outside_of(ms), why);
  }

  std::vector<const Node*> nodes_of(const std::vector<int>& ms) const {
    std::vector<const Node*> ns;
    for (int m : ms) ns.push_back(nodes_[m]);
    return ns;
  }

  static RowWalk row_walk(const ReductionForm& f) {
    return RowWalk{&f.shape, &f.dims, &f.row_values, f.passes, f.row_len.hint()};
  }

  // Work of a kernel over `shape` made of `ms` (cost/work.h counts it).
  WorkEstimate group_work(const std::vector<int>& ms, const SymSizes& shape,
                          const std::optional<ReductionForm>& form = std::nullopt) const {
    KernelSketch k{nodes_of(ms), shape.hints(), outside_of(ms), std::nullopt};
    if (form) k.rows = row_walk(*form);
    return kernel_work(k, cost_.device());
  }

  // Super node of a node: its group, or itself (as -1 - index).
  // While groups grow, an unassigned list and its cat are one super node (the cat's); the steps of the
  // plan run them apart.
  int super(int i) const {
    if (group_of_[i] >= 0) return group_of_[i];
    return units_ && owner_[i] >= 0 ? -1 - owner_[i] : -1 - i;
  }

  // Calls f(m) for each node m of super node s, without copying its members.
  template <typename F>
  void for_each_member(int s, F&& f) const {
    if (s >= 0) {
      for (int m : members_[s]) f(m);
    } else {
      if (units_ && companion_[-1 - s] >= 0) f(companion_[-1 - s]);
      f(-1 - s);
    }
  }

  // A node with the list it alone reads (cat, stack), in graph order.
  std::vector<int> unit(int i) const {
    if (companion_[i] >= 0) return {companion_[i], i};
    return {i};
  }

  bool has_cat(const std::vector<int>& ms) const {
    for (int m : ms)
      if (companion_[m] >= 0) return true;
    return false;
  }

  // The iteration space a node brings to a pointwise group: its output's shape, or a cat's items'.
  SymSizes iteration_shape(int i) const {
    if (companion_[i] >= 0)
      if (auto cf = cat_form(*nodes_[i], nullptr)) return cf->shape;
    return nodes_[i]->output()->tensor_type().sizes;
  }

  // Calls f(t) for each super node t that reads what super node s writes or follows its side effect
  // (with repeats).
  template <typename F>
  void for_each_succ(int s, F&& f) const {
    auto from_node = [&](int m) {
      if (next_effect_[m] >= 0 && super(next_effect_[m]) != s) f(super(next_effect_[m]));
      for (const Value* o : nodes_[m]->outputs())
        for (const Node* u : users_[o->id()]) {
          int t = super(index_.at(u));
          if (t != s) f(t);
        }
    };
    for_each_member(s, from_node);
  }

  std::vector<int> super_succ(int s) const {
    std::set<int> out;
    for_each_succ(s, [&](int t) { out.insert(t); });
    return {out.begin(), out.end()};
  }

  // A path from `from` to `to` of length >= 2 in the graph of super nodes. Super nodes are numbered
  // densely for the walk: groups first, then single nodes. Called for every candidate of every group, so
  // it allocates only its two vectors.
  bool indirect_path(int from, int to) const {
    const size_t groups = members_.size();
    std::vector<char> seen(groups + nodes_.size(), 0);
    std::vector<int> stack;
    for_each_succ(from, [&](int t) {
      if (t != to) stack.push_back(t);
    });
    while (!stack.empty()) {
      int s = stack.back();
      stack.pop_back();
      if (s == to) return true;
      char& c = seen[s >= 0 ? static_cast<size_t>(s) : groups + static_cast<size_t>(-1 - s)];
      if (c) continue;
      c = 1;
      for_each_succ(s, [&](int t) { stack.push_back(t); });
    }
    return false;
  }

  bool creates_cycle(int gid, int cand) const {
    int c = super(cand);
    return indirect_path(gid, c) || indirect_path(c, gid);
  }

  FusionPlan finish(const std::vector<std::string>& why_not) {
    FusionPlan plan;
    units_ = false;  // lists of cats left to ATen are steps of their own
    // Groups, numbered in order of their first node.
    std::vector<int> order(members_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return members_[a][0] < members_[b][0]; });
    std::vector<int> renum(members_.size());
    for (size_t k = 0; k < order.size(); ++k) renum[order[k]] = static_cast<int>(k);
    for (int old : order) {
      FusionGroup grp;
      grp.id = renum[old];
      grp.shape = shapes_[old];
      std::set<int> members(members_[old].begin(), members_[old].end());
      std::set<const Value*> seen_in;
      WorkEstimate unfused;
      for (int m : members_[old]) {
        Node* n = nodes_[m];
        grp.nodes.push_back(n);
        unfused += node_work(*n);
        for (Value* v : n->value_inputs()) {
          if (!v->is_tensor()) continue;
          if (v->producer() && members.count(index_.at(v->producer()))) continue;
          if (seen_in.insert(v).second) grp.inputs.push_back(v);
        }
        Value* o = n->output();
        bool outside = graph_outputs_.count(o) > 0;
        for (const Node* u : users_[o->id()]) outside |= !members.count(index_.at(u));
        if (outside) grp.outputs.push_back(o);
      }
      if (forms_[old]) {
        grp.reduction = form_of(members_[old], nullptr);
        FJ_INTERNAL_ASSERT(grp.reduction.has_value(), "group {} lost its reduction form", grp.id);
      }
      grp.estimated_us = cost_.estimate_us(group_work(members_[old], grp.shape, grp.reduction));
      grp.unfused_us = cost_.estimate_us(unfused);
      for (auto& d : decisions_[old]) grp.decisions.push_back(d);
      plan.groups.push_back(std::move(grp));
    }
    // Renumber the working state too, so that super nodes are the plan's group ids.
    std::vector<std::vector<int>> renumbered(members_.size());
    for (size_t old = 0; old < members_.size(); ++old) renumbered[renum[old]] = members_[old];
    members_ = std::move(renumbered);
    for (auto& grp : plan.groups)
      for (const Node* n : grp.nodes) group_of_[index_.at(n)] = grp.id;
    // Steps: a topological order of super nodes (Kahn's algorithm, ties by first node).
    std::map<int, int> indegree;
    std::map<int, int> first_node;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      int s = super(static_cast<int>(i));
      if (!first_node.count(s)) first_node[s] = static_cast<int>(i);
      indegree.emplace(s, 0);
    }
    for (auto& [s, _] : indegree)
      for (int t : super_succ(s)) indegree[t]++;
    auto cmp = [&](int a, int b) { return first_node[a] > first_node[b]; };
    std::vector<int> ready;
    for (auto& [s, d] : indegree)
      if (d == 0) ready.push_back(s);
    while (!ready.empty()) {
      std::sort(ready.begin(), ready.end(), cmp);
      int s = ready.back();
      ready.pop_back();
      PlanStep step;
      if (s >= 0) {
        step.group = s;
      } else {
        step.node = nodes_[-1 - s];
        step.reason = why_not[-1 - s];
      }
      plan.steps.push_back(step);
      for (int t : super_succ(s))
        if (--indegree[t] == 0) ready.push_back(t);
    }
    FJ_INTERNAL_ASSERT(plan.steps.size() == indegree.size(), "fusion produced a cycle");
    return plan;
  }

  const Graph& g_;
  const CostModel& cost_;
  bool enable_;
  bool horizontal_;
  bool cat_;
  bool gather_;
  // The fusion the cost model accepts as its `refuse_`-th (0-based, in the order they are made) is made
  // the other way (Note [Decisions measured both ways]); -1: none.
  int refuse_;
  int accepted_ = 0;
  bool refused_now() { return accepted_++ == refuse_; }
  std::vector<Node*> nodes_;
  std::unordered_map<const Node*, int> index_;
  std::vector<std::vector<Node*>> users_;
  std::vector<int> next_effect_;  // by node index: the next node with side effects, or -1
  std::set<const Value*> graph_outputs_;
  std::vector<int> group_of_;
  std::vector<int> companion_;  // by node index: a fusible cat's list, or -1
  std::vector<int> owner_;      // by node index: the cat a list belongs to, or -1
  bool units_ = true;
  std::vector<std::vector<int>> members_;
  std::vector<SymSizes> shapes_;
  std::vector<std::optional<ReductionForm>> forms_;
  std::vector<std::vector<Decision>> decisions_;
};

}  // namespace

bool can_fuse_node(const Node& n, std::string* why) {
  auto no = [&](std::string r) {
    if (why) *why = std::move(r);
    return false;
  };
  if (n.is_constant()) return no("a frozen constant");
  if (cat_list(n)) {
    std::string r;
    if (!cat_form(n, &r)) return no(r);
    return true;
  }
  const OpInfo* op = n.op();
  if (!op) return no("not in the op table: runs through ATen");
  const bool reduction = op->category == OpCategory::kReduction;
  const bool gather = op->category == OpCategory::kGather;
  if (op->category != OpCategory::kElementwise && !reduction && !gather)
    return no(fmt::format("{} op: runs through ATen", category_name(op->category)));
  if (n.side_effects()) return no("has side effects");
  if (n.outputs().size() != 1 || !n.output()->is_tensor()) return no("does not return one tensor");
  const TensorType& out = n.output()->tensor_type();
  if (out.dtype == DType::kOther) return no("unsupported dtype");
  for (size_t i = 0; i < n.args().size() && i < op->args.size(); ++i) {
    const Arg& a = n.args()[i];
    const ArgSpec& spec = op->args[i];
    if (spec.is_tensor()) {
      if (!a.is_value()) {
        if (spec.kind == ArgKind::kChannel && std::holds_alternative<None>(a.literal)) continue;
        return no(fmt::format("argument {} is not a tensor", i));
      }
      if (!a.value->is_tensor()) return no(fmt::format("argument {} is a {}, not a tensor", i, a.value->type().str()));
      const TensorType& t = a.value->tensor_type();
      if (t.dtype == DType::kOther) return no(fmt::format("argument {} has an unsupported dtype", i));
      if (t.device != out.device) return no(fmt::format("argument {} is on another device", i));
      if (spec.kind != ArgKind::kChannel && !reduction && !gather && !broadcasts_to(t.sizes, out.sizes))
        return no(fmt::format("argument {} of shape {} does not broadcast to {}", i, shape_str(t.sizes),
                              shape_str(out.sizes)));
    } else if (a.is_value()) {
      return no(fmt::format("argument {} is computed at run time ({}), not a constant", i, a.value->name()));
    }
  }
  if (gather) {
    // Note [Gathered loads]: elements of the table picked by int64 or int32 indices along one of its dims,
    // as eager's embedding (rows of a 2-d table) and gather (any dim; the other dims of the indices
    // within the table's) take them; eager's other indices raise there, and so they do through ATen.
    auto gf = gather_form(n);
    if (!gf) return no("the gathered dim is not a constant");
    const TensorType& table = gf->table->tensor_type();
    const TensorType& index = gf->index->tensor_type();
    if (index.dtype != DType::kInt64 && index.dtype != DType::kInt32)
      return no(fmt::format("{} indices: eager raises", dtype_name(index.dtype)));
    if (gf->embedding) {
      if (table.dim() != 2) return no(fmt::format("a table of {} dims: 2 expected", table.dim()));
      SymSizes want = index.sizes;
      want.push_back(table.sizes[1]);
      if (out.sizes != want || out.dtype != table.dtype)
        return no(fmt::format("result {} is not the table's rows for indices {}", out.str(), index.str()));
    } else {
      if (table.dim() == 0 || index.dim() != table.dim() || gf->dim < 0 || gf->dim >= table.dim())
        return no(fmt::format("gather along dim {} of {} by {}: runs through ATen", gf->dim, table.str(), index.str()));
      for (int64_t d = 0; d < table.dim(); ++d)
        if (d != gf->dim && index.sizes[d] > table.sizes[d])
          return no(fmt::format("indices {} larger than the table {} along dim {}: eager raises", index.str(),
                                table.str(), d));
      if (out.sizes != index.sizes || out.dtype != table.dtype)
        return no(fmt::format("result {} is not the table's elements at indices {}", out.str(), index.str()));
    }
  }
  if (reduction) {
    auto info = reduction_info(n);
    if (!info) return no("reduced dims not known at compile time");
    const TensorType& in = n.args()[0].value->tensor_type();
    if (in.dim() == 0) return no("reduction of a 0-d tensor");
    const std::string& k = info->kind;
    if ((k == "mean" || k == "var") && (!is_floating(in.dtype) || !is_floating(out.dtype)))
      return no(fmt::format("{} of {}: runs through ATen", k, dtype_name(in.dtype)));
    if ((k == "max" || k == "min") && (in.dtype == DType::kBool || in.dtype != out.dtype))
      return no(fmt::format("{} of {}: runs through ATen", k, dtype_name(in.dtype)));
    if (is_floating(in.dtype) && !is_floating(out.dtype))
      return no("a floating reduction into an integer dtype runs through ATen");
    SymInt len = 1;
    for (int64_t d : info->dims) len *= in.sizes[d];
    if (len == 0 && (k == "max" || k == "min")) return no(fmt::format("{} over an empty dim: eager raises", k));
  }
  if (op->kernel_fn == "batch_norm") {
    Literal training = literal_arg(n, 5);
    if (!std::holds_alternative<bool>(training) || std::get<bool>(training))
      return no("batch_norm in training mode");
    for (int i : {3, 4})
      if (i >= static_cast<int>(n.args().size()) || !n.args()[i].is_value())
        return no("batch_norm without running statistics");
    if (out.dim() < 2) return no("batch_norm of a tensor with fewer than 2 dims");
    for (int i : {1, 2, 3, 4})
      if (i < static_cast<int>(n.args().size()) && n.args()[i].is_value() &&
          n.args()[i].value->tensor_type().sizes != SymSizes{out.sizes[1]})
        return no("batch_norm statistics of an unexpected shape");
  }
  if (op->has(OpFlag::kIntegerDivision) && is_integral(out.dtype, true)) {
    // Integer division by zero raises in eager and the minimum value divided by -1 overflows (a trap on
    // x86); a kernel could only return garbage or crash. A literal divisor is known here: any other
    // cannot raise, so it fuses. The literal is taken as eager takes it, converted to the result's dtype
    // (300 is 44 for int8, 256 is 0 for uint8).
    const Arg& divisor = n.args().size() > 1 ? n.args()[1] : n.args()[0];
    if (divisor.is_value() || out.dtype == DType::kBool)
      return no(fmt::format("integer {} by a tensor runs through ATen: eager raises on a zero divisor",
                            op->kernel_fn));
    if (!std::holds_alternative<SymInt>(divisor.literal))
      return no(fmt::format("integer {} by a non-integer literal runs through ATen", op->kernel_fn));
    int64_t d = wrap_integer(std::get<SymInt>(divisor.literal), out.dtype);
    if (d == 0) return no(fmt::format("integer {} by zero: eager raises", op->kernel_fn));
    if (d == -1 && is_signed_integer(out.dtype))
      return no(fmt::format("integer {} by -1 runs through ATen (the minimum value overflows)", op->kernel_fn));
  }
  if (op->has(OpFlag::kIntegerRaises) && is_integral(out.dtype, true)) {
    // Eager checks integer operands (pow: negative exponents) and raises; keep ATen's checks.
    return no(fmt::format("integer {} runs through ATen", op->kernel_fn));
  }
  return true;
}

int FusionGroup::num_ops() const {
  int n = 0;
  for (const Node* node : nodes) n += node->schema() != "prim::ListConstruct";
  return n;
}

const Node* cat_list(const Node& n) {
  if ((n.schema() != "aten::cat" && n.schema() != "aten::stack") || n.args().empty() || !n.args()[0].is_value())
    return nullptr;
  const Node* p = n.args()[0].value->producer();
  return p && p->schema() == "prim::ListConstruct" ? p : nullptr;
}

std::optional<GatherForm> gather_form(const Node& n) {
  if (!is_gather(&n)) return std::nullopt;
  GatherForm f;
  f.table = n.args().at(0).value;
  if (n.schema() == "aten::embedding") {
    f.index = n.args().at(1).value;
    return f;
  }
  const Arg& d = n.args().at(1);
  if (d.is_value() || !std::holds_alternative<SymInt>(d.literal)) return std::nullopt;
  f.index = n.args().at(2).value;
  f.embedding = false;
  f.dim = std::get<SymInt>(d.literal);
  const int64_t rank = f.table->tensor_type().dim();
  if (f.dim < 0) f.dim += rank;
  return f;
}

std::optional<CatForm> cat_form(const Node& n, std::string* why) {
  auto no = [&](std::string r) -> std::optional<CatForm> {
    if (why) *why = std::move(r);
    return std::nullopt;
  };
  const Node* list = cat_list(n);
  if (!list) return no(fmt::format("{} of a list not built in the graph: runs through ATen", n.schema()));
  if (n.outputs().size() != 1 || !n.output()->is_tensor()) return no("does not return one tensor");
  const TensorType& out = n.output()->tensor_type();
  if (out.dtype == DType::kOther) return no("unsupported dtype");
  CatForm f;
  f.stack = n.schema() == "aten::stack";
  const int64_t rank = out.dim();
  if (n.args().size() > 1) {
    const Arg& d = n.args()[1];
    if (d.is_value() || !std::holds_alternative<SymInt>(d.literal)) return no("dim is not a constant");
    f.dim = std::get<SymInt>(d.literal);
  }
  if (rank == 0 || f.dim < -rank || f.dim >= rank) return no(fmt::format("dim {} of a {}-d result", f.dim, rank));
  if (f.dim < 0) f.dim += rank;
  for (size_t i = 0; i < list->args().size(); ++i) {
    const Arg& a = list->args()[i];
    if (!a.is_value() || !a.value->is_tensor()) return no(fmt::format("item {} is not a tensor", i));
    const TensorType& t = a.value->tensor_type();
    if (t.dtype != out.dtype)
      return no(fmt::format("item {} is {}, the result {}: runs through ATen", i, dtype_name(t.dtype),
                            dtype_name(out.dtype)));
    if (t.device != out.device || t.device_index != out.device_index) return no(fmt::format("item {} is on another device", i));
    if (t.sym_numel() == 0 && !f.stack) continue;  // cat skips it
    if (f.items.empty()) {
      f.shape = t.sizes;
    } else if (t.sizes != f.shape) {
      // Note [Cats of unequal items]: sizes may differ along the cat's dim only.
      bool along = !f.stack && t.dim() == rank && static_cast<int64_t>(f.shape.size()) == rank;
      for (int64_t d = 0; along && d < rank; ++d) along = d == f.dim || t.sizes[d] == f.shape[d];
      if (!along)
        return no(fmt::format("item {} has shape {}, item 0 {}: items differ along dim {} only", i,
                              shape_str(t.sizes), shape_str(f.shape), f.dim));
      f.ragged = true;
    }
    f.items.push_back(a.value);
  }
  if (f.items.empty() || out.sym_numel() == 0) return no("an empty result");
  if (f.items.size() > 64) return no(fmt::format("{} items: 64 at most", f.items.size()));
  if (f.ragged) {
    SymInt at = 0;
    for (const Value* v : f.items) at += v->tensor_type().sizes[f.dim];
    if (at != out.sizes[f.dim])
      return no(fmt::format("result shape {} is not its items' joined along dim {}", shape_str(out.sizes), f.dim));
    f.shape = out.sizes;
    return f;
  }
  SymSizes want = f.shape;
  const int64_t k = static_cast<int64_t>(f.items.size());
  if (f.stack) want.insert(want.begin() + std::min<int64_t>(f.dim, static_cast<int64_t>(want.size())), k);
  else if (static_cast<int64_t>(want.size()) == rank) want[f.dim] *= k;
  if (want != out.sizes)
    return no(fmt::format("result shape {} is not its items' {} joined along dim {}", shape_str(out.sizes),
                          shape_str(f.shape), f.dim));
  f.strides = out.strides;
  if (f.stack) f.strides.erase(f.strides.begin() + f.dim);
  f.step = f.stack ? out.strides[f.dim] : f.shape[f.dim] * out.strides[f.dim];
  return f;
}

namespace {

// Adds the pieces of `cat` (lying in piece `parent`) and their owners to `out`; false (and why) when a node
// would compute two items or a stack computes one.
bool add_pieces(const Node& cat, int parent, const std::set<const Node*>& members, CatPieces* out, std::string* why) {
  auto f = cat_form(cat, why);
  if (!f) return false;
  if (f->stack || f->items.size() < 2) {
    if (why) *why = fmt::format("{} inside an item of a cat of unequal items", node_name(&cat));
    return false;
  }
  const int first = static_cast<int>(out->pieces.size());
  for (int k = 0; k < static_cast<int>(f->items.size()); ++k) out->pieces.push_back({&cat, k, parent});
  for (int k = 0; k < static_cast<int>(f->items.size()); ++k) {
    const int piece = first + k;
    std::vector<const Value*> work{f->items[k]};
    while (!work.empty()) {
      const Node* p = work.back()->producer();
      work.pop_back();
      if (!p || !members.count(p)) continue;
      auto [it, fresh] = out->owner.emplace(p, piece);
      if (!fresh) {
        if (it->second == piece) continue;
        if (why) *why = fmt::format("{} computes two items of cats of unequal items", node_name(p));
        return false;
      }
      if (const Node* list = cat_list(*p)) {
        if (!members.count(list)) continue;
        out->owner[list] = piece;
        auto inner = cat_form(*p, nullptr);
        if (inner && inner->copies()) {  // a copy of its one item
          work.push_back(inner->items[0]);
          continue;
        }
        if (!add_pieces(*p, piece, members, out, why)) return false;
        continue;
      }
      for (const Value* v : p->value_inputs())
        if (v->is_tensor()) work.push_back(v);
    }
  }
  return true;
}

}  // namespace

std::optional<CatPieces> cat_pieces(const Node& cat, const std::set<const Node*>& members, std::string* why) {
  CatPieces out;
  if (!add_pieces(cat, -1, members, &out, why)) return std::nullopt;
  return out;
}

FusionPlan plan_fusion(const Graph& g, const CostModel& cost, bool enable_fusion, bool horizontal, bool cat,
                       bool gather, int refuse_decision) {
  return GreedyFuser(g, cost, enable_fusion, horizontal, cat, gather, refuse_decision).run();
}

std::string explain_plan(const FusionPlan& p) {
  std::string s;
  int constants = 0;
  for (const auto& step : p.steps) {
    if (step.node && step.node->is_constant()) {
      ++constants;
      continue;
    }
    if (step.group >= 0) {
      const FusionGroup& grp = p.groups[step.group];
      s += fmt::format("group {}: {} op{} over {}, est. {:.1f} us fused vs {:.1f} us unfused\n", grp.id,
                       grp.num_ops(), grp.num_ops() == 1 ? "" : "s", shape_str(grp.shape), grp.estimated_us,
                       grp.unfused_us);
      for (const Node* n : grp.nodes) s += "    " + node_name(n) + "\n";
      std::string ins, outs;
      for (const Value* v : grp.inputs) ins += " " + v->name();
      for (const Value* v : grp.outputs) outs += " " + v->name();
      s += "  reads:" + ins + "\n  writes:" + outs + "\n";
      if (grp.num_ops() == 1 && grp.decisions.empty()) s += "  single op: no neighbour could join\n";
      for (const auto& d : grp.decisions) s += std::string("  ") + (d.fused ? "+ " : "- ") + d.text + "\n";
    } else {
      s += fmt::format("aten: {}: {}\n", node_name(step.node), step.reason);
    }
  }
  if (constants) s += fmt::format("{} frozen constant{}\n", constants, constants == 1 ? "" : "s");
  return s;
}

}  // namespace fusion_jit
