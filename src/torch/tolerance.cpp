#include "torch/tolerance.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/where.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/StringUtil.h>

namespace fusion_jit {

Tolerance tolerance_for(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return {1e-3, 1e-5};
    case at::kBFloat16: return {1.6e-2, 1e-5};
    case at::kDouble: return {1e-7, 1e-7};
    default: return {1.3e-6, 1e-5};
  }
}

namespace {

// Max |a - b| over elements, NaN positions equal when both are NaN; +inf when only one is NaN or the
// infinities differ.
double max_err(const at::Tensor& a64, const at::Tensor& b64) {
  if (a64.numel() == 0) return 0;
  at::Tensor an = at::isnan(a64), bn = at::isnan(b64);
  if (!an.equal(bn)) return INFINITY;
  at::Tensor both_inf_equal = a64.eq(b64);  // equal infinities (and equal values) give 0 error
  at::Tensor d = at::where(at::logical_or(an, both_inf_equal), at::zeros_like(a64), (a64 - b64).abs());
  at::Tensor finite_d = at::where(at::isnan(d), at::full_like(d, INFINITY), d);
  return finite_d.max().item<double>();
}

}  // namespace

bool same_values(const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes()) || a.scalar_type() != b.scalar_type()) return false;
  if (!at::isFloatingType(a.scalar_type())) return a.equal(b);
  return at::logical_or(a.eq(b), at::logical_and(a.isnan(), b.isnan())).all().item<bool>();
}

CheckResult check_close(const at::Tensor& actual, const at::Tensor& expected,
                        const std::optional<at::Tensor>& reference64, bool check_strides) {
  CheckResult r;
  if (actual.scalar_type() != expected.scalar_type()) {
    r.ok = false;
    r.message = c10::str("dtype ", actual.scalar_type(), " but eager gives ", expected.scalar_type());
    return r;
  }
  if (!actual.sizes().equals(expected.sizes())) {
    r.ok = false;
    r.message = c10::str("shape ", actual.sizes(), " but eager gives ", expected.sizes());
    return r;
  }
  if (check_strides && actual.numel() > 1 && !actual.strides().equals(expected.strides())) {
    r.ok = false;
    r.message = c10::str("strides ", actual.strides(), " but eager gives ", expected.strides());
    return r;
  }
  if (!at::isFloatingType(actual.scalar_type())) {
    r.ok = actual.equal(expected);
    if (!r.ok) {
      r.max_abs_err = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
      r.message = c10::str("integer or bool values differ (max abs difference ", r.max_abs_err, ")");
    }
    return r;
  }
  at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  r.max_abs_err = max_err(a, e);
  Tolerance tol = tolerance_for(actual.scalar_type());
  at::Tensor an = at::isnan(a), en = at::isnan(e);
  bool nan_ok = an.equal(en);
  at::Tensor diff = (a - e).abs();
  at::Tensor bound = tol.atol + tol.rtol * e.abs();
  at::Tensor bad = at::logical_and(diff.gt(bound), a.ne(e));  // a.ne(e) is false for equal infinities
  bad = at::logical_and(bad, at::logical_and(an, en).logical_not());
  bool close = nan_ok && !bad.any().item<bool>();
  if (close) return r;
  if (reference64 && nan_ok) {
    // Our error is judged on the elements outside eager's tolerance only: the others passed already, and
    // their distance from float64 (which skips the float16/bfloat16 roundings of intermediates that both
    // eager and we do) says nothing about the failing ones.
    at::Tensor r64 = reference64->to(at::kDouble);
    double ours = max_err(a.masked_select(bad), r64.masked_select(bad)), eager = max_err(e, r64);
    double factor = (actual.scalar_type() == at::kHalf || actual.scalar_type() == at::kBFloat16) ? 3 : 2;
    if (ours <= factor * eager) return r;
    r.ok = false;
    r.message = c10::str("error against float64 ", ours, " exceeds ", factor, "x eager's ", eager);
    return r;
  }
  r.ok = false;
  r.message = nan_ok ? c10::str("values differ beyond rtol ", tol.rtol, " atol ", tol.atol, " (max abs error ",
                                r.max_abs_err, ")")
                     : std::string("NaN positions differ");
  return r;
}

}  // namespace fusion_jit
