// The gather corpus (Note [Gathered loads]): embedding and gather read inside the kernels of their consumers, in the
// kernel forms a gather can take (pointwise, a row reduction over the table's row, a reduction over the
// indices, a column reduction, a gathered row value), table dtypes, int64 and int32 indices, and tables and indices
// that are not contiguous. Shared by the CPU tests against eager, the NVRTC corpus and the GPU tests.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace fusion_jit::testing {

struct GatherCase {
  const char* name;
  const char* args;  // w: the table [V, D]; idx: the indices; x: a float tensor
  const char* body;
  size_t kernels;    // generated kernels of the plan (the embedding inside one)
};

inline const GatherCase kGatherCases[] = {
    {"pointwise", "w, idx, x", "    return torch.embedding(w, idx) * 2", 1},
    {"add_positions", "w, idx, x", "    return torch.embedding(w, idx) + torch.embedding(w, idx.flip([0]))", 1},
    {"table_transposed", "w, idx, x", "    return torch.embedding(w.t().contiguous().t(), idx) - 1", 1},
    {"indices_transposed", "w, idx, x", "    return torch.embedding(w, idx.t()) * 3", 1},
    {"layer_norm", "w, idx, x",
     "    e = torch.embedding(w, idx) + x\n    return torch.layer_norm(e, [e.size(-1)], None, None, 1e-5), e",
     1},
    {"sum_rows", "w, idx, x", "    return torch.embedding(w, idx).sum(-1)", 1},
    {"sum_positions", "w, idx, x", "    return torch.embedding(w, idx).sum(1) * 2", 1},
    {"column_sum", "w, idx, x", "    return (x[0] + torch.embedding(w, idx[0])).sum(0)", 1},
    {"row_value", "w, idx, x", "    return (torch.embedding(w, idx[0]) * x).mean(0)", 1},
    // aten::gather: the table's elements at the indices along one dim.
    {"gather_dim0", "w, idx, x", "    return torch.gather(w, 0, idx) * 2", 1},
    {"gather_transposed_table", "w, idx, x", "    return torch.gather(w.t(), 1, idx) + x[:, :, 0]", 1},
    {"gather_row_sum", "w, idx, x", "    return torch.gather(w, 0, idx).sum(-1)", 1},
};

// Inputs of a case: a [V=37, D=24] table of `t` (NaN, +-Inf among float values), indices [4, 9] of
// `index_type` covering 0 and V-1, and x [4, 9, 24] in float32 (`t` when floating).
inline std::vector<c10::IValue> gather_inputs(at::ScalarType t, at::ScalarType index_type) {
  at::manual_seed(11);
  at::Tensor w = at::isFloatingType(t) ? at::randn({37, 24}).to(t) : at::randint(-50, 50, {37, 24}).to(t);
  if (at::isFloatingType(t)) {
    w[3][5] = NAN;
    w[7][1] = INFINITY;
    w[8][2] = -INFINITY;
  }
  at::Tensor idx = at::randint(0, 37, {4, 9}, at::kLong);
  idx[0][0] = 0;
  idx[1][1] = 36;
  idx[2][2] = 3;
  idx[3][3] = 7;
  at::Tensor x = at::randn({4, 9, 24}).to(at::isFloatingType(t) ? t : at::kFloat);
  return {w, idx.to(index_type), x};
}

// The table dtypes a case runs in: every dtype for the first case, float32 and float16 for the others.
inline std::vector<at::ScalarType> gather_table_types(const GatherCase& c) {
  if (&c != &kGatherCases[0]) return {at::kFloat, at::kHalf};
  return {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt};
}

}  // namespace fusion_jit::testing
