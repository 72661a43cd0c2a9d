// Work estimation: what a kernel, or an op run alone, moves and computes (bytes, flops, passes over
// rows), the input of the cost model (cost_model.h). Fusion asks these questions; it does not count.
//
// The counts are first-order: a kernel reads each tensor it takes from outside once and writes each
// value used after it once; an op costs 20 flops per element when the op table says it is expensive
// (OpFlag::kExpensive), else 1; a value computed once per row of a reduction costs once per row. A
// reduction kernel walking its rows in several passes reads its row inputs again in every pass after the
// first when a row does not fit on chip (DeviceDescription::on_chip_row_bytes).
// Symbolic sizes are counted at their hints, with no guard (Note [Symbolic sizes]): an estimate decides
// what runs together, never what a kernel computes, so a plan of a shape class stays valid at every size
// of the class, priced at the example it was built from.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "cost/cost_model.h"
#include "ir/graph.h"

namespace fusion_jit {

// How a kernel with reductions walks its rows (fusion's ReductionForm, as far as cost needs it): `shape`
// is the reduced shape, split into rows over `dims` of `row_len` elements (at the hints), walked `passes`
// times; `row_values` are computed once per row.
struct RowWalk {
  const SymSizes* shape = nullptr;
  const std::vector<int64_t>* dims = nullptr;
  const std::set<const Value*>* row_values = nullptr;
  int passes = 1;
  int64_t row_len = 0;
};

// A candidate kernel: the nodes it runs (each returns one tensor), its iteration space (at the hints), the
// values it writes (read after it or returned by the graph) and, for reductions, its rows.
struct KernelSketch {
  std::vector<const Node*> nodes;
  std::vector<int64_t> shape;
  std::set<const Value*> writes;
  std::optional<RowWalk> rows;
};

// Flops of one application of the node's op: 20 for expensive ops (OpFlag::kExpensive), else 1.
int64_t op_flops(const Node& n);
// Bytes of a tensor value: elements (at the hints) times the dtype's size.
int64_t tensor_bytes(const Value* v);
// One node run alone (through ATen or as its own kernel): its tensor inputs read once, its tensor
// outputs written, flops per output element, one launch.
WorkEstimate node_work(const Node& n);
// Bytes per row of the inputs of a reduction kernel that vary along the reduced dims (tensors read from
// outside `nodes`, right-aligned against the reduced shape): what a pass over a row reads.
int64_t row_input_bytes(const std::vector<const Node*>& nodes, const RowWalk& rows);
// Whether a row of `row_bytes` stays on chip between passes on `device`.
bool row_fits_on_chip(int64_t row_bytes, const DeviceDescription& device);
// One kernel: its reads from outside and its writes, its flops (row values once per row), one launch,
// and the re-reads of rows that do not fit on chip.
WorkEstimate kernel_work(const KernelSketch& k, const DeviceDescription& device);

}  // namespace fusion_jit
