// Eager replays of recipes: each op run on concrete tensors, under the preconditions that make its result
// well defined enough to compare (Note [The fuzzer's oracle and ill-conditioned cases]); the flags and
// the numerical model (summands, amplifications of reductions) that the oracle judges by.
#include <ATen/ATen.h>

#include <cmath>

#include "fuzz/fuzz_internal.h"
#include "ir/op_table.h"
#include "passes/passes.h"
#include "torch/executor.h"

namespace fusion_jit::fuzz {

// Note [The fuzzer's oracle and ill-conditioned cases]
// Eager and fused kernels agree bit for bit on IEEE arithmetic, but transcendental functions come from
// different libraries (eager: SLEEF, 1 ulp, and libm in its scalar loops; kernels: glibc's libmvec,
// 4 ulp), FMA contraction differs, and a few eager kernels have quirks of their own. Differences of a few ulps are within tolerance unless something amplifies
// them, so the generator only builds graphs where the comparison means something:
//  - values carry a flag "inexact" when a transcendental op (or FMA-contracted arithmetic) produced them
//    or any of their inputs; discontinuous functions (comparisons, rounding, integer casts, sign,
//    modulo, floor division, logical tests of floats) take only exact values;
//  - exp-like functions, sin and cos of inexact values take |x| < 4, pow of inexact bases |exponent| <= 4
//    (each ulp of input is amplified by |x| or by the exponent);
//  - a zero whose sign is unspecified (eager's min/max-like ops return either zero depending on which
//    loop runs) is never a divisor or the base of a negative power;
//  - integer division never sees the type's minimum (INT_MIN / -1 traps in eager);
//  - sin, cos, tan take |x| < 1e4 (argument reduction differs between libraries), tan only exact values;
//  - fmod, remainder and rounded division take finite values with |a/b| < 2^22 and b != 0 (SLEEF's
//    fmod returns NaN for huge quotients);
//  - float -> integer casts take finite values in range (C++ UB in ATen);
//  - the erf form of gelu takes finite values (eager's vectorized and scalar loops disagree on +-inf);
//  - no cancellation: a sum or difference of inexact values at least 1000x smaller than its operands;
//    nor in gelu's 1 + erf(x / sqrt 2): no -5.8 < x < -3.29 (below, every float erf is -1 and gelu -0);
//  - no transcendental result within a factor of 2 of the dtype's largest value;
//  - float16/bfloat16 add, sub, rsub with alpha != 1 keep |a| + |alpha * b| within half the dtype's
//    largest value (eager's scalar loop rounds alpha * b to the dtype, its vector loop does not, so
//    whether it overflows depends on the tensor's length);
//  - pow with an inexact exponent takes no negative base (the exponent decides whether the result is NaN).
// And an inexact output may differ from eager's by 4 ulps of its dtype (where the tolerance is stricter),
// times, per element, how much the cancellations on its way amplified its operands' ulps
// (amplifications(): |largest operand| / |result|, under 1000x by the rule above).
// A sum-like op's cancellation is judged against its summands, not its raw operands: a and alpha * b
// (add, sub; b and alpha * a for rsub), s and v * a * b (addcmul) or v * a / b (addcdiv), x * alpha,
// mean * alpha and b (batch_norm, whichever of its formulas eager takes). Campaign
// 424242's graph exp -> rsub(0.5, alpha=7) -> log2 lost 1200x in 0.5 - 7 exp(x) while exp(x) alone
// looked 170x; eager's FMA for a + alpha * b is now the kernels' too (common_prelude.inc).
// An op that breaks its precondition is not added (generation) or makes the recipe invalid (shrinking).
//
// Note [The fuzzer's wider graphs]
// Besides the op table's elementwise ops, a recipe draws (GenOptions) reductions, views, random ops and
// in-place ops; elementwise ops before and after them make the prologues and epilogues of reduction
// kernels, and views sit between fused ops.
//  - Reductions and normalizations: sum, mean, amax, var (correction 0 or 1, below the reduced count),
//    softmax, log_softmax, layer_norm and rms_norm (over the last 1-2 dims, no weight), over random
//    dims, keepdim or not. Their float results are inexact (amax's are exact, with a zero of unspecified
//    sign). Each amplifies its input's relative error (structural_local_amp): a sum or mean by
//    sum|x| / |sum x| (times 2 for its own rounding), var by 1 + 2 mean(|x - m||x|) / var, softmax by
//    1 + 2 max|x| over the row, log_softmax by that over |y|, layer_norm by (|x| + |m|) / |x - m| plus
//    var's, rms_norm by 2. Not generated: an amplification over 1000x, including a result that cancels
//    to exactly 0 from nonzero values (a sum of opposite terms, a row of equal values under var or
//    layer_norm: the true x - mean is 0, so any rounding of the mean is an unbounded relative error,
//    which rstd = 1 / sqrt(eps) scales up; eager's mean of 32769 equal values came out exact, the
//    kernels' not); a sum of |x| (of x^2 for var and the norms) over half
//    the accumulator's largest value (partial sums overflow in one order and not in another); a result
//    within a factor of 2 of its dtype's largest value. Inexact results then pass within 4 ulps times
//    the amplification (the input's largest, times the op's own).
//  - Views (view, reshape, permute, transpose, expand, slice, select, squeeze, unsqueeze): exact, flags
//    and amplifications pass through; eager's rejections (view of a non-contiguous value) are skipped.
//  - cat and stack of 2-3 values of one dtype along a random dim (one may come twice), of one shape, or for
//    cat of any size along the dim: exact,
//    the items' flags merged and their largest amplification passed on. The recipe lists the items as
//    value arguments before the dim; the graph gets a prim::ListConstruct of them, the TorchScript
//    source a list.
//  - embedding of a 2-d value's rows by an int32 or int64 value whose entries all lie within them, or
//    gather of its elements along dim 0 by such a 2-d value no wider than it: exact,
//    the table's flags passed on. Where no integer value fits, the draw is the remainder of an integer
//    value by the row count (an integer division by a literal, fused), which a later draw may take.
//  - batch_norm in inference over a float value of rank >= 2, its weight and bias (each at times None) and
//    running statistics 1-d values of its channel count (the variance one without negative elements
//    where there is one): inexact, its cancellation of inexact operands judged against its summands
//    (above); eager's formula depends on the operands' layout (Note [batch_norm's formulas]).
//  - Random ops (rand_like, randn_like, bernoulli, dropout with train=True): a recipe with one is
//    checked alone; the torch generator is seeded with draw_seed(recipe seed) before generation, before
//    the eager replay and before the fused run, and its random nodes are marked as having side effects
//    as the adapter marks a captured graph's (no CSE, no folding, no DCE of an unused draw, ATen in
//    order), so the fused run draws eager's numbers in eager's order and results compare as usual. In
//    the float64 reference a random op takes eager's draws. bernoulli's p must be exact (it is compared
//    with the draws). Random ops never share a recipe with an in-place op: such recipes run through
//    TorchScript, whose interpreter drops an unused draw that eager's op-by-op run makes.
//  - In-place ops (add_, sub_, mul_, clamp_min_, relu_, neg_ on a graph input; at most one per recipe,
//    none with the 4 GB huge-stride input): the recipe runs the way a user's model does, its TorchScript
//    source through compile(), called twice on fresh inputs (the first call decides whether it can
//    capture, the second runs what it decided). Outputs are judged as above, and every input after the
//    call must equal eager's bit for bit: modified exactly as eager modifies it, once per call.
// Graph seeds of campaigns before these kinds replay with GenOptions::elementwise_only().
// torch.compile and addcdiv: dynamo hands `torch.addcdiv(s, a, b, value=v)` to every backend as
// s + (a / b) * v, three float16 roundings where eager's kernel makes one (up to a few ulps apart where
// the sum cancels: the float16 finding of issue 13). The backend restores the addcdiv before AOT
// autograd (python/fusion_jit/_backend.py, _restore_addcdiv); the fuzzer's recipes are ATen ops and
// never see the rewrite.
// Op properties (exact, discontinuous, integer division, integer-only) come from the op table's flags; the
// names below are the oracle's numerical model of particular functions (their condition numbers,
// summands, domains and singularities), which a new op needs only when the fuzzer finds it ill-conditioned.
bool in_set(const std::string& fn, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (fn == n) return true;
  return false;
}

int precision_class(at::ScalarType t) {
  return t == at::kDouble ? 1 : (t == at::kHalf || t == at::kBFloat16) ? 3 : 2;
}
double class_eps(int c) { return c == 1 ? 0x1p-52 : c == 3 ? 0x1p-7 : 0x1p-23; }

namespace {

bool is_int_code(int c) { return c == 0 || c == 1 || c == 2 || c == 3 || c == 4; }

// The device of the first defined tensor among `args`, else the CPU.
at::Device device_of(const std::vector<c10::IValue>& args) {
  for (const auto& v : args)
    if (v.isTensor() && v.toTensor().defined()) return v.toTensor().device();
  return at::Device(at::kCPU);
}

// A tensor or scalar argument as a float64 tensor, a scalar on `device`: a CPU tensor counts as a scalar
// beside CUDA tensors only while it has no dims and only in some ops (broadcast by expand_as, or given
// to logical_or, it is refused).
at::Tensor double_arg(const c10::IValue& v, at::Device device) {
  return v.isTensor() ? v.toTensor().to(at::kDouble)
                      : at::scalar_tensor(v.toScalar().toDouble(), at::TensorOptions().dtype(at::kDouble).device(device));
}

}  // namespace

// The magnitudes of the two summands of a sum-like op, in float64, from its arguments (tensors or
// scalars): a and alpha * b for add and sub, b and alpha * a for rsub, s and v * a * b (v * a / b) for
// addcmul (addcdiv), a and b for lerp, x * alpha, mean * alpha and b for batch_norm. Empty for other
// ops. A cancellation is judged against these, not against the raw operands: in 0.5 - 7 * exp(x) the
// summand is 7 * exp(x), not exp(x).
std::vector<at::Tensor> summands(const std::string& fn, const std::vector<c10::IValue>& args) {
  const at::Device device = device_of(args);
  auto d = [&](size_t i, double dflt) {
    return i >= args.size() || args[i].isNone() ? double_arg(dflt, device) : double_arg(args[i], device);
  };
  if (fn == "add" || fn == "sub") return {d(0, 0).abs(), (d(2, 1) * d(1, 0)).abs()};
  if (fn == "rsub") return {d(1, 0).abs(), (d(2, 1) * d(0, 0)).abs()};
  if (fn == "addcmul") return {d(0, 0).abs(), (d(3, 1) * d(1, 0) * d(2, 1)).abs()};
  if (fn == "addcdiv") return {d(0, 0).abs(), (d(3, 1) * d(1, 0) / d(2, 1)).abs()};
  if (fn == "lerp") return {d(0, 0).abs(), d(1, 0).abs()};
  if (fn == "batch_norm") {
    // x * alpha + (b - mean * alpha), alpha = w / sqrt(var + eps), or ((x - mean) * invstd) * w + b
    // (Note [batch_norm's formulas]): x * alpha, mean * alpha and b; per-channel terms along dim 1.
    at::Tensor x = d(0, 0);
    auto channel = [&](size_t i, double dflt) {
      at::Tensor t = d(i, dflt);
      std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
      if (t.dim() == 1 && x.dim() >= 2) shape[1] = t.size(0);
      return t.dim() == 1 ? t.reshape(shape) : t;
    };
    at::Tensor alpha = channel(1, 1) * (channel(4, 1) + d(7, 1e-5)).rsqrt();
    return {(x * alpha).abs(), (channel(3, 0) * alpha).abs(), channel(2, 0).abs()};
  }
  return {};
}

// ---- Reductions, views, random ops and in-place ops (Note [The fuzzer's wider graphs]) ----

const std::vector<std::string>& reduction_schemas() {
  static const std::vector<std::string> v = {"aten::sum.dim_IntList", "aten::mean.dim",       "aten::amax",
                                             "aten::var.correction",  "aten::softmax.int",     "aten::log_softmax.int",
                                             "aten::layer_norm",      "aten::rms_norm"};
  return v;
}
const std::vector<std::string>& view_schemas() {
  static const std::vector<std::string> v = {"aten::view",      "aten::reshape",     "aten::permute",
                                             "aten::transpose.int", "aten::expand", "aten::slice.Tensor",
                                             "aten::select.int", "aten::squeeze.dim", "aten::unsqueeze"};
  return v;
}
const std::vector<std::string>& random_schemas() {
  static const std::vector<std::string> v = {"aten::rand_like", "aten::randn_like", "aten::bernoulli", "aten::dropout"};
  return v;
}
const std::vector<std::string>& inplace_schemas() {
  static const std::vector<std::string> v = {"aten::add_.Tensor", "aten::sub_.Tensor", "aten::mul_.Tensor",
                                             "aten::add_.Scalar", "aten::mul_.Scalar", "aten::clamp_min_",
                                             "aten::relu_",       "aten::neg_"};
  return v;
}
bool listed(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }
bool is_random_schema(const std::string& s) { return listed(random_schemas(), s); }
bool is_cat_schema(const std::string& s) { return s == "aten::cat" || s == "aten::stack"; }
bool is_gather_schema(const std::string& s) { return s == "aten::embedding" || s == "aten::gather"; }
bool is_structural_schema(const std::string& s) {
  return listed(reduction_schemas(), s) || listed(view_schemas(), s) || is_random_schema(s) || is_cat_schema(s) ||
         is_gather_schema(s);
}
std::string inplace_base(const std::string& s) {
  size_t dot = s.find('.');
  size_t end = dot == std::string::npos ? s.size() : dot;
  if (end < 7 || s[end - 1] != '_' || s.compare(0, 6, "aten::") != 0 || s[end - 2] == '_') return "";
  return s.substr(0, end - 1) + s.substr(end);
}

namespace {

// Non-finite or NaN amplifications (0 / 0, inf / inf) count as 1; none is below 1.
at::Tensor clean_amp(at::Tensor a) { return at::where(a.isfinite(), a, at::ones_like(a)).clamp_min(1.0); }

// The dims a reduction-like op reduces over, as non-negative indices of its input.
std::vector<int64_t> reduced_dims(const std::string& schema, const std::vector<c10::IValue>& args, int64_t nd) {
  std::vector<int64_t> dims;
  if (schema == "aten::layer_norm" || schema == "aten::rms_norm") {
    int64_t k = static_cast<int64_t>(args.at(1).toIntList().size());
    for (int64_t d = nd - k; d < nd; ++d) dims.push_back(d);
  } else if (schema == "aten::softmax.int" || schema == "aten::log_softmax.int") {
    dims.push_back(args.at(1).toInt());
  } else if (args.size() > 1 && args[1].isIntList()) {
    for (int64_t d : args[1].toIntVector()) dims.push_back(d);
  }
  if (dims.empty())
    for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
  for (auto& d : dims) d = d < 0 ? d + std::max<int64_t>(nd, 1) : d;
  if (nd == 0) dims.clear();
  return dims;
}

}  // namespace

// How much a reduction-like op amplifies relative errors of its input (float64, per element of the
// result): a sum or mean by sum|x| / |sum x| (its own rounding counted twice), var by 1 + 2 mean(|x - m|
// |x|) / var, softmax by 1 + 2 max|x| over the row, log_softmax by that over |y|, layer_norm by (|x| +
// |m|) / |x - m| plus var's, rms_norm by 2. Undefined for amax, views and random ops (they add no error).
// An amplification without bound (a result that cancels to exactly 0): finite, so that clean_amp keeps it.
constexpr double kUnbounded = 1e300;

at::Tensor structural_local_amp(const std::string& schema, const std::vector<c10::IValue>& args, const at::Tensor& res) {
  if (!args.at(0).isTensor() || !at::isFloatingType(args[0].toTensor().scalar_type()) ||
      !at::isFloatingType(res.scalar_type()) || res.numel() == 0 || !listed(reduction_schemas(), schema) ||
      schema == "aten::amax")
    return at::Tensor();
  at::Tensor x = args[0].toTensor().to(at::kDouble);
  if (x.numel() == 0) return at::Tensor();
  at::Tensor r = res.to(at::kDouble);
  std::vector<int64_t> dims = reduced_dims(schema, args, x.dim());
  at::Tensor local;
  if (schema == "aten::sum.dim_IntList" || schema == "aten::mean.dim") {
    at::Tensor s = x.dim() ? x.abs().sum(dims, true) : x.abs();
    at::Tensor v = x.dim() ? x.sum(dims, true) : x;
    local = (2 * s / v.abs()).reshape(r.sizes());
    local = at::where(at::logical_and(v.eq(0), s.gt(0)).reshape(r.sizes()), at::full_like(local, kUnbounded), local);
  } else if (schema == "aten::rms_norm") {
    local = at::full_like(r, 2.0);
  } else if (schema == "aten::softmax.int" || schema == "aten::log_softmax.int") {
    at::Tensor mx = x.dim() ? x.abs().amax(dims, true) : x.abs();
    local = (1 + 2 * mx).expand_as(r);
    if (schema == "aten::log_softmax.int") local = local / r.abs();
  } else {  // var, layer_norm
    at::Tensor m = x.dim() ? x.mean(dims, true) : x;
    at::Tensor c = x - m;
    at::Tensor var0 = x.dim() ? c.square().mean(dims, true) : c.square();
    at::Tensor lv = 1 + 2 * (x.dim() ? (c.abs() * x.abs()).mean(dims, true) : c.abs() * x.abs()) / var0;
    // A row of equal nonzero values: the true var (x - mean) is 0, any rounding of the mean is an
    // unbounded relative error (and rstd = 1 / sqrt(eps) scales it up).
    at::Tensor mag = x.dim() ? x.abs().amax(dims, true) : x.abs();
    lv = at::where(at::logical_and(var0.eq(0), mag.gt(0)), at::full_like(lv, kUnbounded), lv);
    if (schema == "aten::var.correction") {
      local = lv.reshape(r.sizes());
    } else {
      at::Tensor ratio = (x.abs() + m.abs()) / c.abs();
      ratio = at::where(at::logical_and(c.eq(0), (x.abs() + m.abs()).gt(0)), at::full_like(ratio, kUnbounded), ratio);
      local = ratio + lv;
    }
  }
  return clean_amp(local);
}

namespace {

// Preconditions of reductions (Note [The fuzzer's wider graphs]): no amplification over 1000x, no
// partial sum (of |x|, or of x^2 for var and the norms) past half the accumulator's largest value, and
// no result within a factor of 2 of the dtype's largest value.
bool reduction_ok(const std::string& schema, const std::vector<c10::IValue>& args, const at::Tensor& res) {
  if (!args.at(0).isTensor()) return true;
  const at::Tensor& in = args[0].toTensor();
  if (!at::isFloatingType(in.scalar_type()) || in.numel() == 0) return true;
  at::Tensor x = in.to(at::kDouble);
  x = at::where(x.isfinite(), x, at::zeros_like(x));  // NaN and inf propagate alike in both
  double acc_max = in.scalar_type() == at::kDouble ? 1.7e308 : 3.4e38;
  bool squares = in_set(schema, {"aten::var.correction", "aten::layer_norm", "aten::rms_norm"});
  double total = (squares ? x.square() : x.abs()).sum().item<double>();
  if (!(total < acc_max / 2)) return false;
  if (at::isFloatingType(res.scalar_type()) && res.numel()) {
    double limit = res.scalar_type() == at::kHalf ? 65504.0 : res.scalar_type() == at::kDouble ? 1.7e308 : 3.4e38;
    at::Tensor r = res.to(at::kDouble).abs();
    if (at::logical_and(r.isfinite(), r.gt(limit / 2)).any().item<bool>()) return false;
  }
  at::Tensor local = structural_local_amp(schema, args, res);
  return !local.defined() || local.numel() == 0 || local.max().item<double>() <= 1000;
}

// eager_op for reductions, views and random ops.
bool eager_structural(const std::string& schema, std::vector<c10::IValue>& stack, const std::vector<uint8_t>& arg_flags,
                      uint8_t* out_flags, bool check_preconditions) {
  uint8_t in_flags = arg_flags.empty() ? 0 : arg_flags[0];
  if (is_cat_schema(schema) && !stack.empty()) {
    // The items (value arguments before the dim) as one list; their flags merged: inexact or of
    // unspecified zero sign if any is, the coarsest precision of them.
    c10::List<at::Tensor> items;
    uint8_t merged = 0, precision = 0;
    for (size_t i = 0; i + 1 < stack.size(); ++i) {
      if (!stack[i].isTensor()) return false;
      items.push_back(stack[i].toTensor());
      uint8_t f = i < arg_flags.size() ? arg_flags[i] : 0;
      merged = static_cast<uint8_t>(merged | (f & 3));
      precision = std::max<uint8_t>(precision, static_cast<uint8_t>(f >> 2));
    }
    stack = {c10::IValue(items), stack.back()};
    in_flags = static_cast<uint8_t>(merged | (precision << 2));
  }
  std::vector<c10::IValue> args = stack;
  // Discontinuous: bernoulli compares its draws with p, so p must be exact.
  if (check_preconditions && schema == "aten::bernoulli" && (in_flags & kInexact)) return false;
  try {
    call_schema(schema, stack);
  } catch (const std::exception&) {
    return false;
  }
  if (stack.size() != 1 || !stack[0].isTensor()) return false;
  *out_flags = 0;
  if (!check_preconditions) return true;
  const at::Tensor& res = stack[0].toTensor();
  if (listed(view_schemas(), schema) || schema == "aten::dropout" || is_cat_schema(schema) ||
      is_gather_schema(schema)) {
    *out_flags = in_flags;  // (an embedding's: its table's)
  } else if (schema == "aten::amax") {
    *out_flags = static_cast<uint8_t>(in_flags | (at::isFloatingType(res.scalar_type()) ? kZeroSignUnspecified : 0));
  } else if (listed(reduction_schemas(), schema)) {
    if (!reduction_ok(schema, args, res)) return false;
    if (at::isFloatingType(res.scalar_type()))
      *out_flags = static_cast<uint8_t>(kInexact | (std::max(in_flags >> 2, precision_class(res.scalar_type())) << 2));
  }
  return true;
}

// ---- eager_op's steps ----

bool is_float_tensor(const c10::IValue& v) { return v.isTensor() && at::isFloatingType(v.toTensor().scalar_type()); }
// The largest |x| of a tensor argument: infinite where one is not finite, 0 where it is empty.
double abs_max(const c10::IValue& v) {
  at::Tensor d = v.toTensor().to(at::kDouble);
  if (d.numel() == 0) return 0.0;
  if (!d.isfinite().all().item<bool>()) return static_cast<double>(INFINITY);
  return d.abs().max().item<double>();
}
// The smallest |x + shift| of a tensor argument, NaNs left out; infinite where it is empty.
double min_abs(const c10::IValue& v, double shift) {
  at::Tensor d = (v.toTensor().to(at::kDouble) + shift).abs();
  d = at::where(d.isnan(), at::full_like(d, INFINITY), d);  // NaN would hide a zero from min()
  return d.numel() == 0 ? static_cast<double>(INFINITY) : d.min().item<double>();
}

// What the preconditions read of an op's float tensor arguments and their flags.
struct ArgFacts {
  bool any_inexact = false, float_in = false, zero_sign = false;
  std::vector<bool> arg_inexact;  // per argument: a float tensor flagged inexact
};

ArgFacts arg_facts(const std::vector<c10::IValue>& stack, const std::vector<uint8_t>& arg_flags) {
  ArgFacts f;
  f.arg_inexact.assign(stack.size(), false);
  for (size_t i = 0; i < stack.size(); ++i) {
    if (!is_float_tensor(stack[i])) continue;
    f.float_in = true;
    f.arg_inexact[i] = i < arg_flags.size() && (arg_flags[i] & kInexact);
    f.any_inexact = f.any_inexact || f.arg_inexact[i];
    f.zero_sign = f.zero_sign || (i < arg_flags.size() && (arg_flags[i] & kZeroSignUnspecified));
  }
  return f;
}

// The preconditions on an op's arguments (Note [The fuzzer's oracle and ill-conditioned cases]):
// discontinuous functions, casts to integers, integer division, domains and singularities, zeros of
// unspecified sign. False where the op breaks one.
bool arguments_ok(const std::string& schema, const OpInfo& op, const std::vector<c10::IValue>& stack,
                  const std::vector<uint8_t>& arg_flags, const ArgFacts& facts) {
  const std::string& fn = op.kernel_fn;
  const bool any_inexact = facts.any_inexact, float_in = facts.float_in, zero_sign = facts.zero_sign;
  const std::vector<bool>& arg_inexact = facts.arg_inexact;
  // Discontinuous functions of floats take exact values only.
  int target = -1;
  if (schema == "aten::to.dtype" && stack.size() > 1 && stack[1].isInt()) target = static_cast<int>(stack[1].toInt());
  if (schema == "aten::type_as" && stack.size() > 1 && stack[1].isTensor())
    target = static_cast<int>(stack[1].toTensor().scalar_type());
  bool to_int = target >= 0 && (is_int_code(target) || target == 11);
  const bool int_division = op.has(OpFlag::kIntegerDivision);  // remainder, fmod, div with a rounding mode
  bool discontinuous = op.has(OpFlag::kDiscontinuous) || to_int;
  if (discontinuous && any_inexact) return false;
  if (to_int && float_in) {
    static const double bounds[] = {255, 127, 32767, 2147483647.0, 9.2e18};
    if (target != 11 && abs_max(stack[0]) >= bounds[target]) return false;
  }
  if (float_in && int_division) {
    at::Tensor a = stack[0].toTensor().to(at::kDouble);
    at::Tensor b = stack[1].isTensor() ? stack[1].toTensor().to(at::kDouble) : at::scalar_tensor(stack[1].toScalar().toDouble(), at::kDouble);
    if (!a.isfinite().all().item<bool>() || !b.isfinite().all().item<bool>() || b.eq(0).any().item<bool>()) return false;
    // Operands that do not broadcast are eager's to reject (the op raises), not this check's.
    try {
      at::infer_size(a.sizes(), b.sizes());
    } catch (const c10::Error&) {
      return true;
    }
    if (a.numel() && b.numel() && (a / b).abs().max().item<double>() >= 4194304.0) return false;
  }
  if (float_in && in_set(fn, {"sin", "cos", "tan"}) && abs_max(stack[0]) >= 1e4) return false;
  if (fn == "tan" && any_inexact) return false;
  if (any_inexact && in_set(fn, {"exp", "exp2", "expm1", "sigmoid", "silu", "mish", "softplus", "elu", "sin", "cos"}) &&
      abs_max(stack[0]) >= 4)
    return false;
  if (fn == "pow" && stack.size() > 1 && stack[1].isTensor() && arg_inexact.size() > 1 && arg_inexact[1] &&
      stack[0].isTensor() && stack[0].toTensor().numel() && stack[0].toTensor().to(at::kDouble).lt(0).any().item<bool>())
    return false;
  if (any_inexact && fn == "pow") {
    double e = stack[1].isTensor() ? abs_max(stack[1]) : std::abs(stack[1].toScalar().toDouble());
    if (!(e <= 4)) return false;
  }
  // Singularities and domain edges at 0 (x/0, log 0, sqrt of -0.0 versus -1e-45): inexact values must
  // keep clear of them, or a last-ulp difference moves a NaN or an Inf.
  if (any_inexact) {
    size_t arg = in_set(fn, {"div", "remainder", "fmod"}) ? 1 : fn == "addcdiv" ? 2 : 0;
    bool singular = in_set(fn, {"div", "addcdiv", "reciprocal", "rsqrt", "sqrt", "log", "log2", "log1p", "pow"});
    if (singular && arg < stack.size() && stack[arg].isTensor() && arg < arg_inexact.size() && arg_inexact[arg] &&
        min_abs(stack[arg], fn == "log1p" ? 1.0 : 0.0) < 1e-6)
      return false;
  }
  if (schema == "aten::gelu" && stack.size() > 1 && stack[1].isString() && stack[1].toStringRef() == "none" &&
      std::isinf(abs_max(stack[0])))
    return false;
  // gelu computes 1 + erf(x / sqrt 2) (1 + tanh(...) in its tanh form), a sum that cancels for x < 0, of
  // exact x too: below -3.29 it loses over 1000x, and eager's own float32 gelu is off by 1e-3 and more
  // relatively (its vectorized erf is a few ulps off near -1). Below -5.8 both give -0.
  if (fn == "gelu" && is_float_tensor(stack[0]) && stack[0].toTensor().scalar_type() != at::kDouble) {
    at::Tensor x = stack[0].toTensor().to(at::kDouble);
    if (at::logical_and(x.gt(-5.8), x.lt(-3.29)).any().item<bool>()) return false;
  }
  // The sign of a zero from min/max-like ops is unspecified (eager's vector and scalar loops differ); ops
  // that turn it into an infinity of either sign must not see such zeros.
  if (zero_sign) {
    size_t base = fn == "div" ? 1 : fn == "addcdiv" ? 2 : 0;
    bool sensitive = in_set(fn, {"div", "addcdiv", "reciprocal", "rsqrt", "pow"});
    if (sensitive && base < stack.size() && stack[base].isTensor() && base < arg_flags.size() &&
        (arg_flags[base] & kZeroSignUnspecified) && min_abs(stack[base], 0.0) == 0)
      return false;
  }
  // Integer division of the type's minimum by -1 traps in eager (SIGFPE): keep the minimum away from it.
  if (!float_in && stack.size() > 1 && int_division && stack[0].isTensor()) {
    const at::Tensor& a = stack[0].toTensor();
    if (a.numel() && a.scalar_type() != at::kBool && a.to(at::kDouble).min().item<double>() <= -2147483648.0) return false;
  }
  return true;
}

// The preconditions on an op's result: no overflow that depends on eager's loop (float16/bfloat16 with
// alpha != 1: `scaled` and `summed`, where defined), no cancellation against its summands (`float_args`),
// no transcendental result within a factor of 2 of its dtype's largest value.
bool result_ok(const at::Tensor& result, const at::Tensor& scaled, const at::Tensor& summed,
               const std::vector<at::Tensor>& float_args, bool exact_op) {
  if (scaled.defined() && (result.scalar_type() == at::kHalf || result.scalar_type() == at::kBFloat16)) {
    double half_max = (result.scalar_type() == at::kHalf ? 65504.0 : 3.3895313892515355e38) / 2;
    if (at::logical_or(at::logical_and(scaled.isfinite(), scaled.gt(half_max)),
                       at::logical_and(summed.isfinite(), summed.gt(half_max)))
            .any()
            .item<bool>())
      return false;
  }
  if (!float_args.empty() && result.numel() > 0) {
    at::Tensor big = at::zeros_like(result, at::kDouble);
    for (const auto& a : float_args) big = at::maximum(big, at::where(a.isnan(), at::zeros_like(a), a).expand_as(big));
    at::Tensor r = result.to(at::kDouble).abs();
    at::Tensor lost = at::logical_and(big.isfinite(), r.lt(big * 1e-3));
    if (lost.any().item<bool>()) return false;
  }
  bool is_float_out = at::isFloatingType(result.scalar_type());
  // A transcendental result within a factor of 2 of the dtype's largest value may overflow in one
  // library and not in the other.
  if (is_float_out && !exact_op && result.numel() > 0) {
    double limit = result.scalar_type() == at::kHalf ? 65504.0 : result.scalar_type() == at::kDouble ? 1.7e308 : 3.4e38;
    at::Tensor r = result.to(at::kDouble).abs();
    if (at::logical_and(r.isfinite(), r.gt(limit / 2)).any().item<bool>()) return false;
  }
  return true;
}

// The flags of an op's result (Note [The fuzzer's oracle and ill-conditioned cases]).
uint8_t result_flags(const std::string& fn, const at::Tensor& result, const std::vector<uint8_t>& arg_flags,
                     const ArgFacts& facts, bool exact_op) {
  const bool any_inexact = facts.any_inexact, zero_sign = facts.zero_sign;
  bool is_float_out = at::isFloatingType(result.scalar_type());
  bool makes_zero_sign = in_set(fn, {"minimum", "maximum", "clamp", "clamp_min", "clamp_max", "hardtanh", "relu",
                                     "where", "masked_fill"});
  int prec = 0;
  for (uint8_t f : arg_flags) prec = std::max(prec, f >> 2);  // (the stack holds the result by now)
  bool inexact_out = is_float_out && (any_inexact || !exact_op);
  if (inexact_out && !exact_op) prec = std::max(prec, precision_class(result.scalar_type()));
  return static_cast<uint8_t>((inexact_out ? kInexact : 0) |
                              (is_float_out && (zero_sign || makes_zero_sign) && fn != "abs" ? kZeroSignUnspecified : 0) |
                              (inexact_out ? prec << 2 : 0));
}

}  // namespace

bool eager_op(const std::string& schema, std::vector<c10::IValue>& stack, const std::vector<uint8_t>& arg_flags,
              uint8_t* out_flags, bool check_preconditions) {
  if (is_structural_schema(schema)) return eager_structural(schema, stack, arg_flags, out_flags, check_preconditions);
  // An in-place op follows the rules of its out-of-place form (its result is the mutated self).
  std::string base = inplace_base(schema);
  const OpInfo* op = find_op(base.empty() ? schema : base);
  if (!op) return false;
  if (!check_preconditions) {
    // The float64 reference replays a recipe already accepted: its values differ, its preconditions
    // were checked on the real ones.
    try {
      call_schema(schema, stack);
    } catch (const std::exception&) {
      return false;
    }
    *out_flags = 0;
    return stack.size() == 1 && stack[0].isTensor();
  }
  const std::string& fn = op->kernel_fn;
  const ArgFacts facts = arg_facts(stack, arg_flags);
  if (!arguments_ok(schema, *op, stack, arg_flags, facts)) return false;
  // Cancellation: a difference of inexact values that is far smaller than its operands has lost their
  // accuracy (a relative error of ulps becomes one of thousands of ulps); it is not generated.
  std::vector<at::Tensor> float_args;
  if (facts.any_inexact) {
    try {
      float_args = summands(fn, stack);
    } catch (const std::exception&) {
      return false;  // shapes that do not broadcast: eager rejects the op too
    }
  }
  // ATen contracts a + alpha * b into an FMA when alpha != 1: exact only with alpha 1.
  bool alpha_one = stack.size() > 2 && stack[2].isScalar() && stack[2].toScalar().toDouble() == 1.0;
  // With alpha != 1, eager's float16/bfloat16 scalar loop (short tensors, loop tails) rounds alpha * b to
  // the dtype before adding (c10::Half * c10::Half is a Half), its vector loop computes a + alpha * b in
  // float (vec::fmadd): where alpha * b overflows the dtype one gives an infinity and the other not.
  at::Tensor scaled, summed;  // |alpha * b| and |a| + |alpha * b|, checked once the result's dtype is known
  if (in_set(fn, {"add", "sub", "rsub"}) && !alpha_one && stack.size() > 2 && stack[2].isScalar()) {
    const at::Device device = device_of(stack);
    size_t b = fn == "rsub" ? 0 : 1;  // rsub(a, b, alpha) = b - alpha * a
    try {
      scaled = (double_arg(stack[b], device) * stack[2].toScalar().toDouble()).abs();
      summed = double_arg(stack[1 - b], device).abs() + scaled;
    } catch (const std::exception&) {
      return false;  // shapes that do not broadcast: eager rejects the op too
    }
  }
  try {
    call_schema(schema, stack);
  } catch (const std::exception&) {
    return false;
  }
  if (stack.size() != 1 || !stack[0].isTensor()) return false;
  const at::Tensor& result = stack[0].toTensor();
  const bool exact_op = op->has(OpFlag::kExact) || (in_set(fn, {"add", "sub", "rsub"}) && alpha_one);
  if (!result_ok(result, scaled, summed, float_args, exact_op)) return false;
  *out_flags = result_flags(fn, result, arg_flags, facts, exact_op);
  return true;
}

bool replay(const Recipe& r, const std::vector<at::Tensor>& inputs, bool to64, Graph* g, Replay* out,
            const Replay* eager) {
  out->values.clear();
  out->flags.clear();
  out->ir.clear();
  for (const auto& t : inputs) {
    at::Tensor x = to64 && at::isFloatingType(t.scalar_type()) ? t.to(at::kDouble) : t;
    out->values.push_back(x);
    out->flags.push_back(0);
    if (g) out->ir.push_back(g->add_input(ValueType{tensor_type_of(x), ""}));
  }
  for (size_t j = 0; j < r.ops.size(); ++j) {
    const OpSpec& op = r.ops[j];
    std::vector<c10::IValue> stack;
    std::vector<uint8_t> flags;
    std::vector<Arg> args;
    const OpInfo* info = find_op(op.schema);
    bool widen = to64 && info && (info->rule == DTypeRule::kFloat || info->rule == DTypeRule::kDivMode);
    for (size_t i = 0; i < op.args.size(); ++i) {
      const auto& a = op.args[i];
      flags.push_back(a.value >= 0 ? out->flags.at(static_cast<size_t>(a.value)) : 0);
      if (a.value >= 0) {
        at::Tensor v = out->values.at(static_cast<size_t>(a.value));
        // The float64 reference computes ops that turn integers into float32 in float64 too.
        if (widen && !at::isFloatingType(v.scalar_type())) v = v.to(at::kDouble);
        stack.emplace_back(v);
        if (g) args.push_back(Arg::of(out->ir.at(static_cast<size_t>(a.value))));
        continue;
      }
      Literal l = a.literal;
      if (to64 && op.schema == "aten::to.dtype" && i == 1 && is_float_code(static_cast<int>(std::get<SymInt>(l))))
        l = int64_t{7};
      stack.push_back(literal_to_ivalue(l));
      if (g) args.push_back(Arg::lit(l));
    }
    if (g && is_cat_schema(op.schema) && !args.empty()) {
      // The items as one list node (eager_structural makes the list of the tensors).
      std::vector<Arg> item_args(args.begin(), args.end() - 1);
      Node* list = g->append("prim::ListConstruct", std::move(item_args), {ValueType{std::nullopt, "Tensor[]"}});
      args = {Arg::of(list->output()), args.back()};
    }
    uint8_t res_flags = 0;
    if (to64 && eager && is_random_schema(op.schema)) {
      out->values.push_back(eager->values.at(inputs.size() + j).to(at::kDouble));
      out->flags.push_back(0);
      continue;
    }
    if (!eager_op(op.schema, stack, flags, &res_flags, !to64)) return false;
    at::Tensor res = stack[0].toTensor();
    // An in-place op changed its self: later uses see the new value.
    if (!inplace_base(op.schema).empty() && !op.args.empty() && op.args[0].value >= 0)
      out->flags.at(static_cast<size_t>(op.args[0].value)) = res_flags;
    if (to64 && at::isFloatingType(res.scalar_type()) && res.scalar_type() != at::kDouble &&
        !(info && info->rule == DTypeRule::kCastArg))
      res = res.to(at::kDouble);
    out->values.push_back(res);
    out->flags.push_back(res_flags);
    if (g) {
      Node* n = g->append(op.schema, std::move(args), {ValueType{tensor_type_of(res), ""}});
      // Marked as the torch adapter marks a captured graph (random ops): passes and fusion leave them
      // alone and in order, so they draw eager's numbers.
      if (is_random_schema(op.schema)) mark_side_effects(*g);
      out->ir.push_back(n->output());
    }
  }
  return true;
}

}  // namespace fusion_jit::fuzz
