// The reduction corpus: every reduction and normalization fusion_jit fuses, as TorchScript expressions
// over an input $, in every dtype it accepts, applied at once to inputs of many shapes and layouts (contiguous,
// permuted, sliced with an offset and a step, size 0, size 1, primes, one around the CPU vector width and
// the CUDA warp and block sizes, rows longer than a thread block keeps in registers), with NaN and +-inf
// in some float inputs. Shared by the CPU tests against eager and the NVRTC corpus test.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_util.h"

namespace fusion_jit::testing {

enum ReductionDTypes : unsigned { kRF = 1, kRLow = 2, kRInt = 4, kRBool = 8 };  // f32 f64 | f16 bf16 | ints | bool

struct ReductionCase {
  const char* name;
  const char* expr;       // over $ (an input of rank 3)
  unsigned dtypes;
  bool empty_ok = true;   // eager accepts reduced dims of size 0 (amax and max raise)
  const char* schema;     // what must not run through ATen (fused or decomposed), "" for no check
};

inline const ReductionCase kReductionCases[] = {
    {"sum_last", "torch.sum($, -1)", kRF | kRLow | kRInt | kRBool, true, "aten::sum.dim_IntList"},
    {"sum_first_keep", "torch.sum($, 0, keepdim=True)", kRF | kRLow | kRInt, true, "aten::sum.dim_IntList"},
    {"sum_outer_inner", "torch.sum($, [0, 2])", kRF | kRLow | kRInt, true, "aten::sum.dim_IntList"},
    {"sum_all", "torch.sum($)", kRF | kRInt, true, "aten::sum"},
    {"sum_f64", "torch.sum($, [-1, -2], dtype=7)", kRF | kRLow, true, "aten::sum.dim_IntList"},  // 7: float64
    {"mean_middle", "torch.mean($, 1, keepdim=True)", kRF | kRLow, true, "aten::mean.dim"},
    {"mean_last2", "torch.mean($, [-2, -1])", kRF | kRLow, true, "aten::mean.dim"},
    // Factors near 1, so that no partial product of 4099 of them under- or overflows in any order.
    {"prod_last", "torch.prod($ * 0.2 + 1.0, -1)", kRF, true, "aten::prod.dim_int"},
    // float16/bfloat16: exact factors (eager multiplies in the reduced type, we in float32).
    {"prod_sign", "torch.prod(torch.sign($), -1)", kRLow, true, "aten::prod.dim_int"},
    {"prod_int", "torch.prod($, 1)", kRInt, true, "aten::prod.dim_int"},
    {"amax_last", "torch.amax($, -1)", kRF | kRLow | kRInt, false, "aten::amax"},
    {"amin_first_keep", "torch.amin($, [0, 1], keepdim=True)", kRF | kRLow | kRInt, false, "aten::amin"},
    {"max_values", "torch.max($, 1)[0]", kRF | kRLow | kRInt, false, "aten::max.dim"},
    {"min_values_keep", "torch.min($, -1, keepdim=True)[0]", kRF | kRLow | kRInt, false, "aten::min.dim"},
    {"max_all", "torch.max($)", kRF | kRInt, false, "aten::max"},
    {"var_last", "torch.var($, -1)", kRF | kRLow, true, "aten::var.dim"},
    {"var_correction0", "torch.var($, [0, 2], correction=0, keepdim=True)", kRF | kRLow, true, "aten::var.correction"},
    {"std_middle", "torch.std($, 1)", kRF | kRLow, true, "aten::std.dim"},
    {"logsumexp_last", "torch.logsumexp($, -1)", kRF | kRLow, true, "aten::logsumexp"},
    {"logsumexp_keep", "torch.logsumexp($, [0, 1], keepdim=True)", kRF | kRLow, true, "aten::logsumexp"},
    {"softmax_last", "torch.softmax($, -1)", kRF | kRLow, true, "aten::softmax.int"},
    {"softmax_first", "torch.softmax($, 0)", kRF | kRLow, true, "aten::softmax.int"},
    {"log_softmax_middle", "torch.log_softmax($, 1)", kRF | kRLow, true, "aten::log_softmax.int"},
    {"layer_norm", "torch.layer_norm($, [$.size(-1)], None, None, 1e-5)", kRF | kRLow, true, "aten::layer_norm"},
    {"layer_norm_2d", "torch.layer_norm($, [$.size(-2), $.size(-1)], None, None, 1e-3)", kRF | kRLow, true,
     "aten::layer_norm"},
    {"rms_norm", "torch.rms_norm($, [$.size(-1)], None, None)", kRF | kRLow, true, "aten::rms_norm"},
    {"group_norm", "torch.group_norm($, 1, None, None, 1e-5)", kRF | kRLow, false, ""},
    // Whole-tensor overloads (OpTableCoverage in ops_test.cpp names any op of the table no case runs).
    {"mean_all", "torch.mean($)", kRF, true, "aten::mean"},
    {"prod_all", "torch.prod($ * 0.2 + 1.0)", kRF, true, "aten::prod"},
    {"min_all", "torch.min($)", kRF | kRInt, false, "aten::min"},
    {"var_all", "torch.var($)", kRF, true, "aten::var"},
};

// Inputs of rank 3. Float inputs get a NaN, +inf and -inf in some of them.
struct ReductionInput {
  std::vector<int64_t> sizes;
  int layout;  // 0 contiguous, 1 permuted (2, 1, 0), 2 sliced [:, 1:, ::2]
  bool empty;  // has a size-0 dim
};

inline std::vector<ReductionInput> reduction_inputs() {
  return {
      {{2, 3, 17}, 0, false},   {{3, 5, 16}, 0, false},  {{1, 2, 15}, 0, false},   {{1, 3, 31}, 0, false},
      {{1, 2, 33}, 0, false},   {{1, 2, 255}, 0, false}, {{1, 1, 257}, 0, false},  {{1, 1, 513}, 0, false},
      {{1, 1, 4099}, 0, false}, {{7, 13, 5}, 0, false},  {{5, 3, 17}, 1, false},   {{4, 5, 17}, 2, false},
      {{1, 1, 1}, 0, false},    {{3, 1, 7}, 0, false},   {{2, 0, 5}, 0, true},     {{0, 3, 4}, 0, true},
  };
}

inline at::Tensor make_reduction_input(const ReductionInput& in, at::ScalarType t, int index) {
  auto opts = at::TensorOptions().dtype(at::kDouble);
  std::vector<int64_t> base = in.sizes;
  if (in.layout == 1) base = {in.sizes[2], in.sizes[1], in.sizes[0]};
  if (in.layout == 2) base = {in.sizes[0], in.sizes[1] + 1, in.sizes[2] * 2};
  at::Tensor x;
  if (at::isFloatingType(t)) {
    x = at::randn(base, opts) * 2 + 0.25;
  } else if (t == at::kBool) {
    x = at::rand(base, opts).gt(0.5);
  } else {
    x = at::randint(-3, 4, base, opts);  // small: prod stays exact, as in eager
  }
  x = x.to(t);
  if (in.layout == 1) x = x.permute({2, 1, 0});
  if (in.layout == 2) x = x.slice(1, 1).slice(2, 0, c10::nullopt, 2);
  if (at::isFloatingType(t) && x.numel() > 8 && index % 4 == 1) {
    auto flat = x.view(-1);  // contiguous inputs only (index % 4 == 1 are)
    flat[3] = NAN;
    flat[x.numel() - 2] = INFINITY;
    flat[x.numel() / 2] = -INFINITY;
  }
  return x;
}

inline std::vector<at::ScalarType> reduction_dtypes(unsigned set) {
  std::vector<at::ScalarType> out;
  if (set & kRF) out.insert(out.end(), {at::kFloat, at::kDouble});
  if (set & kRLow) out.insert(out.end(), {at::kHalf, at::kBFloat16});
  if (set & kRInt) out.insert(out.end(), {at::kInt, at::kLong, at::kByte});
  if (set & kRBool) out.push_back(at::kBool);
  return out;
}

// The inputs one case runs on: every input, except empty ones where eager raises.
inline std::vector<ReductionInput> inputs_for(const ReductionCase& c) {
  std::vector<ReductionInput> out;
  for (const auto& in : reduction_inputs())
    if (c.empty_ok || !in.empty) out.push_back(in);
  return out;
}

// The corpus inputs of one case in dtype `t` (seeded: the same tensors every time), and how many of them
// have an empty dim.
inline std::vector<c10::IValue> reduction_case_inputs(const std::vector<ReductionInput>& ins, at::ScalarType t,
                                                       int* empty = nullptr) {
  at::manual_seed(7);
  std::vector<c10::IValue> inputs;
  for (size_t i = 0; i < ins.size(); ++i) {
    inputs.emplace_back(make_reduction_input(ins[i], t, static_cast<int>(i)));
    if (empty) *empty += ins[i].empty;
  }
  return inputs;
}

// The case's expression applied to the input named `name`.
inline std::string reduction_expr(const ReductionCase& c, const std::string& name) {
  std::string e = c.expr;
  for (size_t p = e.find('$'); p != std::string::npos; p = e.find('$', p)) e.replace(p, 1, name);
  return e;
}

// One module applying the case's expression to N inputs: forward(self, x0, ..., xN-1) -> tuple.
inline torch::jit::Module reduction_module(const ReductionCase& c, size_t n) {
  std::string args, body, rets;
  for (size_t i = 0; i < n; ++i) {
    args += (i ? ", " : "") + std::string("x") + std::to_string(i);
    body += "    r" + std::to_string(i) + " = " + reduction_expr(c, "x" + std::to_string(i)) + "\n";
    rets += (i ? ", " : "") + std::string("r") + std::to_string(i);
  }
  return script(args, body + "    return (" + rets + ",)");
}

// Every reduction case that accepts dtype `t` and whose `empty_ok` is `empty_ok`, in one module over
// forward(x) (the tests of sizes as kernel arguments, over x [2, 3, n]); `*cases` receives how many.
inline torch::jit::Module all_reductions_module(at::ScalarType t, bool empty_ok, int* cases) {
  std::string body = "    return (";
  *cases = 0;
  for (const ReductionCase& c : kReductionCases) {
    auto ds = reduction_dtypes(c.dtypes);
    if (c.empty_ok != empty_ok || std::find(ds.begin(), ds.end(), t) == ds.end()) continue;
    body += reduction_expr(c, "x") + ", ";
    ++*cases;
  }
  return script("x", body + ")");
}

// The input of all_reductions_module at size n (NaN and +-inf among float values).
inline at::Tensor all_reductions_input(at::ScalarType t, int64_t n) {
  at::manual_seed(7);
  return make_reduction_input({{2, 3, n}, 0, n == 0}, t, 1);
}

}  // namespace fusion_jit::testing
