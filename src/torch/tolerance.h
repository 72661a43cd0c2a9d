// How results are judged against eager PyTorch: the one tolerance table of the project (DESIGN.md).
//
// Integers and bools: equal. Floats: |a - e| <= atol + rtol * |e| elementwise, NaN equal to NaN, an
// infinity equal to eager's, with the torch.testing defaults per dtype. Where that is too strict
// (reductions), a float64 reference may be given: an element outside the tolerance then passes when its
// error against the reference is at most 2x (3x for float16 and bfloat16) eager's error at that element,
// or eager's typical error along the lines through it where larger, plus 4 ulps of its magnitude (Note
// [Per-element second chance] in tolerance.cpp). Dtype, sizes and strides must equal eager's.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace fusion_jit {

struct Tolerance {
  double rtol, atol;
};
Tolerance tolerance_for(at::ScalarType t);

struct CheckResult {
  bool ok = true;
  double max_abs_err = 0;
  std::string message;  // why not ok
};

// Equal values with NaN equal to NaN (bit-for-bit sameness up to NaN payloads): inputs must come back
// unchanged from a fused run.
bool same_values(const at::Tensor& a, const at::Tensor& b);

CheckResult check_close(const at::Tensor& actual, const at::Tensor& expected,
                        const std::optional<at::Tensor>& reference64 = std::nullopt, bool check_strides = true);

}  // namespace fusion_jit
