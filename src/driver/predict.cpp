#include "driver/predict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "cost/work.h"
#include "driver/step_times.h"
#include "ir/op_table.h"

namespace fusion_jit {
namespace {

// Adds `times` applications of each op class `e` calls (Note [Kernel times]).
void count_calls(const ExprRef& e, double times, std::map<std::string, double>* counts) {
  if (!e) return;
  if (e->kind == ExprKind::kCall)
    for (const std::string& c : op_classes_of_call(e->name)) (*counts)[c] += times;
  if (e->kind == ExprKind::kDiv && is_floating(e->type)) (*counts)["reciprocal"] += times;
  for (const ExprRef& a : e->args) count_calls(a, times, counts);
}

void count_stmts(const std::vector<Stmt>& body, double times, std::map<std::string, double>* counts) {
  for (const Stmt& s : body) count_calls(s.value, times, counts);
}

// Elements of the iteration space a buffer's strides reach (the dims it does not broadcast along).
int64_t reached_elements(const KernelSpec& k, const KernelBuffer& b) {
  int64_t n = 1;
  for (size_t d = 0; d < k.sizes.size() && d < b.strides.size(); ++d)
    if (b.strides[d].hint() != 0) n *= k.sizes[d].hint();
  return n;
}

// Whether a tensor of `sizes` and `strides` can be viewed as `shape` without a copy (the rule of
// reshape: each run of dims that are contiguous with each other maps onto whole dims of `shape`).
bool viewable(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  if (numel <= 1 || sizes.empty()) return true;
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t base_stride = strides.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) view_numel *= shape[view_d--];
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        base_stride = strides[d - 1];
        tensor_numel = view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

// The schemas priced by their flops, and how many: 2 * output elements * the reduced extent.
double compute_flops(const Node& n) {
  const std::string& s = n.schema();
  std::vector<const Value*> ins;
  for (const Value* v : n.value_inputs())
    if (v->is_tensor()) ins.push_back(v);
  if (ins.empty() || n.outputs().empty() || !n.output()->is_tensor()) return -1;
  const double out = static_cast<double>(n.output()->tensor_type().sym_numel().hint());
  auto last_dim = [](const Value* v) {
    const auto& sz = v->tensor_type().sizes;
    return sz.empty() ? int64_t{1} : sz.back().hint();
  };
  auto starts = [&](const char* p) { return s.rfind(p, 0) == 0; };
  if (starts("aten::matmul") || starts("aten::mm") || starts("aten::bmm") || starts("aten::linear") ||
      starts("aten::addmm") || starts("aten::baddbmm") || starts("aten::_addmm_activation") ||
      starts("mkl::") || starts("fj::linear")) {
    // The first matrix's last dim is the one reduced (baddbmm/addmm: after the added input).
    const Value* a = (starts("aten::addmm") || starts("aten::baddbmm") || starts("aten::_addmm_activation")) &&
                             ins.size() > 1
                         ? ins[1]
                         : ins[0];
    return 2.0 * out * static_cast<double>(last_dim(a));
  }
  if (s.find("conv") != std::string::npos && ins.size() > 1) {
    // The weight [Cout, Cin/groups, k...]: each output element reduces over all but its first dim.
    const auto& w = ins[1]->tensor_type().sizes;
    if (w.size() < 3) return -1;
    int64_t per_out = 1;
    for (size_t d = 1; d < w.size(); ++d) per_out *= w[d].hint();
    return 2.0 * out * static_cast<double>(per_out);
  }
  if (s.find("scaled_dot_product") != std::string::npos && ins.size() >= 3) {
    // softmax(q k^T) v: q [.., L, E] against k [.., S, E]: two products of L x S x E per batch.
    const auto& k = ins[1]->tensor_type().sizes;
    const double keys = k.size() >= 2 ? static_cast<double>(k[k.size() - 2].hint()) : 1.0;
    return 4.0 * out * keys;
  }
  return -1;
}

}  // namespace

KernelCalls kernel_calls(const KernelSpec& k) {
  KernelCalls c;
  count_stmts(k.body, 1, &c.per_element);
  for (const KernelPiece& p : k.pieces) {
    // A piece's body runs over its slice of the dim it splits (at the hints).
    const int64_t extent = p.dim < static_cast<int>(k.sizes.size()) ? k.sizes[p.dim].hint() : 0;
    const double share = extent > 0 ? static_cast<double>(std::max<int64_t>(0, p.end.hint() - p.start.hint())) / extent : 0;
    count_stmts(p.body, share, &c.per_element);
    count_calls(p.value, share, &c.per_element);
  }
  count_stmts(k.row_prologue, 1, &c.per_row);
  for (const KernelPass& pass : k.passes) {
    count_stmts(pass.body, 1, &c.per_element);
    for (const KernelAccumulator& a : pass.accs) count_calls(a.input, 1, &c.per_element);
    count_stmts(pass.after, 1, &c.per_row);
    c.pass_loads.push_back(pass.loads);
  }
  return c;
}

KernelFacts kernel_facts(const KernelSpec& k, const KernelCalls& calls) {
  KernelFacts f;
  const bool reduction = k.is_reduction();
  const int64_t numel = k.numel.hint();
  const int64_t rows = reduction ? k.rows.hint() : 0, row_len = reduction ? std::max<int64_t>(1, k.row_len.hint()) : 1;
  f.range = reduction ? rows : numel;
  f.elements_per_unit = row_len;
  for (const KernelBuffer& b : k.buffers) {
    const int64_t elements = b.gather >= 0 ? numel : reached_elements(k, b);
    f.bytes += elements * static_cast<int64_t>(dtype_size(b.dtype));
  }
  for (const auto& [op, n] : calls.per_element) f.op_counts[op] += std::llround(n * static_cast<double>(numel));
  for (const auto& [op, n] : calls.per_row) f.op_counts[op] += std::llround(n * static_cast<double>(rows));
  std::set<int> loaded;
  for (const std::vector<int>& loads : calls.pass_loads)
    for (int b : loads) {
      if (b < 0 || b >= static_cast<int>(k.buffers.size())) continue;
      const int64_t per_row = row_len * static_cast<int64_t>(dtype_size(k.buffers[b].dtype));
      if (loaded.insert(b).second) f.row_bytes += per_row;
      else f.reread_bytes += per_row * rows;  // read again by a later pass
    }
  return f;
}

StepFacts aten_step_facts(const Node& n) {
  StepFacts s;
  const OpInfo* op = n.op();
  bool any_tensor_out = false;
  for (const Value* o : n.outputs()) any_tensor_out |= o->is_tensor();
  if (!any_tensor_out || n.schema().rfind("prim::", 0) == 0) {
    s.view = true;
    return s;
  }
  if (op && (op->category == OpCategory::kView || op->has(OpFlag::kReturnsAlias))) {
    // contiguous and to.dtype copy where their result's type differs from their input's; reshape and
    // flatten where their input's strides cannot be viewed as the result's sizes.
    const std::vector<Value*> ins = n.value_inputs();
    const std::string& sc = n.schema();
    bool copies = false;
    if (!ins.empty() && ins[0]->is_tensor() && n.output()->is_tensor()) {
      const TensorType& in = ins[0]->tensor_type();
      if (sc == "aten::contiguous" || sc == "aten::to.dtype") copies = in != n.output()->tensor_type();
      if (sc == "aten::reshape" || sc == "aten::flatten.using_ints")
        copies = !viewable(in.sizes.hints(), in.strides.hints(), n.output()->tensor_type().sizes.hints());
    }
    if (!copies) {
      s.view = true;
      return s;
    }
  }
  const double flops = compute_flops(n);
  if (flops >= 0) {
    s.compute = true;
    s.conv = n.schema().find("conv") != std::string::npos;
    s.flops = flops;
  }
  s.bytes = node_work(n).bytes;
  return s;
}

std::string step_name(const ExecutablePlan& p, size_t step) {
  const ExecStep& st = p.steps.at(step);
  if (st.kernel >= 0) return p.kernels.at(static_cast<size_t>(st.kernel)).spec.name;
  if (!st.node->outputs().empty()) return fmt::format("%{}", st.node->output()->id());
  return fmt::format("step {}", step);
}

std::vector<StepPrediction> predict_plan(const ExecutablePlan& p, const TimeFigures& f) {
  std::vector<StepPrediction> out;
  const std::map<std::string, double> measured = stored_step_times();
  for (size_t si = 0; si < p.steps.size(); ++si) {
    const ExecStep& st = p.steps[si];
    if (st.kernel < 0 && st.node->is_constant()) continue;
    StepPrediction sp;
    sp.step = si;
    sp.name = step_name(p, si);
    if (st.kernel >= 0) {
      const KernelLaunch& kl = p.kernels.at(static_cast<size_t>(st.kernel));
      const KernelSpec& k = kl.spec;
      sp.kind = "kernel";
      const int ops = static_cast<size_t>(st.kernel) < p.group_ops.size() ? p.group_ops[st.kernel] : 0;
      sp.op = fmt::format("group {}: {} op{}", k.group, ops, ops == 1 ? "" : "s");
      sp.time = predict_kernel(kernel_facts(k, kl.calls), f);
    } else {
      sp.kind = "aten";
      sp.op = st.node->schema();
      auto known = measured.empty() ? measured.end() : measured.find(aten_step_signature(*st.node));
      if (known != measured.end()) {
        sp.measured = true;
        sp.time.us = sp.time.dispatch_us = known->second;
      } else {
        sp.time = predict_aten_step(aten_step_facts(*st.node), f);
      }
    }
    out.push_back(std::move(sp));
  }
  return out;
}

}  // namespace fusion_jit
