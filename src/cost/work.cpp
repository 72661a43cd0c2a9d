#include "cost/work.h"

#include "ir/op_table.h"

namespace fusion_jit {
namespace {

bool is_reduction(const Node* n) { return n->op() && n->op()->category == OpCategory::kReduction; }

}  // namespace

int64_t op_flops(const Node& n) { return n.op() && n.op()->has(OpFlag::kExpensive) ? 20 : 1; }

int64_t tensor_bytes(const Value* v) {
  const TensorType& t = v->tensor_type();
  return t.sym_numel().hint() * static_cast<int64_t>(dtype_size(t.dtype));
}

WorkEstimate node_work(const Node& n) {
  WorkEstimate w;
  w.launches = 1;
  std::set<const Value*> reads;
  for (const Value* v : n.value_inputs())
    if (v->is_tensor()) reads.insert(v);
  for (const Value* v : reads) w.bytes += tensor_bytes(v);
  for (const Value* o : n.outputs())
    if (o->is_tensor()) {
      w.bytes += tensor_bytes(o);
      w.flops += op_flops(n) * o->tensor_type().sym_numel().hint();
    }
  return w;
}

int64_t row_input_bytes(const std::vector<const Node*>& nodes, const RowWalk& rows) {
  const std::set<const Node*> members(nodes.begin(), nodes.end());
  const size_t rank = rows.shape->size();
  std::set<const Value*> seen;
  int64_t per_element = 0;
  for (const Node* n : nodes)
    for (const Value* v : n->value_inputs()) {
      if (!v->is_tensor() || (v->producer() && members.count(v->producer()))) continue;
      if (!seen.insert(v).second) continue;
      // Inputs that vary along the reduced dims (right-aligned against the reduced shape).
      const auto& vs = v->tensor_type().sizes;
      bool varies = false;
      for (int64_t d : *rows.dims) {
        int64_t k = d - static_cast<int64_t>(rank - vs.size());
        varies |= k >= 0 && vs[k].hint() != 1;
      }
      if (varies) per_element += static_cast<int64_t>(dtype_size(v->tensor_type().dtype));
    }
  return per_element * rows.row_len;
}

bool row_fits_on_chip(int64_t row_bytes, const DeviceDescription& device) {
  return row_bytes <= device.on_chip_row_bytes;
}

WorkEstimate kernel_work(const KernelSketch& k, const DeviceDescription& device) {
  const std::set<const Node*> members(k.nodes.begin(), k.nodes.end());
  std::set<const Value*> reads;
  int64_t numel = 1;
  for (auto s : k.shape) numel *= s;
  WorkEstimate w;
  w.launches = 1;
  const RowWalk* rows = k.rows ? &*k.rows : nullptr;
  const int64_t row_count = rows && rows->row_len ? numel / rows->row_len : 0;
  for (const Node* n : k.nodes) {
    const bool once_per_row = rows && rows->row_values->count(n->output()) && !is_reduction(n);
    w.flops += op_flops(*n) * (once_per_row ? row_count : numel);
    for (const Value* v : n->value_inputs()) {
      if (!v->is_tensor()) continue;
      if (v->producer() && members.count(v->producer())) continue;
      reads.insert(v);
    }
  }
  for (const Value* v : reads) w.bytes += tensor_bytes(v);
  for (const Value* v : k.writes) w.bytes += tensor_bytes(v);
  if (rows && rows->passes > 1) {
    // Rows that do not fit on chip are read from memory again in every pass.
    int64_t row_bytes = row_input_bytes(k.nodes, *rows);
    if (!row_fits_on_chip(row_bytes, device)) w.bytes += (rows->passes - 1) * row_bytes * row_count;
  }
  return w;
}

}  // namespace fusion_jit
