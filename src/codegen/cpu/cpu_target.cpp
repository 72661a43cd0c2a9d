// The CPU target: C++ for the host compiler (cpu_printer.cpp, cpu_prelude.inc), lowered to follow eager's
// CPU kernels (ATen's vectorized float math, its scalar handling of float16/bfloat16).
#include "codegen/cpu/cpu_printer.h"
#include "codegen/kernel_spec.h"
#include "codegen/target.h"

namespace fusion_jit {
namespace {

// ATen's TensorIterator::is_scalar(arg): the operand's stride is 0 in every dim of the op's shape that
// is not 1 (a wrapped number, a 0-dim or one-element tensor, or one expanded in every dim).
bool eager_is_scalar(const Value* v, const Value* out) {
  const TensorType& t = v->tensor_type();
  const TensorType& o = out->tensor_type();
  int64_t off = o.dim() - t.dim();
  for (int64_t d = 0; d < o.dim(); ++d) {
    int64_t k = d - off;
    if (o.sizes[d] != 1 && k >= 0 && t.sizes[k] != 1 && t.strides[k] != 0) return false;
  }
  return true;
}

class CpuTarget final : public Target {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::kCPU; }

  // Eager's CPU kernel for a float16/bfloat16 result rounds operands and the Scalars that take part in
  // promotion (ATen wraps them in tensors and TensorIterator casts those), masked_fill's value, and
  // add/sub/rsub's alpha (the ufunc kernel takes alpha.to<scalar_t>()). It does not round the scalar
  // second operand of mul and div (every rounding mode): BinaryOpsKernel.cpp takes `iter.is_scalar(2) &&
  // isReducedFloatingType(dtype)` -> `iter.original_scalar_value<opmath_t>(2)`, the value before the cast
  // (a double 0.001 becomes (float)0.001, not float16's 0.0010004); nor lerp's Scalar weight
  // (weight.to<opmath_t>()); nor the other non-promoting Scalars (addcmul's value, leaky_relu's slope).
  bool rounds_argument(const OpInfo& op, size_t i, const Value* v, const Value* out, bool promoting) const override {
    const std::string& fn = op.kernel_fn;
    if ((fn == "mul" || fn == "div") && i == 1 && (!v || eager_is_scalar(v, out))) return false;
    if (fn == "lerp" && i == 2 && !v) return false;
    if ((fn == "add" || fn == "sub" || fn == "rsub") && i == 2 && !v) return true;  // alpha
    return promoting;
  }

  std::string math_fn(const std::string& fn, DType out) const override {
    // Eager's CPU erf of float16/bfloat16 computes in float through Vectorized<float>::erf, an
    // Abramowitz-Stegun polynomial (1.5e-7 absolute error; tiny inputs give 0), not libm's erff.
    if (fn == "erf" && is_reduced_float(out)) return "erf_as";
    // So does its float32 GELU (the vectorized part of GeluKernel.cpp), which libmvec's erff makes three
    // times slower here; float16 takes the plain formula on some CPUs (EagerCpuMath).
    if (fn == "gelu" && compute_dtype(out) == DType::kFloat32) {
      if (out == DType::kFloat16 && !eager_cpu_math().half_gelu_polynomial) return "gelu_erf";
      return "gelu_as";
    }
    return fn;
  }

  // ATen's CPU kernel skips the sqrt/rsqrt special cases for float16 (pow(-inf, 0.5) is +inf there,
  // sqrt(-inf) NaN in float32 and bfloat16).
  bool pow_uses_sqrt(DType out) const override { return out != DType::kFloat16; }

  // float32 sums add up in double, as exact as eager's cascade sum or more, except sums of terms that
  // cannot cancel (softmax's exps, rms_norm's squares): float lanes keep those accurate and cost less.
  AccKind float_sum(DType acc, bool non_negative) const override {
    if (acc == DType::kFloat32) return non_negative ? AccKind::kSum : AccKind::kDoubleSum;
    return AccKind::kKahanSum;
  }

  // In a scratch row per thread, within about a core's L2 share.
  bool may_keep_between_passes(const KernelSpec& k, DType t, size_t, int64_t* budget) const override {
    const int64_t bytes = k.row_len * static_cast<int64_t>(dtype_size(compute_dtype(t)));
    if (bytes > *budget) return false;
    *budget -= bytes;
    return true;
  }

  std::string print_source(const std::vector<KernelSpec>& kernels) const override { return print_cpu_source(kernels); }
};

}  // namespace

const Target& cpu_target() {
  static const CpuTarget t;
  return t;
}

}  // namespace fusion_jit
