#include "torch/tolerance.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/kthvalue.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/where.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/StringUtil.h>

#include <cmath>

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

// |a - r| per element: 0 where they are equal (equal infinities included) or both NaN, +inf where exactly one
// is NaN.
at::Tensor element_err(const at::Tensor& a64, const at::Tensor& r64) {
  at::Tensor d = (a64 - r64).abs();
  d = at::where(at::logical_or(a64.eq(r64), at::logical_and(a64.isnan(), r64.isnan())), at::zeros_like(d), d);
  return at::where(at::isnan(d), at::full_like(d, INFINITY), d);
}

// The distance from 1 to the next value of the dtype.
double epsilon_of(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return 0x1p-10;
    case at::kBFloat16: return 0x1p-7;
    case at::kDouble: return 0x1p-52;
    default: return 0x1p-23;
  }
}

// Eager's typical error along the lines through each element: for each dim of at least kLine elements,
// eager's second largest error over the element's line along that dim (the other indices fixed), the
// largest over those dims; over the whole tensor where no dim is that long. The line's worst element left
// out, one ill-conditioned element raises no other's; a column divided by a small
// number, a row of a softmax, a channel of a normalization raise the errors of the whole line together.
constexpr int64_t kLine = 16;
at::Tensor typical_err(const at::Tensor& err) {
  auto typical_along = [](const at::Tensor& t, int64_t dim) {
    const int64_t n = t.size(dim);
    return std::get<0>(at::kthvalue(t, std::max<int64_t>(1, n - 1), dim, /*keepdim=*/true));
  };
  at::Tensor typical;
  for (int64_t d = 0; d < err.dim(); ++d)
    if (err.size(d) >= kLine) typical = typical.defined() ? at::maximum(typical, typical_along(err, d)) : typical_along(err, d).expand_as(err);
  if (!typical.defined()) typical = typical_along(err.reshape(-1), 0).expand(err.numel()).reshape(err.sizes());
  return typical;
}

// The floor of the per-element second chance, in ulps of the element's magnitude.
constexpr double kFloorUlps = 4;

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
  // An infinity must be eager's infinity: |a - e| <= atol + rtol * |e| holds for any a where e is infinite.
  at::Tensor infinite = at::logical_or(at::isinf(a), at::isinf(e));
  at::Tensor bad = at::logical_and(at::logical_or(diff.gt(bound), infinite), a.ne(e));  // equal infinities pass
  bad = at::logical_and(bad, at::logical_and(an, en).logical_not());
  bool close = nan_ok && !bad.any().item<bool>();
  if (close) return r;
  if (reference64 && nan_ok) {
    // Note [Per-element second chance]
    // An element outside eager's tolerance passes when its error against float64 is within `factor` times
    // eager's error at that same element, or eager's typical error along the lines through it where that
    // is larger (typical_err), plus a few ulps of its magnitude. Per element: one ill-conditioned element
    // (eager's error large there) licenses nothing elsewhere, as the largest error over the tensor did.
    // Not eager's error at the element alone: where a reduction's summation order differs from eager's (a
    // GEMM kernel of another library), an element's rounding error is as random as eager's, of the same
    // size, and eager's happens to be tiny at some elements where ours is not (a linear divided by a bias:
    // 6.3e-5 against eager's 1.7e-6 at an element of 2.0 whose column's bias is small). Nor eager's error at
    // elements of the same magnitude: that column's errors are all large, at every magnitude.
    at::Tensor r64 = reference64->to(at::kDouble);
    at::Tensor ours = element_err(a, r64), eager = element_err(e, r64);
    const bool half = actual.scalar_type() == at::kHalf || actual.scalar_type() == at::kBFloat16;
    const double factor = half ? 3 : 2;
    at::Tensor floor = at::where(at::isfinite(r64), kFloorUlps * epsilon_of(actual.scalar_type()) * r64.abs(),
                                 at::zeros_like(r64));
    at::Tensor allowed = factor * at::maximum(eager, typical_err(eager)) + floor;
    at::Tensor over = at::logical_and(bad, ours.gt(allowed));
    if (!over.any().item<bool>()) return r;
    // The worst element, by how far its error exceeds what it was allowed.
    at::Tensor excess = at::where(over, ours / allowed, at::zeros_like(ours));
    const int64_t i = excess.reshape(-1).argmax().item<int64_t>();
    r.ok = false;
    r.message = c10::str(over.sum().item<int64_t>(), " element(s) beyond the tolerance and beyond ", factor,
                         "x eager's error at the element (or its typical error); the worst, at flat index ", i, ": ", a.reshape(-1)[i].item<double>(),
                         " against float64's ", r64.reshape(-1)[i].item<double>(), " (error ", ours.reshape(-1)[i].item<double>(),
                         ", eager's ", eager.reshape(-1)[i].item<double>(), ")");
    return r;
  }
  r.ok = false;
  r.message = nan_ok ? c10::str("values differ beyond rtol ", tol.rtol, " atol ", tol.atol, " (max abs error ",
                                r.max_abs_err, ")")
                     : std::string("NaN positions differ");
  return r;
}

}  // namespace fusion_jit
