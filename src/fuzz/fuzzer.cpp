#include "fuzz/fuzzer.h"
#include "support/options.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "fusion_jit/cache.h"
#include "fusion_jit/fusion_jit.h"
#include "ir/op_table.h"
#include "passes/passes.h"
#include "runtime/plan.h"
#include "support/error.h"
#include "targets/cuda/nvrtc.h"  // the NVRTC check: ptxas's spill report
#include "torch/executor.h"
#include "torch/tolerance.h"

namespace fusion_jit::fuzz {
namespace {

using Rng = std::mt19937_64;

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

// The torch generator's seed for a recipe's random ops: set before generation, before its eager replay
// and before its fused run.
uint64_t draw_seed(uint64_t recipe_seed) { return mix(recipe_seed, 0x5EED) >> 1; }

int uniform(Rng& r, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(r); }
bool chance(Rng& r, double p) { return std::uniform_real_distribution<double>(0, 1)(r) < p; }
template <class T>
const T& pick(Rng& r, const std::vector<T>& v) {
  return v[static_cast<size_t>(uniform(r, 0, static_cast<int>(v.size()) - 1))];
}

bool is_float_code(int c) { return c == 5 || c == 6 || c == 7 || c == 15; }
bool is_int_code(int c) { return c == 0 || c == 1 || c == 2 || c == 3 || c == 4; }

// Dense values of an input, deterministic from its spec.
at::Tensor dense_values(const InputSpec& s) {
  Rng r(s.value_seed);
  int64_t n = 1;
  for (auto d : s.sizes) n *= d;
  auto st = static_cast<at::ScalarType>(s.dtype);
  if (is_float_code(s.dtype)) {
    std::normal_distribution<double> nd(0, 3);
    static const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e30, -1e30, 1e-30, 65504.0, 0.5};
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = s.specials && chance(r, 0.12) ? specials[uniform(r, 0, 9)] : nd(r);
    return at::tensor(v, at::kDouble).reshape(s.sizes).to(st);
  }
  if (s.dtype == 11) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = uniform(r, 0, 1);
    return at::tensor(v, at::kLong).reshape(s.sizes).to(at::kBool);
  }
  int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  if (s.dtype == 3) lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  if (s.dtype == 0) lo = 0, hi = 255;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = s.specials && chance(r, 0.05) ? (chance(r, 0.5) ? lo : hi) : uniform(r, s.dtype == 0 ? 0 : -10, 10);
  return at::tensor(v, at::kLong).reshape(s.sizes).to(st);
}

at::Tensor make_input(const InputSpec& s) {
  at::Tensor v = dense_values(s);
  int64_t nd = static_cast<int64_t>(s.sizes.size());
  switch (s.layout) {
    case Layout::kContiguous:
      return v;
    case Layout::kTransposed:
      if (nd < 2) return v;
      return v.transpose(-1, -2).contiguous().transpose(-1, -2);
    case Layout::kSliced: {
      std::vector<int64_t> big = s.sizes;
      for (auto& d : big) d += 2;
      at::Tensor base = at::zeros(big, v.options());
      at::Tensor view = base;
      for (int64_t d = 0; d < nd; ++d) view = view.narrow(d, 1, s.sizes[d]);
      if (nd == 0) view = base.view({1}).narrow(0, 0, 1).view({});
      view.copy_(v);
      return view;
    }
    case Layout::kExpanded: {
      for (int64_t d = 0; d < nd; ++d)
        if (s.sizes[d] > 1) return v.narrow(d, 0, 1).expand(s.sizes);
      return v;
    }
    case Layout::kChannelsLast:
      if (nd != 4) return v;
      return v.contiguous(at::MemoryFormat::ChannelsLast);
    case Layout::kHugeStride: {
      // A [2, K] view whose second row lies 2^31 + 16 elements after the first: offsets need int64. Only
      // the view's pages are ever touched. Data starts 2^31 elements into the storage, so that int32
      // offsets wrapping around land inside it (and read untouched zeros) instead of crashing.
      FJ_INTERNAL_ASSERT(nd == 2 && s.sizes[0] == 2 && (s.dtype == 11 || s.dtype == 0));
      const int64_t row = (int64_t{1} << 31) + 16, start = int64_t{1} << 31;
      at::Tensor base = at::empty({start + row + s.sizes[1] + 64}, v.options());
      at::Tensor view = base.as_strided(s.sizes, {row, 1}, start);
      view.copy_(v);
      return view;
    }
  }
  return v;
}

std::vector<int64_t> broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b, bool* ok) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  *ok = true;
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) *ok = false;
    out[n - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

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

// Per-value flags. Bits 2-3 hold the coarsest precision an inexact value was computed in:
// 1 float64, 2 float32, 3 float16/bfloat16 (its ulps bound how far two correct libraries may drift).
enum : uint8_t { kInexact = 1, kZeroSignUnspecified = 2 };
int precision_class(at::ScalarType t) {
  return t == at::kDouble ? 1 : (t == at::kHalf || t == at::kBFloat16) ? 3 : 2;
}
double class_eps(int c) { return c == 1 ? 0x1p-52 : c == 3 ? 0x1p-7 : 0x1p-23; }

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
// cat and stack: a recipe gives their items as value arguments before the dim; the graph, eager and the
// TorchScript source take them as a list.
bool is_cat_schema(const std::string& s) { return s == "aten::cat" || s == "aten::stack"; }
bool is_gather_schema(const std::string& s) { return s == "aten::embedding" || s == "aten::gather"; }
bool is_structural_schema(const std::string& s) {
  return listed(reduction_schemas(), s) || listed(view_schemas(), s) || is_random_schema(s) || is_cat_schema(s) ||
         is_gather_schema(s);
}
// The out-of-place op of an in-place one ("aten::add_.Tensor" -> "aten::add.Tensor"), "" for others.
std::string inplace_base(const std::string& s) {
  size_t dot = s.find('.');
  size_t end = dot == std::string::npos ? s.size() : dot;
  if (end < 7 || s[end - 1] != '_' || s.compare(0, 6, "aten::") != 0 || s[end - 2] == '_') return "";
  return s.substr(0, end - 1) + s.substr(end);
}

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

bool eager_op(const std::string& schema, std::vector<c10::IValue>& stack, const std::vector<uint8_t>& arg_flags,
              uint8_t* out_flags, bool check_preconditions = true) {
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
  auto is_float_tensor = [](const c10::IValue& v) { return v.isTensor() && at::isFloatingType(v.toTensor().scalar_type()); };
  auto abs_max = [](const c10::IValue& v) {
    at::Tensor d = v.toTensor().to(at::kDouble);
    if (d.numel() == 0) return 0.0;
    if (!d.isfinite().all().item<bool>()) return static_cast<double>(INFINITY);
    return d.abs().max().item<double>();
  };
  bool any_inexact = false, float_in = false, zero_sign = false;
  std::vector<bool> arg_inexact(stack.size(), false);
  for (size_t i = 0; i < stack.size(); ++i) {
    if (!is_float_tensor(stack[i])) continue;
    float_in = true;
    arg_inexact[i] = i < arg_flags.size() && (arg_flags[i] & kInexact);
    any_inexact = any_inexact || arg_inexact[i];
    zero_sign = zero_sign || (i < arg_flags.size() && (arg_flags[i] & kZeroSignUnspecified));
  }
  // Discontinuous functions of floats take exact values only.
  int target = -1;
  if (schema == "aten::to.dtype" && stack.size() > 1 && stack[1].isInt()) target = static_cast<int>(stack[1].toInt());
  if (schema == "aten::type_as" && stack.size() > 1 && stack[1].isTensor())
    target = static_cast<int>(stack[1].toTensor().scalar_type());
  bool to_int = target >= 0 && (is_int_code(target) || target == 11);
  const bool int_division = op->has(OpFlag::kIntegerDivision);  // remainder, fmod, div with a rounding mode
  bool discontinuous = op->has(OpFlag::kDiscontinuous) || to_int;
  if (discontinuous && any_inexact) return false;
  if (to_int && float_in) {
    static const double bounds[] = {255, 127, 32767, 2147483647.0, 9.2e18};
    if (target != 11 && abs_max(stack[0]) >= bounds[target]) return false;
  }
  if (float_in && int_division) {
    at::Tensor a = stack[0].toTensor().to(at::kDouble);
    at::Tensor b = stack[1].isTensor() ? stack[1].toTensor().to(at::kDouble) : at::scalar_tensor(stack[1].toScalar().toDouble(), at::kDouble);
    if (!a.isfinite().all().item<bool>() || !b.isfinite().all().item<bool>() || b.eq(0).any().item<bool>()) return false;
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
  auto min_abs = [](const c10::IValue& v, double shift) {
    at::Tensor d = (v.toTensor().to(at::kDouble) + shift).abs();
    d = at::where(d.isnan(), at::full_like(d, INFINITY), d);  // NaN would hide a zero from min()
    return d.numel() == 0 ? static_cast<double>(INFINITY) : d.min().item<double>();
  };
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
  // Cancellation: a difference of inexact values that is far smaller than its operands has lost their
  // accuracy (a relative error of ulps becomes one of thousands of ulps); it is not generated.
  std::vector<at::Tensor> float_args;
  if (any_inexact) {
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
  bool exact_op = op->has(OpFlag::kExact) || (in_set(fn, {"add", "sub", "rsub"}) && alpha_one);
  bool is_float_out = at::isFloatingType(stack[0].toTensor().scalar_type());
  // A transcendental result within a factor of 2 of the dtype's largest value may overflow in one
  // library and not in the other.
  if (is_float_out && !exact_op && result.numel() > 0) {
    double limit = result.scalar_type() == at::kHalf ? 65504.0 : result.scalar_type() == at::kDouble ? 1.7e308 : 3.4e38;
    at::Tensor r = result.to(at::kDouble).abs();
    if (at::logical_and(r.isfinite(), r.gt(limit / 2)).any().item<bool>()) return false;
  }
  bool makes_zero_sign = in_set(fn, {"minimum", "maximum", "clamp", "clamp_min", "clamp_max", "hardtanh", "relu",
                                     "where", "masked_fill"});
  int prec = 0;
  for (uint8_t f : arg_flags) prec = std::max(prec, f >> 2);  // (the stack holds the result by now)
  bool inexact_out = is_float_out && (any_inexact || !exact_op);
  if (inexact_out && !exact_op) prec = std::max(prec, precision_class(result.scalar_type()));
  *out_flags = static_cast<uint8_t>((inexact_out ? kInexact : 0) |
                                    (is_float_out && (zero_sign || makes_zero_sign) && fn != "abs" ? kZeroSignUnspecified : 0) |
                                    (inexact_out ? prec << 2 : 0));
  return true;
}

// Eager evaluation of a recipe; optionally builds its IR graph into `g` (appending inputs and nodes) and
// optionally in float64. Returns false when eager rejects an op.
struct Replay {
  std::vector<at::Tensor> values;  // inputs, then op results
  std::vector<uint8_t> flags;      // per value: see Note [The fuzzer's oracle and ill-conditioned cases]
  std::vector<Value*> ir;          // the same, in `g`
};

// `eager`: in the float64 replay, random ops take the values the eager replay drew (a float64 draw would
// give other numbers).
bool replay(const Recipe& r, const std::vector<at::Tensor>& inputs, bool to64, Graph* g, Replay* out,
            const Replay* eager = nullptr) {
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

// The ops the generator draws from: the table's elementwise ops, except those with per-channel arguments
// (batch_norm's need values of their channel count: make_batch_norm).
const std::vector<const OpInfo*>& fuzz_ops() {
  static const std::vector<const OpInfo*> ops = [] {
    std::vector<const OpInfo*> v;
    for (const auto& op : all_ops()) {
      bool channel = false;
      for (const ArgSpec& a : op.args) channel = channel || a.kind == ArgKind::kChannel;
      if (op.category == OpCategory::kElementwise && !channel) v.push_back(&op);
    }
    return v;
  }();
  return ops;
}

Literal random_scalar(Rng& r, bool integral_only) {
  static const std::vector<double> doubles = {0.5, 2.0, -1.5, 1e-3, 100.0, -0.25, 3.0};
  static const std::vector<int64_t> ints = {0, 1, -1, 2, 3, -2, 7};
  if (integral_only || chance(r, 0.4)) return pick(r, ints);
  return pick(r, doubles);
}

// The largest result an elementwise op may broadcast to (the largest input shape has 32770 elements).
constexpr int64_t kMaxBroadcastNumel = 65536;

RecipeArg value_arg(int v) {
  RecipeArg a;
  a.value = v;
  return a;
}
RecipeArg lit_arg(Literal l) {
  RecipeArg a;
  a.literal = std::move(l);
  return a;
}

// A recent value (60%) or any, among those `ok` accepts; -1 when none.
int pick_value(Rng& r, const std::vector<at::Tensor>& vals, const std::function<bool(const at::Tensor&)>& ok) {
  std::vector<int> cands;
  for (int v = 0; v < static_cast<int>(vals.size()); ++v)
    if (ok(vals[static_cast<size_t>(v)])) cands.push_back(v);
  if (cands.empty()) return -1;
  return chance(r, 0.6) ? cands.back() : pick(r, cands);
}

// A dim of an nd-dim tensor, negative half of the time.
int64_t random_dim(Rng& r, int64_t nd) {
  int64_t d = uniform(r, 0, static_cast<int>(nd) - 1);
  return chance(r, 0.5) ? d - nd : d;
}

// A reduction or normalization over random dims (keepdim or not) of a value of rank >= 1.
std::optional<OpSpec> make_reduction(Rng& r, const std::vector<at::Tensor>& vals) {
  int v = pick_value(r, vals, [](const at::Tensor& t) { return t.dim() >= 1; });
  if (v < 0) return std::nullopt;
  int64_t nd = vals[static_cast<size_t>(v)].dim();
  const auto sizes = vals[static_cast<size_t>(v)].sizes().vec();
  OpSpec s;
  s.schema = pick(r, reduction_schemas());
  std::vector<int64_t> all(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) all[static_cast<size_t>(d)] = d;
  std::shuffle(all.begin(), all.end(), r);
  std::vector<int64_t> dims(all.begin(), all.begin() + uniform(r, 1, static_cast<int>(nd)));
  std::sort(dims.begin(), dims.end());
  for (auto& d : dims)
    if (chance(r, 0.3)) d -= nd;
  bool keep = chance(r, 0.5);
  s.args.push_back(value_arg(v));
  if (s.schema == "aten::sum.dim_IntList" || s.schema == "aten::mean.dim") {
    s.args.insert(s.args.end(), {lit_arg(dims), lit_arg(keep), lit_arg(None{})});
  } else if (s.schema == "aten::amax") {
    s.args.insert(s.args.end(), {lit_arg(dims), lit_arg(keep)});
  } else if (s.schema == "aten::var.correction") {
    // No correction at or past the reduced count (eager warns and returns inf or NaN).
    int64_t count = 1;
    for (int64_t d : dims) count *= sizes[static_cast<size_t>(d < 0 ? d + nd : d)];
    if (count == 0) return std::nullopt;
    int64_t correction = count > 1 && chance(r, 0.5) ? 1 : 0;
    s.args.insert(s.args.end(), {lit_arg(dims), lit_arg(correction), lit_arg(keep)});
  } else if (s.schema == "aten::softmax.int" || s.schema == "aten::log_softmax.int") {
    s.args.insert(s.args.end(), {lit_arg(random_dim(r, nd)), lit_arg(None{})});
  } else {
    int k = uniform(r, 1, std::min<int>(2, static_cast<int>(nd)));
    std::vector<int64_t> shape(sizes.end() - k, sizes.end());
    if (s.schema == "aten::layer_norm")
      s.args.insert(s.args.end(), {lit_arg(shape), lit_arg(None{}), lit_arg(None{}), lit_arg(chance(r, 0.5) ? 1e-5 : 1e-3),
                                   lit_arg(true)});
    else
      s.args.insert(s.args.end(), {lit_arg(shape), lit_arg(None{}), lit_arg(None{})});
  }
  return s;
}

// A cat or stack of 2 or 3 values of one shape and dtype (a value may come twice), along a random dim.
std::optional<OpSpec> make_cat(Rng& r, const std::vector<at::Tensor>& vals) {
  int v = pick_value(r, vals, [](const at::Tensor& t) { return t.dim() >= 1 && t.numel() > 0 && t.numel() <= 32768; });
  if (v < 0) return std::nullopt;
  const at::Tensor& x = vals[static_cast<size_t>(v)];
  OpSpec s;
  const bool stack = chance(r, 0.5);
  s.schema = stack ? "aten::stack" : "aten::cat";
  const int nd = static_cast<int>(x.dim()) + (stack ? 1 : 0);
  const int64_t dim = uniform(r, -nd, nd - 1), along = dim < 0 ? dim + nd : dim;
  // Items of x's dtype and shape; for cat, of any size along the dim (Note [Cats of unequal items]).
  std::vector<int> like;
  int64_t widest = x.numel();
  for (int u = 0; u < static_cast<int>(vals.size()); ++u) {
    const at::Tensor& y = vals[static_cast<size_t>(u)];
    bool ok = y.scalar_type() == x.scalar_type() && y.dim() == x.dim() && y.numel() > 0 && y.numel() <= 32768;
    for (int64_t d = 0; ok && d < x.dim(); ++d) ok = y.size(d) == x.size(d) || (!stack && d == along);
    if (!ok) continue;
    like.push_back(u);
    widest = std::max<int64_t>(widest, y.numel());
  }
  const int k = widest * 3 <= kMaxBroadcastNumel ? uniform(r, 2, 3) : 2;
  for (int i = 0; i < k; ++i) s.args.push_back(value_arg(i == 0 ? v : pick(r, like)));
  s.args.push_back(lit_arg(dim));
  return s;
}

// An embedding of the rows of a 2-d value by an integer value whose entries all lie within them, or its
// gather along dim 0 by 2-d such indices (Note [Gathered loads]); without one, the remainder of an integer
// value by the row count (in [0, rows)), which a later draw may take as the indices.
std::optional<OpSpec> make_gather(Rng& r, const std::vector<at::Tensor>& vals) {
  int t = pick_value(r, vals, [](const at::Tensor& x) { return x.dim() == 2 && x.size(0) > 0 && x.numel() <= 32768; });
  if (t < 0) return std::nullopt;
  const int64_t rows = vals[static_cast<size_t>(t)].size(0), cols = vals[static_cast<size_t>(t)].size(1);
  auto integer = [&](const at::Tensor& x) {
    return (x.scalar_type() == at::kLong || x.scalar_type() == at::kInt) && x.numel() > 0 &&
           x.numel() * std::max<int64_t>(cols, 1) <= kMaxBroadcastNumel;
  };
  OpSpec s;
  int i = pick_value(r, vals, [&](const at::Tensor& x) {
    return integer(x) && x.min().item<int64_t>() >= 0 && x.max().item<int64_t>() < rows;
  });
  if (i < 0) {
    int u = pick_value(r, vals, integer);
    if (u < 0) return std::nullopt;
    s.schema = "aten::remainder.Scalar";
    s.args = {value_arg(u), lit_arg(rows)};
    return s;
  }
  // 2-d indices no wider than the table: at times its elements along dim 0 (aten::gather).
  const at::Tensor& index = vals[static_cast<size_t>(i)];
  if (index.dim() == 2 && index.size(1) <= cols && chance(r, 0.5)) {
    s.schema = "aten::gather";
    s.args = {value_arg(t), lit_arg(int64_t{0}), value_arg(i), lit_arg(false)};
    return s;
  }
  s.schema = "aten::embedding";
  s.args = {value_arg(t), value_arg(i), lit_arg(int64_t{-1}), lit_arg(false), lit_arg(false)};
  return s;
}

// batch_norm in inference mode (GenOptions::batch_norms): a float value x of rank >= 2 and 1-d values of
// x's channel count (dim 1) and dtype as its weight, bias (each at times None), running mean and running
// variance (one with no negative element where there is one), x mostly one that has such values. Without
// them, one for a later draw: the mean of x over every dim but 1.
std::optional<OpSpec> make_batch_norm(Rng& r, const std::vector<at::Tensor>& vals) {
  auto is_input = [](const at::Tensor& t) { return t.dim() >= 2 && at::isFloatingType(t.scalar_type()) && t.size(1) > 0; };
  auto has_channels = [&](const at::Tensor& t) {
    for (const at::Tensor& c : vals)
      if (c.dim() == 1 && c.size(0) == t.size(1) && c.scalar_type() == t.scalar_type()) return true;
    return false;
  };
  // Mostly a value whose per-channel arguments exist (an earlier draw's mean, often).
  int x = chance(r, 0.75) ? pick_value(r, vals, [&](const at::Tensor& t) { return is_input(t) && has_channels(t); }) : -1;
  if (x < 0) x = pick_value(r, vals, is_input);
  if (x < 0) return std::nullopt;
  const at::Tensor& xv = vals[static_cast<size_t>(x)];
  std::vector<int> per_channel, variances;
  for (int v = 0; v < static_cast<int>(vals.size()); ++v) {
    const at::Tensor& t = vals[static_cast<size_t>(v)];
    if (t.dim() != 1 || t.size(0) != xv.size(1) || t.scalar_type() != xv.scalar_type()) continue;
    per_channel.push_back(v);
    if (t.min().item<double>() >= 0) variances.push_back(v);  // (false where it holds a NaN)
  }
  OpSpec s;
  if (per_channel.empty()) {
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < xv.dim(); ++d)
      if (d != 1) dims.push_back(d);
    s.schema = "aten::mean.dim";
    s.args = {value_arg(x), lit_arg(dims), lit_arg(false), lit_arg(None{})};
    return s;
  }
  // (Without a value free of negative elements, any: eager's result is NaN in those channels, and so
  // must ours be.)
  if (variances.empty()) variances = per_channel;
  auto optional = [&](double p) { return chance(r, p) ? lit_arg(None{}) : value_arg(pick(r, per_channel)); };
  s.schema = "aten::batch_norm";
  s.args = {value_arg(x), optional(0.2), optional(0.2), value_arg(pick(r, per_channel)), value_arg(pick(r, variances)),
            lit_arg(false), lit_arg(0.1), lit_arg(1e-5), lit_arg(false)};
  return s;
}

// A view or reshape of a value.
std::optional<OpSpec> make_view(Rng& r, const std::vector<at::Tensor>& vals) {
  int v = pick_value(r, vals, [](const at::Tensor&) { return true; });
  if (v < 0) return std::nullopt;
  const auto sizes = vals[static_cast<size_t>(v)].sizes().vec();
  int64_t nd = static_cast<int64_t>(sizes.size());
  OpSpec s;
  s.schema = pick(r, view_schemas());
  s.args.push_back(value_arg(v));
  if (s.schema == "aten::view" || s.schema == "aten::reshape") {
    std::vector<int64_t> shape = sizes;
    int how = uniform(r, 0, 2);
    if (how == 0 && nd >= 2) {  // merge two neighbours
      size_t i = static_cast<size_t>(uniform(r, 0, static_cast<int>(nd) - 2));
      shape[i] *= shape[i + 1];
      shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    } else if (how == 1 && nd >= 1) {  // split a dim
      size_t i = static_cast<size_t>(uniform(r, 0, static_cast<int>(nd) - 1));
      int64_t n = shape[i], f = 1;
      for (int64_t c : {2, 3, 4, 5, 7, 8})
        if (n % c == 0 && n > c) f = c;
      shape[i] = n / f;
      shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(i), f);
    } else {
      shape = {-1};
    }
    s.args.push_back(lit_arg(shape));
  } else if (s.schema == "aten::permute") {
    if (nd < 2) return std::nullopt;
    std::vector<int64_t> p(static_cast<size_t>(nd));
    for (int64_t d = 0; d < nd; ++d) p[static_cast<size_t>(d)] = d;
    std::shuffle(p.begin(), p.end(), r);
    s.args.push_back(lit_arg(p));
  } else if (s.schema == "aten::transpose.int") {
    if (nd < 2) return std::nullopt;
    s.args.insert(s.args.end(), {lit_arg(random_dim(r, nd)), lit_arg(random_dim(r, nd))});
  } else if (s.schema == "aten::expand") {
    std::vector<int64_t> shape = sizes;
    bool grown = false;
    for (auto& d : shape)
      if (d == 1 && !grown && chance(r, 0.7)) d = uniform(r, 2, 4), grown = true;
    if (!grown) shape.insert(shape.begin(), uniform(r, 2, 3));
    s.args.insert(s.args.end(), {lit_arg(shape), lit_arg(false)});
  } else if (s.schema == "aten::slice.Tensor") {
    if (nd < 1) return std::nullopt;
    int64_t d = random_dim(r, nd), n = sizes[static_cast<size_t>(d < 0 ? d + nd : d)];
    int64_t start = n > 0 ? uniform(r, 0, static_cast<int>(n) - 1) : 0;
    int64_t end = n > 0 ? uniform(r, static_cast<int>(start) + 1, static_cast<int>(n)) : 0;
    s.args.insert(s.args.end(), {lit_arg(d), lit_arg(start), lit_arg(end), lit_arg(int64_t{uniform(r, 1, 2)})});
  } else if (s.schema == "aten::select.int") {
    if (nd < 1) return std::nullopt;
    int64_t d = random_dim(r, nd), n = sizes[static_cast<size_t>(d < 0 ? d + nd : d)];
    if (n < 1) return std::nullopt;
    s.args.insert(s.args.end(), {lit_arg(d), lit_arg(int64_t{uniform(r, -static_cast<int>(n), static_cast<int>(n) - 1)})});
  } else if (s.schema == "aten::squeeze.dim") {
    if (nd < 1) return std::nullopt;
    int64_t d = random_dim(r, nd);
    for (int64_t k = 0; k < nd; ++k)
      if (sizes[static_cast<size_t>(k)] == 1 && chance(r, 0.7)) d = k;
    s.args.push_back(lit_arg(d));
  } else {  // unsqueeze
    int64_t d = uniform(r, 0, static_cast<int>(nd));
    s.args.push_back(lit_arg(chance(r, 0.3) ? d - nd - 1 : d));
  }
  return s;
}

// A random op over a float value.
std::optional<OpSpec> make_random(Rng& r, const std::vector<at::Tensor>& vals) {
  int v = pick_value(r, vals, [](const at::Tensor& t) { return at::isFloatingType(t.scalar_type()); });
  if (v < 0) return std::nullopt;
  OpSpec s;
  s.schema = pick(r, random_schemas());
  s.args.push_back(value_arg(v));
  if (s.schema == "aten::rand_like" || s.schema == "aten::randn_like") {
    for (int i = 0; i < 5; ++i) s.args.push_back(lit_arg(None{}));
  } else if (s.schema == "aten::bernoulli") {
    s.args.push_back(lit_arg(None{}));
  } else {
    static const std::vector<double> ps = {0.1, 0.5, 0.25};
    s.args.insert(s.args.end(), {lit_arg(pick(r, ps)), lit_arg(true)});
  }
  return s;
}

// An in-place op on input `in`.
std::optional<OpSpec> make_inplace(Rng& r, const std::vector<at::Tensor>& vals, int in) {
  const at::Tensor& x = vals[static_cast<size_t>(in)];
  OpSpec s;
  s.schema = pick(r, inplace_schemas());
  s.args.push_back(value_arg(in));
  const std::string base = inplace_base(s.schema);
  if (s.schema.find(".Tensor") != std::string::npos) {
    int v = pick_value(r, vals, [&](const at::Tensor& t) {
      bool ok = true;
      return broadcast_shapes(x.sizes().vec(), t.sizes().vec(), &ok) == x.sizes().vec() && ok;
    });
    if (v < 0) return std::nullopt;
    s.args.push_back(value_arg(v));
    if (s.schema != "aten::mul_.Tensor") s.args.push_back(lit_arg(int64_t{1}));
  } else if (s.schema == "aten::add_.Scalar" || s.schema == "aten::mul_.Scalar" || s.schema == "aten::clamp_min_") {
    s.args.push_back(lit_arg(random_scalar(r, !at::isFloatingType(x.scalar_type()))));
    if (s.schema == "aten::add_.Scalar") s.args.push_back(lit_arg(int64_t{1}));
  }
  return s;
}

}  // namespace

std::vector<at::Tensor> make_inputs(const Recipe& r) {
  std::vector<at::Tensor> v;
  for (const auto& s : r.inputs) v.push_back(make_input(s));
  return v;
}

std::string Recipe::describe() const {
  std::string s = fmt::format("seed {}; inputs:", seed);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    s += fmt::format(" x{}={}[", i, dtype_name(dtype_from_torch_code(in.dtype)));
    for (size_t d = 0; d < in.sizes.size(); ++d) s += (d ? "," : "") + std::to_string(in.sizes[d]);
    static const char* layouts[] = {"contiguous", "transposed", "sliced", "expanded", "channels_last", "huge_stride"};
    s += fmt::format("] {}{}", layouts[static_cast<int>(in.layout)], in.specials ? "" : " finite");
  }
  s += "\n";
  for (size_t k = 0; k < ops.size(); ++k) {
    s += fmt::format("  v{} = {}(", inputs.size() + k, ops[k].schema);
    for (size_t i = 0; i < ops[k].args.size(); ++i) {
      const auto& a = ops[k].args[i];
      s += (i ? ", " : "") + (a.value >= 0 ? "v" + std::to_string(a.value) : literal_str(a.literal));
    }
    s += ")\n";
  }
  s += "  outputs:";
  for (int o : outputs) s += " v" + std::to_string(o);
  return s + "\n";
}

Recipe generate(uint64_t seed, const GenOptions& gen) {
  for (uint64_t attempt = 0;; ++attempt) {
    Rng r(mix(seed, attempt));
    Recipe rec;
    rec.seed = seed;
    static const std::vector<int> dtypes = {6, 6, 6, 7, 5, 5, 15, 15, 3, 4, 11};
    static const std::vector<std::vector<int64_t>> shapes = {
        {}, {0}, {1}, {7}, {8}, {9}, {15}, {16}, {17}, {31}, {33}, {64}, {65}, {3, 5}, {5, 1}, {4, 8},
        {0, 3}, {2, 3, 5}, {2, 1, 4, 3}, {2, 3, 4, 5}, {3, 11, 13}, {32769}, {2, 16385}};
    int base = pick(r, dtypes);
    bool specials = !chance(r, 0.3);
    bool huge = chance(r, 0.04);
    std::vector<int64_t> shape = huge ? std::vector<int64_t>{2, 33} : pick(r, shapes);
    int n_inputs = uniform(r, 1, 3);
    for (int i = 0; i < n_inputs; ++i) {
      InputSpec in;
      in.dtype = huge && i == 0 ? 11 : (chance(r, 0.2) ? pick(r, dtypes) : base);
      in.sizes = shape;
      if (i > 0 && !in.sizes.empty() && chance(r, 0.5)) {
        // A broadcasting variant: fewer leading dims, or size-1 dims.
        if (chance(r, 0.5)) in.sizes.erase(in.sizes.begin(), in.sizes.begin() + uniform(r, 0, static_cast<int>(in.sizes.size())));
        for (auto& d : in.sizes)
          if (chance(r, 0.3)) d = 1;
      }
      static const std::vector<Layout> layouts = {Layout::kContiguous, Layout::kContiguous, Layout::kTransposed,
                                                  Layout::kSliced, Layout::kExpanded, Layout::kChannelsLast};
      in.layout = huge && i == 0 ? Layout::kHugeStride : pick(r, layouts);
      in.value_seed = mix(seed, 1000 + static_cast<uint64_t>(i) + attempt * 7);
      in.specials = specials;
      rec.inputs.push_back(in);
    }
    std::vector<at::Tensor> vals = make_inputs(rec);
    std::vector<uint8_t> vflags(vals.size(), 0);
    int n_ops = uniform(r, 2, 16);
    const auto& ops = fuzz_ops();
    // Random ops draw here what check_batch's eager and fused runs will draw (Note [The fuzzer's wider
    // graphs]), so that the preconditions hold for those values too.
    at::manual_seed(draw_seed(seed));
    const int n_in = static_cast<int>(rec.inputs.size());
    // (No draws for kinds that are off: GenOptions::elementwise_only() gives campaigns 1-4's graphs.)
    // Nor in-place ops with a 4 GB huge-stride input: capture's recipes hold several copies of the inputs.
    const int inplace_at = gen.inplace > 0 && chance(r, gen.inplace) && !huge ? uniform(r, 0, n_ops - 1) : -1;
    for (int k = 0; k < n_ops; ++k) {
      for (int tries = 0; tries < 30; ++tries) {
        OpSpec spec;
        const bool wide = gen.reductions + gen.views + gen.random_ops + gen.cats + gen.gathers + gen.batch_norms > 0;
        const double u = wide ? std::uniform_real_distribution<double>(0, 1)(r) : 1.0;
        // No random ops with an in-place op: such recipes run through TorchScript, whose interpreter
        // drops unused random ops (eager's op-by-op replay draws them).
        const double p_red = gen.reductions, p_view = p_red + gen.views,
                     p_rand = p_view + (inplace_at >= 0 ? 0.0 : gen.random_ops), p_cat = p_rand + gen.cats,
                     p_gather = p_cat + gen.gathers, p_bn = p_gather + gen.batch_norms;
        if ((k == inplace_at && tries < 10) || u < p_bn) {
          std::optional<OpSpec> sp = k == inplace_at && tries < 10 ? make_inplace(r, vals, uniform(r, 0, n_in - 1))
                                     : u < p_red                   ? make_reduction(r, vals)
                                     : u < p_view                  ? make_view(r, vals)
                                     : u < p_rand                  ? make_random(r, vals)
                                     : u < p_cat                   ? make_cat(r, vals)
                                     : u < p_gather                ? make_gather(r, vals)
                                                                   : make_batch_norm(r, vals);
          if (!sp) continue;
          spec = std::move(*sp);
        } else {
        const OpInfo& op = *pick(r, ops);
        spec.schema = op.schema;
        std::vector<int64_t> out_shape;
        bool have_shape = false, ok = true;
        int first_tensor = -1;
        for (size_t i = 0; i < op.args.size() && ok; ++i) {
          const ArgSpec& a = op.args[i];
          RecipeArg ra;
          if (a.is_tensor()) {
            // Prefer recent values; the mask and condition of where/masked_fill must be bool.
            std::vector<int> cands;
            for (int v = 0; v < static_cast<int>(vals.size()); ++v) {
              // (type_as's second tensor only lends its dtype: any dtype does.)
              if (a.kind == ArgKind::kTensorNoPromote && op.rule != DTypeRule::kCastLike &&
                  vals[static_cast<size_t>(v)].scalar_type() != at::kBool)
                continue;
              bool bok = true;
              if (have_shape) {
                // Views make values of other ranks: [n, 1] against [n] would broadcast to n^2 elements.
                auto b = broadcast_shapes(out_shape, vals[static_cast<size_t>(v)].sizes().vec(), &bok);
                int64_t numel = 1;
                for (int64_t d : b) numel *= d;
                bok = bok && numel <= kMaxBroadcastNumel;
              }
              if (bok) cands.push_back(v);
            }
            if (cands.empty()) {
              ok = false;
              break;
            }
            int v = chance(r, 0.6) ? cands.back() : pick(r, cands);
            if (chance(r, 0.3) && cands.size() > 1) v = cands[cands.size() - 2];
            ra.value = v;
            out_shape = have_shape ? broadcast_shapes(out_shape, vals[static_cast<size_t>(v)].sizes().vec(), &ok)
                                   : vals[static_cast<size_t>(v)].sizes().vec();
            have_shape = true;
            if (first_tensor < 0) first_tensor = v;
          } else if (a.kind == ArgKind::kScalar || a.kind == ArgKind::kScalarNoPromote) {
            bool int_only = op.has(OpFlag::kIntegral) ||
                            (first_tensor >= 0 && !at::isFloatingType(vals[static_cast<size_t>(first_tensor)].scalar_type()) &&
                             (op.kernel_fn == "add" || op.kernel_fn == "sub" || op.kernel_fn == "rsub") && i == 2);
            ra.literal = a.has_default && chance(r, 0.5) ? a.default_value : random_scalar(r, int_only);
          } else if (a.kind == ArgKind::kOptScalar) {
            ra.literal = chance(r, 0.3) ? Literal(None{}) : random_scalar(r, false);
          } else if (a.kind == ArgKind::kMode) {
            if (op.kernel_fn == "gelu") ra.literal = std::string(chance(r, 0.5) ? "none" : "tanh");
            else ra.literal = std::string(chance(r, 0.5) ? "trunc" : "floor");
          } else if (a.kind == ArgKind::kDTypeArg) {
            static const std::vector<int64_t> codes = {11, 3, 4, 5, 15, 6, 7};
            ra.literal = pick(r, codes);
          } else {
            FJ_INTERNAL_ASSERT(a.has_default, "{}: argument {} has no default", op.schema, i);
            ra.literal = a.default_value;
          }
          spec.args.push_back(ra);
        }
        if (!ok) continue;
        }
        std::vector<c10::IValue> stack;
        std::vector<uint8_t> flags;
        for (const auto& a : spec.args) {
          stack.push_back(a.value >= 0 ? c10::IValue(vals[static_cast<size_t>(a.value)]) : literal_to_ivalue(a.literal));
          flags.push_back(a.value >= 0 ? vflags[static_cast<size_t>(a.value)] : 0);
        }
        uint8_t res_flags = 0;
        if (!eager_op(spec.schema, stack, flags, &res_flags)) continue;
        if (!inplace_base(spec.schema).empty()) vflags.at(static_cast<size_t>(spec.args[0].value)) = res_flags;
        vals.push_back(stack.at(0).toTensor());
        vflags.push_back(res_flags);
        rec.ops.push_back(std::move(spec));
        break;
      }
    }
    if (rec.ops.empty()) continue;
    int last = n_in + static_cast<int>(rec.ops.size()) - 1;
    for (int v = n_in; v < last; ++v)
      if (chance(r, 0.25)) rec.outputs.push_back(v);
    rec.outputs.push_back(last);
    return rec;
  }
}

namespace {
// |a - b| <= n ulps of the dtype at max(|a|, |b|), elementwise (equal infinities pass). The fuzzer accepts
// this for values computed through transcendental functions: two correct 1-ulp libraries differ by a few
// ulps, and in float16/bfloat16 every intermediate rounding can turn that into a whole ulp of the result.
// `n` is a number or a tensor of them, per element.
bool within_ulps(const at::Tensor& a, const at::Tensor& b, const at::Tensor& n, double eps) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  at::Tensor ok = at::logical_or((x - y).abs().le(n * eps * at::maximum(x.abs(), y.abs()) + 1e-30), x.eq(y));
  return at::logical_or(ok, at::logical_and(x.isnan(), y.isnan())).all().item<bool>();
}

// |x f'(x) / f(x)| of a unary transcendental op at x (float64), or undefined for other ops.
at::Tensor condition_number(const std::string& fn, const at::Tensor& x) {
  if (fn == "exp" || fn == "sinh") return x.abs();
  if (fn == "exp2") return x.abs() * 0.6931471805599453;
  if (fn == "expm1") return (x * x.exp() / x.expm1()).abs();
  if (fn == "log" || fn == "log2") return x.log().abs().reciprocal();
  if (fn == "log1p") return (x / ((1 + x) * x.log1p())).abs();
  if (fn == "sin") return (x * x.cos() / x.sin()).abs();
  if (fn == "cos") return (x * x.sin() / x.cos()).abs();
  if (fn == "tan") return (x / (x.sin() * x.cos())).abs();
  if (fn == "tanh") return (x * (1 - x.tanh().square()) / x.tanh()).abs();
  if (fn == "sigmoid") return (x * (1 - x.sigmoid())).abs();
  if (fn == "erf") return (x * 1.1283791670955126 * (-x.square()).exp() / x.erf()).abs();
  if (fn == "silu" || fn == "mish" || fn == "softplus" || fn == "elu") return (x.abs() + 1);  // loose bounds
  return at::Tensor();
}

// Per element of each value of a replay, how much the cancellations on its way amplified the ulps by
// which two correct libraries' operands may differ: a sum (add, sub, rsub, addcmul, addcdiv, lerp,
// batch_norm) with an inexact operand multiplies it by |its largest summand| / |its result|, gelu by
// 1 / (1 + erf(x / sqrt 2)), a transcendental function by its condition number (condition_number);
// other ops pass on the largest amplification of their float operands. Undefined: 1.
// See Note [The fuzzer's oracle and ill-conditioned cases].
std::vector<at::Tensor> amplifications(const Recipe& r, const Replay& rp) {
  std::vector<at::Tensor> amp(rp.values.size());
  size_t n_in = r.inputs.size();
  for (size_t j = 0; j < r.ops.size(); ++j) {
    const at::Tensor& res = rp.values.at(n_in + j);
    const std::string& schema = r.ops[j].schema;
    if (is_structural_schema(schema)) {
      // Reductions, views, random ops: the largest amplification of the input, times the op's own.
      if (!at::isFloatingType(res.scalar_type()) || res.numel() == 0 || r.ops[j].args.empty() || r.ops[j].args[0].value < 0)
        continue;
      std::vector<c10::IValue> args;
      for (const auto& arg : r.ops[j].args)
        args.push_back(arg.value >= 0 ? c10::IValue(rp.values.at(static_cast<size_t>(arg.value))) : literal_to_ivalue(arg.literal));
      const at::Tensor& in_amp = amp[static_cast<size_t>(r.ops[j].args[0].value)];
      at::Tensor a = in_amp.defined() && in_amp.numel() ? in_amp.max().expand(res.sizes()) : at::Tensor();
      if (is_cat_schema(schema)) {
        // The largest of the items'.
        for (const auto& arg : r.ops[j].args) {
          if (arg.value < 0) continue;
          const at::Tensor& ia = amp[static_cast<size_t>(arg.value)];
          if (!ia.defined() || !ia.numel()) continue;
          at::Tensor m = ia.max().expand(res.sizes());
          a = a.defined() ? at::maximum(a, m) : m;
        }
        amp[n_in + j] = a;
        continue;
      }
      if (is_random_schema(schema) && schema != "aten::dropout") a = at::Tensor();
      at::Tensor local = structural_local_amp(schema, args, res);
      if (local.defined()) a = a.defined() ? a * local : local;
      amp[n_in + j] = a;
      continue;
    }
    std::string base = inplace_base(schema);
    const OpInfo* info = find_op(base.empty() ? schema : base);
    if (!info || !at::isFloatingType(res.scalar_type()) || res.numel() == 0) continue;
    at::Tensor a;
    std::vector<at::Tensor> float_args;
    bool inexact_arg = false;
    for (const auto& arg : r.ops[j].args) {
      if (arg.value < 0) continue;
      size_t v = static_cast<size_t>(arg.value);
      const at::Tensor& t = rp.values.at(v);
      if (!at::isFloatingType(t.scalar_type())) continue;
      // Arguments that only lend their dtype (type_as's second) need not broadcast to the result.
      bool broadcasts = t.dim() <= res.dim();
      for (int64_t d = 1; d <= t.dim() && broadcasts; ++d)
        broadcasts = t.size(-d) == 1 || t.size(-d) == res.size(-d);
      if (!broadcasts) continue;
      float_args.push_back(t.to(at::kDouble));
      inexact_arg = inexact_arg || (rp.flags.at(v) & kInexact);
      if (amp[v].defined()) a = a.defined() ? at::maximum(a, amp[v].expand_as(res)) : amp[v].expand_as(res);
    }
    const std::string& fn = info->kernel_fn;
    // A transcendental function of an inexact argument multiplies the argument's relative error by its
    // condition number |x f'(x) / f(x)| and adds its own few ulps: exp(exp(x)) with x near 2.7 turns
    // 4 ulps of the inner exp into 11 of the outer.
    at::Tensor kappa = inexact_arg && float_args.size() == 1 ? condition_number(fn, float_args[0]) : at::Tensor();
    if (kappa.defined()) {
      kappa = at::where(kappa.isfinite(), kappa, at::ones_like(kappa)).expand_as(res);
      a = 1.0 + kappa * (a.defined() ? a : at::ones_like(kappa));
    }
    at::Tensor local;
    if (inexact_arg && in_set(fn, {"add", "sub", "rsub", "addcmul", "addcdiv", "lerp", "batch_norm"})) {
      std::vector<c10::IValue> args;
      for (const auto& arg : r.ops[j].args)
        args.push_back(arg.value >= 0 ? c10::IValue(rp.values.at(static_cast<size_t>(arg.value))) : literal_to_ivalue(arg.literal));
      at::Tensor big = at::zeros(res.sizes(), res.options().dtype(at::kDouble));
      for (const auto& t : summands(fn, args)) big = at::maximum(big, at::where(t.isnan(), at::zeros_like(t), t).expand_as(big));
      local = big / res.to(at::kDouble).abs();
    } else if (fn == "gelu" && !float_args.empty()) {
      local = at::erfc(float_args[0] * -0.70710678118654752440).reciprocal();
    }
    if (local.defined()) {
      local = at::where(local.isfinite(), local, at::ones_like(local)).clamp_min(1.0);  // 0 / 0, x / 0: 1
      a = a.defined() ? a * local : local;
    }
    amp[n_in + j] = a;
  }
  return amp;
}
}  // namespace

at::Tensor to_device_same_layout(const at::Tensor& t, const at::Device& device) {
  int64_t n = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
  at::Tensor base = at::empty({0}, t.options()).set_(t.storage(), 0, {n}, {1});
  return base.to(device).as_strided(t.sizes(), t.strides(), t.storage_offset());
}

namespace {

// NVRTC's verdict on the batch graph's kernels moved to a GPU: "" when they compile without spills.
std::string nvrtc_check(const Graph& g, const std::string& arch, int64_t* kernels) {
  // A class's graph (check_class) decides on its sizes under guards of its own (the CUDA printer
  // specializes some): this thread's.
  ShapeGuards guards;
  std::optional<GuardScope> scope;
  if (!g.symbols().empty()) scope.emplace(guards);
  auto gc = g.clone();
  set_device(*gc, Device::kCUDA, 0);
  PlanTarget target;
  target.arch["cuda"] = arch;
  target.compile = false;
  // FUSION_JIT_DYNAMIC=on: the kernels read their sizes, as on the CPU (Note [CUDA size arguments]).
  target.size_args = fusion_jit::Options::get().dynamic == DynamicSizes::kOn;
  auto plan = build_plan(std::move(gc), target);
  const TargetCode* code = plan->code_for(Device::kCUDA);
  if (!code) return "";
  try {
    auto bin = compile_cuda_source(code->source, arch);
    *kernels += static_cast<int64_t>(bin->kernels.size());
    for (const auto& k : bin->kernels)
      if (k.spill_stores + k.spill_loads > 0)
        return fmt::format("NVRTC {}: {} spills {} B", arch, k.name, k.spill_stores + k.spill_loads);
  } catch (const Error& e) {
    return fmt::format("NVRTC {} failed: {}", arch, e.what());
  }
  return "";
}

std::atomic<int64_t> g_nvrtc_kernels{0};
std::atomic<int64_t> g_nvrtc_micros{0};

}  // namespace

namespace {

// Judges one recipe's fused outputs against eager's (the tolerance rule, the float64 reference, and
// the oracle's ulps for inexact values).
CaseResult judge(const Recipe& recipe, const std::vector<at::Tensor>& inputs, const Replay& eager_rp,
                 const std::vector<at::Tensor>& fused, size_t first) {
  std::vector<at::Tensor> amp = amplifications(recipe, eager_rp);
  std::vector<at::Tensor> ref;
  for (size_t i = 0; i < recipe.outputs.size(); ++i) {
    size_t o = static_cast<size_t>(recipe.outputs[i]);
    const at::Tensor& f = fused.at(first + i);
    const at::Tensor& e = eager_rp.values.at(o);
    auto c = check_close(f, e);
    if (!c.ok && at::isFloatingType(f.scalar_type()) && c.message.find("values differ") != std::string::npos) {
      if (ref.empty()) {
        Replay r64;
        if (replay(recipe, inputs, true, nullptr, &r64, &eager_rp))
          for (int out : recipe.outputs) ref.push_back(r64.values.at(static_cast<size_t>(out)));
      }
      if (!ref.empty()) c = check_close(f, e, ref[i].to(at::kDouble));
    }
    uint8_t fl = eager_rp.flags.at(o);
    const at::Tensor& a = amp.at(o);
    at::Tensor ulps = a.defined() ? (a * 4.0).to(f.device()) : at::scalar_tensor(4.0, f.options().dtype(at::kDouble));
    if (!c.ok && (fl & kInexact) && c.message.find("NaN") == std::string::npos &&
        within_ulps(f, e, ulps, class_eps(std::max(fl >> 2, precision_class(f.scalar_type())))))
      c.ok = true;
    if (!c.ok) return {false, fmt::format("output {} (v{}): {}", i, recipe.outputs[i], c.message)};
  }
  return {};
}

// A recipe with an in-place op, through the path a user's model takes: its TorchScript source compiled
// with compile(), called twice on fresh inputs (the first call captures, the second runs the plan).
// Outputs must match eager's, and the inputs must come back modified exactly as eager modifies them.
CaseResult check_captured(const Recipe& r, const CheckOptions& co) {
  // Eager runs on the device the compiled module runs on (CUDA's kernels differ from the CPU's in NaN and
  // infinity handling), and results are judged there: a copy to the CPU would change their strides.
  if (co.cuda && !gathers_in_range(r)) return {true, "eager rejects this recipe"};
  std::vector<at::Tensor> in_e = make_inputs(r);
  if (co.cuda)
    for (auto& t : in_e) t = to_device_same_layout(t, at::Device(at::kCUDA, 0));
  std::vector<at::Tensor> original;
  for (auto& t : in_e) original.push_back(t.clone());
  at::manual_seed(draw_seed(r.seed));
  Replay e;
  if (!replay(r, in_e, false, nullptr, &e)) return {true, "eager rejects this recipe"};
  torch::jit::Module m("FuzzCase");
  try {
    m.define(torchscript_source(r));
    m.eval();
  } catch (const std::exception& ex) {
    return {false, std::string("TorchScript source not accepted: ") + ex.what()};
  }
  try {
    CompiledModule fused = compile(m);
    for (int call = 0; call < 2; ++call) {
      std::vector<at::Tensor> in_f = make_inputs(r);
      if (co.cuda)
        for (auto& t : in_f) t = to_device_same_layout(t, at::Device(at::kCUDA, 0));
      std::vector<c10::IValue> args(in_f.begin(), in_f.end());
      at::manual_seed(draw_seed(r.seed));
      c10::IValue out = fused(args);
      std::vector<at::Tensor> outs;
      for (const auto& v : out.toTupleRef().elements()) outs.push_back(v.toTensor());
      // The float64 reference starts from the inputs as they were before eager's call.
      CaseResult c = judge(r, original, e, outs, 0);
      if (!c.ok) return {false, fmt::format("call {}: {}", call + 1, c.message)};
      for (size_t i = 0; i < in_f.size(); ++i)
        if (!same_values(in_f[i], in_e[i]))
          return {false, fmt::format("call {}: input {} after the call differs from eager's (in-place op)", call + 1, i)};
    }
  } catch (const std::exception& ex) {
    return {false, std::string("compiled module failed: ") + ex.what()};
  }
  return {};
}

}  // namespace

bool has_random_ops(const Recipe& r) {
  for (const auto& op : r.ops)
    if (is_random_schema(op.schema)) return true;
  return false;
}

bool has_inplace_ops(const Recipe& r) {
  for (const auto& op : r.ops)
    if (!inplace_base(op.schema).empty()) return true;
  return false;
}

bool has_ragged_cats(const Recipe& r) {
  Replay rp;
  if (!replay(r, make_inputs(r), false, nullptr, &rp)) return false;
  for (const auto& op : r.ops) {
    if (op.schema != "aten::cat") continue;
    std::set<std::vector<int64_t>> shapes;
    for (size_t a = 0; a + 1 < op.args.size(); ++a)
      if (op.args[a].value >= 0 && rp.values.at(static_cast<size_t>(op.args[a].value)).numel() > 0)
        shapes.insert(rp.values[static_cast<size_t>(op.args[a].value)].sizes().vec());
    if (shapes.size() > 1) return true;
  }
  return false;
}

namespace {

// Each extent resized() changes, in place: the inputs' sizes and the sizes a view, reshape or expand names.
template <class F>
void for_each_extent(Recipe& r, F&& f) {
  for (auto& in : r.inputs)
    for (auto& s : in.sizes) f(s);
  for (auto& op : r.ops) {
    // Size lists: a view's, a reshape's and an expand's sizes, a normalization's normalized shape (the
    // input's last dims).
    const bool sizes = op.schema.rfind("aten::view", 0) == 0 || op.schema.rfind("aten::reshape", 0) == 0 ||
                       op.schema.rfind("aten::expand", 0) == 0 || op.schema == "aten::layer_norm" ||
                       op.schema == "aten::rms_norm";
    if (!sizes) continue;
    for (auto& a : op.args)
      if (auto* list = std::get_if<SymSizes>(&a.literal))
        for (auto& s : *list) {
          int64_t e = s.hint();
          f(e);
          s = e;
        }
  }
}

}  // namespace

std::map<int64_t, int64_t> second_extents(const std::vector<Recipe>& batch) {
  std::map<int64_t, int64_t> to;
  if (batch.empty()) return to;
  const uint64_t seed = batch.front().seed;
  for (const Recipe& r : batch)
    for (const auto& in : r.inputs)
      if (in.layout == Layout::kHugeStride) to[2] = 2;  // its two rows (make_input)
  for (Recipe r : batch)
    for_each_extent(r, [&](int64_t& e) {
      if (e >= 2 && !to.count(e)) to[e] = e + 1 + static_cast<int64_t>(mix(seed, static_cast<uint64_t>(e)) % 5);
    });
  for (auto it = to.begin(); it != to.end();) it = it->first == it->second ? to.erase(it) : std::next(it);
  return to;
}

std::vector<Recipe> resized(const std::vector<Recipe>& batch) {
  const std::map<int64_t, int64_t> to = second_extents(batch);
  std::vector<Recipe> out = batch;
  for (Recipe& r : out)
    for_each_extent(r, [&](int64_t& e) {
      auto it = to.find(e);
      if (it != to.end()) e = it->second;
    });
  return out;
}

bool gathers_in_range(const Recipe& r) {
  if (std::none_of(r.ops.begin(), r.ops.end(), [](const OpSpec& op) { return is_gather_schema(op.schema); }))
    return true;
  at::manual_seed(draw_seed(r.seed));
  Replay cpu;
  try {
    return replay(r, make_inputs(r), false, nullptr, &cpu);
  } catch (const std::exception&) {  // the replay's own defect: the device replay reports it
    return true;
  }
}

namespace {

// One batch at one size: each recipe's inputs and eager replay, and the graph that runs them all.
struct BatchRun {
  std::unique_ptr<Graph> g = std::make_unique<Graph>();
  std::vector<std::vector<at::Tensor>> inputs, before;
  std::vector<Replay> eager;
  std::vector<c10::IValue> all_inputs;
  explicit BatchRun(size_t n) : inputs(n), before(n), eager(n) {}

  // Recipe k's inputs (on the device of `co`) and its eager replay. False, with `why`, where eager rejects
  // the recipe or its replay raised.
  bool eager_ok(const Recipe& r, size_t k, const CheckOptions& co, bool seeded, CaseResult* why) {
    if (co.cuda && !gathers_in_range(r)) {
      *why = {true, "eager rejects this recipe"};
      return false;
    }
    inputs[k] = make_inputs(r);
    if (co.cuda)
      for (auto& t : inputs[k]) t = to_device_same_layout(t, at::Device(at::kCUDA, 0));
    // Validated first (a shrunk recipe may be one eager rejects), then built into the batch graph.
    if (seeded) at::manual_seed(draw_seed(r.seed));
    try {
      if (replay(r, inputs[k], false, nullptr, &eager[k])) return true;
      *why = {true, "eager rejects this recipe"};
    } catch (const std::exception& e) {  // a precondition's own defect: reported with the graph, not fatal
      *why = {false, std::string("the eager replay raised: ") + e.what()};
    }
    return false;
  }
  // The same ops on the same inputs, into the graph (its inputs and outputs appended).
  void build(const Recipe& r, size_t k, bool seeded) {
    if (seeded) at::manual_seed(draw_seed(r.seed));
    replay(r, inputs[k], false, g.get(), &eager[k]);
    for (auto& t : inputs[k]) all_inputs.emplace_back(t);
    for (int o : r.outputs) g->add_output(eager[k].ir.at(static_cast<size_t>(o)));
  }
  // The inputs as eager left them (unchanged: no recipe built here mutates); the fused run must leave
  // them so.
  void keep_inputs() {
    for (size_t k = 0; k < inputs.size(); ++k) {
      before[k].clear();
      for (auto& t : inputs[k]) before[k].push_back(t.clone());
    }
  }
  std::vector<at::Tensor> run(const PlanInstance& inst) const {
    std::vector<at::Tensor> fused;
    c10::IValue out = run_plan(inst, all_inputs);
    for (const auto& e : out.toTupleRef().elements()) fused.push_back(e.toTensor());
    return fused;
  }
  // Each built recipe's outputs (in order among `fused`) against its eager replay, its inputs unchanged.
  void judge_all(const std::vector<Recipe>& recipes, const std::vector<bool>& built, const std::vector<at::Tensor>& fused,
                 std::vector<CaseResult>* results) const {
    size_t pos = 0;
    for (size_t k = 0; k < recipes.size(); ++k) {
      if (!built[k]) continue;
      CaseResult& res = (*results)[k];
      try {
        res = judge(recipes[k], inputs[k], eager[k], fused, pos);
      } catch (const std::exception& e) {  // a checker's own defect is reported with its graph, not fatal
        res = {false, std::string("judging the results failed: ") + e.what()};
      }
      pos += recipes[k].outputs.size();
      for (size_t i = 0; i < inputs[k].size() && res.ok; ++i)
        if (!same_values(inputs[k][i], before[k][i])) res = {false, fmt::format("input {} was modified", i)};
    }
  }
};

// The NVRTC check of a graph's CUDA kernels on a thread of its own, alongside the CPU run; its verdict
// fails the built recipes still passing when joined (at join(), or when it goes out of scope).
class NvrtcCheck {
 public:
  NvrtcCheck(const Graph& g, const std::string& arch, std::vector<CaseResult>* results, const std::vector<bool>& built)
      : results_(results), built_(built) {
    if (arch.empty()) return;
    f_ = std::async(std::launch::async, [gc = std::shared_ptr<Graph>(g.clone()), arch] {
      auto t0 = std::chrono::steady_clock::now();
      int64_t kernels = 0;
      std::string err = nvrtc_check(*gc, arch, &kernels);
      g_nvrtc_kernels += kernels;
      g_nvrtc_micros += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
      return err;
    });
  }
  NvrtcCheck(const NvrtcCheck&) = delete;
  NvrtcCheck& operator=(const NvrtcCheck&) = delete;
  ~NvrtcCheck() { join(); }
  void join() {
    if (!f_.valid()) return;
    std::string err = f_.get();
    if (err.empty()) return;
    for (size_t k = 0; k < results_->size(); ++k)
      if (built_[k] && (*results_)[k].ok) (*results_)[k] = {false, err};
  }

 private:
  std::future<std::string> f_;
  std::vector<CaseResult>* results_;
  std::vector<bool> built_;
};

}  // namespace

std::vector<CaseResult> check_batch(const std::vector<Recipe>& recipes, const CheckOptions& co) {
  std::vector<CaseResult> results(recipes.size());
  // Recipes with an in-place op go through capture; recipes with random ops run alone, the generator
  // seeded alike before the eager and the fused run.
  std::vector<bool> valid(recipes.size(), true);
  const bool seeded = recipes.size() == 1 && has_random_ops(recipes[0]);
  for (size_t k = 0; k < recipes.size(); ++k) {
    if (has_inplace_ops(recipes[k])) {
      try {
        results[k] = check_captured(recipes[k], co);
      } catch (const std::exception& e) {  // the checker's own defect: reported with the graph, not fatal
        results[k] = {false, std::string("checking the captured graph raised: ") + e.what()};
      }
      valid[k] = false;
    } else if (!seeded && has_random_ops(recipes[k])) {
      results[k] = check_batch({recipes[k]}, co).at(0);
      valid[k] = false;
    }
  }
  BatchRun b(recipes.size());
  for (size_t k = 0; k < recipes.size(); ++k) {
    if (!valid[k]) continue;
    valid[k] = b.eager_ok(recipes[k], k, co, seeded, &results[k]);
    if (valid[k]) b.build(recipes[k], k, seeded);
  }
  if (b.g->outputs().empty()) return results;
  b.keep_inputs();
  try {
    verify_graph(*b.g);
    run_pipeline(*b.g, nullptr);
    NvrtcCheck nvrtc(*b.g, co.nvrtc_arch, &results, valid);
    PlanInstance inst;
    inst.captured.output_kind = OutputKind::kTuple;
    PlanTarget target;
    // FUSION_JIT_DYNAMIC=on: the batch's kernels read their sizes (Note [Sizes as kernel arguments]).
    target.size_args = fusion_jit::Options::get().dynamic == DynamicSizes::kOn;
    inst.plan = build_plan(std::move(b.g), target);
    resolve_aten_steps(inst);
    if (seeded) at::manual_seed(draw_seed(recipes[0].seed));
    b.judge_all(recipes, valid, b.run(inst), &results);
    nvrtc.join();
  } catch (const std::exception& e) {
    for (size_t k = 0; k < recipes.size(); ++k)
      if (valid[k]) results[k] = {false, std::string("fused run failed: ") + e.what()};
  }
  return results;
}

// ---- Shape classes (Note [The fuzzer's shape classes]) ----
//
// Note [The fuzzer's shape classes]
// With --second-size each batch also runs through one plan of its shape class at two sizes, as the
// torch.compile backend serves a symbolic graph (GraphFunction::add_from_class). The batch's graph is
// replayed at its sizes and at resized()'s, and the two prints differ only in numbers: every extent that
// resized() changes becomes a symbol (hint: its first value), and every number that differs becomes an
// expression over the symbols that gives both values (generalize(), Note [Graphs of two sizes] in
// ir/graph.h). That the class's graph concretizes to each print
// exactly is checked, so the graph is right at both sizes by construction, whatever expression fit.
// Its plan is built once, under guards, as add_from_class builds a class (passes, fusion, code generation
// with every size a kernel argument), and instantiated at both sizes (instantiate_plan: numbers evaluated,
// the code shared); each instance runs against eager at its size. A second size that fails a guard of
// the class (the plan decided something on a size there: a dim that merges, an int32 offset bound) is
// checked with a plan of its own instead, as are recipes with in-place ops (torch.compile functionalizes
// them before a class's graph is made; the TorchScript and C++ paths capture each size); the report counts
// both. A recipe with random ops runs through a class of its own, the generator seeded before each eager
// replay and each instance's run as check_batch seeds it, so both draw the same numbers in the same order.


namespace {

// The recipes `take` may cover, through one class plan; `seeded`: a single recipe with random ops, the
// generator seeded alike before each eager replay and each instance's run.
ClassCheck check_class_of(const std::vector<Recipe>& recipes, std::vector<bool> take, bool seeded, const CheckOptions& co) {
  const size_t n = recipes.size();
  ClassCheck out;
  out.results.resize(n);
  out.covered.assign(n, false);
  const std::vector<Recipe> second = resized(recipes);
  const std::map<int64_t, int64_t> extents = second_extents(recipes);
  BatchRun at[2] = {BatchRun(n), BatchRun(n)};
  for (size_t k = 0; k < n; ++k) {
    if (!take[k]) continue;
    CaseResult ignored;
    take[k] = at[0].eager_ok(recipes[k], k, co, seeded, &ignored) && at[1].eager_ok(second[k], k, co, seeded, &ignored);
  }
  for (size_t k = 0; k < n; ++k)
    if (take[k]) at[0].build(recipes[k], k, seeded), at[1].build(second[k], k, seeded);
  if (at[0].g->outputs().empty()) {
    out.why = "no graph of the batch runs at both sizes";
    return out;
  }
  at[0].g->renumber(), at[1].g->renumber();  // as a parsed graph is numbered
  const std::string texts[2] = {print_graph(*at[0].g), print_graph(*at[1].g)};
  out.class_ir = generalize(texts[0], texts[1], extents, &out.why);
  if (out.class_ir.empty()) return out;
  out.covered = take;
  auto fail_all = [&](const std::string& msg) {
    for (size_t k = 0; k < n; ++k)
      if (take[k] && out.results[k].ok) out.results[k] = {false, msg};
  };
  const char* which[2] = {"first", "second"};
  ShapeGuards guards;
  std::unique_ptr<ExecutablePlan> cls;
  SymBindings bind[2];
  try {
    GuardScope scope(guards);
    auto g = parse_graph(out.class_ir);
    bind[0] = g->symbols();
    for (const auto& [name, hint] : bind[0]) bind[1][name] = extents.at(hint);
    for (int i : {0, 1}) {
      const std::string c = print_graph(*concretize(*g, bind[i]));
      if (c == texts[i]) continue;
      size_t d = 0;
      while (d < c.size() && d < texts[i].size() && c[d] == texts[i][d]) ++d;
      const size_t line = c.rfind('\n', d) == std::string::npos ? 0 : c.rfind('\n', d) + 1;
      fail_all(fmt::format("the class's graph at the {} size is not the batch's graph there: '{}' for '{}'", which[i],
                           c.substr(line, d - line + 40), texts[i].substr(line, d - line + 40)));
      return out;
    }
    verify_graph(*g);
    guards.set_phase("passes");
    run_pipeline(*g, nullptr);
    NvrtcCheck nvrtc(*g, co.nvrtc_arch, &out.results, take);
    guards.set_phase("plan");
    PlanTarget target;
    target.size_args = true;  // as for any class's graph
    cls = build_plan(std::move(g), target);
    nvrtc.join();
  } catch (const std::exception& e) {
    fail_all(std::string("building the class's plan failed: ") + e.what());
    return out;
  }
  for (const SymGuard& g : cls->guards.guards()) {
    if (!g.holds(bind[0])) {
      fail_all(fmt::format("the class's guard {} ({}) fails at the sizes it was built at", g.str(), g.phase));
      return out;
    }
    if (!g.holds(bind[1])) {
      out.covered.assign(n, false);
      out.outside = true;
      out.why = fmt::format("the second size fails the class's guard {} ({})", g.str(), g.phase);
      return out;
    }
  }
  for (int i : {0, 1}) {
    at[i].keep_inputs();
    std::vector<CaseResult> res(n);
    try {
      PlanInstance inst;
      inst.captured.output_kind = OutputKind::kTuple;
      inst.plan = instantiate_plan(*cls, bind[i]);
      resolve_aten_steps(inst);
      if (seeded) at::manual_seed(draw_seed(recipes[0].seed));
      at[i].judge_all(i ? second : recipes, take, at[i].run(inst), &res);
    } catch (const std::exception& e) {
      for (size_t k = 0; k < n; ++k)
        if (take[k]) res[k] = {false, std::string("fused run failed: ") + e.what()};
    }
    for (size_t k = 0; k < n; ++k)
      if (take[k] && out.results[k].ok && !res[k].ok)
        out.results[k] = {false, fmt::format("through its class's plan at its {} size: {}", which[i], res[k].message)};
  }
  return out;
}

}  // namespace

ClassCheck check_class(const std::vector<Recipe>& recipes, const CheckOptions& co) {
  // In-place ops never reach a class's graph: torch.compile functionalizes them before the backend sees
  // the graph, and the TorchScript and C++ paths capture each size. A recipe with random ops runs
  // alone, through a class of its own, seeded as check_batch seeds it.
  const size_t n = recipes.size();
  std::vector<bool> together(n, false), alone(n, false);
  for (size_t k = 0; k < n; ++k) {
    if (has_inplace_ops(recipes[k])) continue;
    (has_random_ops(recipes[k]) ? alone : together)[k] = true;
  }
  if (n == 1 && alone[0]) return check_class_of(recipes, alone, /*seeded=*/true, co);
  ClassCheck out = check_class_of(recipes, together, /*seeded=*/false, co);
  for (size_t k = 0; k < n; ++k) {
    if (!alone[k]) continue;
    ClassCheck own = check_class_of({recipes[k]}, {true}, /*seeded=*/true, co);
    out.covered[k] = own.covered[0];
    out.results[k] = own.results[0];
  }
  return out;
}

namespace {

bool still_fails(const Recipe& r, const CheckOptions& co) {
  Replay rp;
  if (!replay(r, make_inputs(r), false, nullptr, &rp)) return false;
  if (co.through_class) {
    ClassCheck c = check_class({r}, co);
    return c.covered[0] && !c.results[0].ok;
  }
  return !check_batch({r}, co).at(0).ok;
}

// The recipe without op k, its uses replaced by value `with`; dead ops dropped.
std::optional<Recipe> bypass(const Recipe& r, size_t k, int with) {
  int n_in = static_cast<int>(r.inputs.size());
  int removed = n_in + static_cast<int>(k);
  Recipe out = r;
  out.ops.clear();
  std::map<int, int> remap;
  for (int i = 0; i < n_in; ++i) remap[i] = i;
  for (size_t j = 0; j < r.ops.size(); ++j) {
    int old = n_in + static_cast<int>(j);
    if (old == removed) {
      remap[old] = remap.at(with);
      continue;
    }
    OpSpec op = r.ops[j];
    for (auto& a : op.args)
      if (a.value >= 0) a.value = remap.at(a.value);
    remap[old] = n_in + static_cast<int>(out.ops.size());
    out.ops.push_back(op);
  }
  out.outputs.clear();
  for (int o : r.outputs) {
    int m = remap.at(o);
    if (m >= n_in && std::find(out.outputs.begin(), out.outputs.end(), m) == out.outputs.end()) out.outputs.push_back(m);
  }
  if (out.outputs.empty() || out.ops.empty()) return std::nullopt;
  return out;
}

}  // namespace

Recipe shrink(const Recipe& start, const std::function<void(const std::string&)>& log, const CheckOptions& co) {
  Recipe r = start;
  int checks = 0;
  const int kMaxChecks = 300;
  bool progress = true;
  while (progress && checks < kMaxChecks) {
    progress = false;
    // One output at a time.
    if (r.outputs.size() > 1) {
      for (int o : r.outputs) {
        Recipe c = r;
        c.outputs = {o};
        ++checks;
        if (still_fails(c, co)) {
          r = c;
          progress = true;
          break;
        }
      }
    }
    // Bypass ops, last first.
    for (size_t k = r.ops.size(); k-- > 0 && checks < kMaxChecks;) {
      std::set<int> withs;
      for (const auto& a : r.ops[k].args)
        if (a.value >= 0) withs.insert(a.value);
      bool done = false;
      for (int w : withs) {
        auto c = bypass(r, k, w);
        if (!c) continue;
        ++checks;
        if (still_fails(*c, co)) {
          r = *c;
          progress = done = true;
          break;
        }
      }
      if (done) break;
    }
    // Smaller shapes, simpler values and layouts.
    for (size_t i = 0; i < r.inputs.size() && checks < kMaxChecks; ++i) {
      auto& in = r.inputs[i];
      for (size_t d = 0; d < in.sizes.size(); ++d) {
        if (in.sizes[d] <= 1 || in.layout == Layout::kHugeStride) continue;
        Recipe c = r;
        c.inputs[i].sizes[d] = (in.sizes[d] + 1) / 2;
        ++checks;
        if (still_fails(c, co)) {
          r = c;
          progress = true;
        }
      }
      if (r.inputs[i].specials) {
        Recipe c = r;
        c.inputs[i].specials = false;
        ++checks;
        if (still_fails(c, co)) r = c, progress = true;
      }
      if (r.inputs[i].layout != Layout::kContiguous && r.inputs[i].layout != Layout::kHugeStride) {
        Recipe c = r;
        c.inputs[i].layout = Layout::kContiguous;
        ++checks;
        if (still_fails(c, co)) r = c, progress = true;
      }
    }
  }
  if (log) log(fmt::format("shrunk from {} ops to {} in {} checks", start.ops.size(), r.ops.size(), checks));
  return r;
}

std::string torchscript_source(const Recipe& r) {
  auto lit = [](const Literal& l) -> std::string {
    if (std::holds_alternative<double>(l)) {
      double d = std::get<double>(l);
      if (std::isnan(d)) return "float('nan')";
      if (std::isinf(d)) return d > 0 ? "float('inf')" : "-float('inf')";
    }
    if (std::holds_alternative<std::string>(l)) return "'" + std::get<std::string>(l) + "'";
    return literal_str(l);
  };
  std::string s = "def forward(self";
  for (size_t i = 0; i < r.inputs.size(); ++i) s += fmt::format(", v{}", i);
  s += "):\n";
  for (size_t k = 0; k < r.ops.size(); ++k) {
    const auto& op = r.ops[k];
    size_t dot = op.schema.find('.');
    std::string name = op.schema.substr(6, dot == std::string::npos ? std::string::npos : dot - 6);
    std::string overload = dot == std::string::npos ? "" : op.schema.substr(dot + 1);
    auto handle = c10::Dispatcher::singleton().findSchema({"aten::" + name, overload});
    FJ_INTERNAL_ASSERT(handle.has_value(), "{}: no schema", op.schema);
    const auto& sargs = handle->schema().arguments();
    auto arg = [&](size_t i) {
      std::string v = op.args[i].value >= 0 ? "v" + std::to_string(op.args[i].value) : lit(op.args[i].literal);
      return i < sargs.size() && sargs[i].kwarg_only() ? sargs[i].name() + "=" + v : v;
    };
    // Method syntax binds the first argument as `self` (TorchScript resolves x.name(...) to aten::name);
    // ops without a tensor `self` go through torch.name(...).
    bool method = !sargs.empty() && sargs[0].name() == "self" && op.args[0].value >= 0 &&
                  !in_set(name, {"rand_like", "randn_like"});  // not Tensor methods
    if (is_cat_schema(op.schema)) {  // the items as a list
      std::string items;
      for (size_t i = 0; i + 1 < op.args.size(); ++i) items += (i ? ", " : "") + arg(i);
      s += fmt::format("    v{} = torch.{}([{}], {})\n", r.inputs.size() + k, name, items, arg(op.args.size() - 1));
      continue;
    }
    std::string call = method ? fmt::format("v{}.{}(", op.args[0].value, name) : fmt::format("torch.{}(", name);
    for (size_t i = method ? 1 : 0, n = 0; i < op.args.size(); ++i, ++n) call += (n ? ", " : "") + arg(i);
    s += fmt::format("    v{} = {})\n", r.inputs.size() + k, call);
  }
  s += "    return (";
  for (int o : r.outputs) s += fmt::format("v{}, ", o);
  return s + ")\n";
}

std::string write_repro(const Recipe& r, const std::string& message, const std::string& dir, const std::string& cli) {
  std::string base = fmt::format("{}/repro-{}", dir, r.seed);
  torch::jit::Module m("FuzzRepro");
  m.define(torchscript_source(r));
  m.save(base + ".pt");
  std::vector<c10::IValue> items;
  bool huge = false;
  for (auto& t : make_inputs(r)) {
    huge |= t.storage().nbytes() > (size_t{1} << 30);
    items.emplace_back(t.storage().nbytes() > (size_t{1} << 30) ? t.contiguous() : t);
  }
  auto data = torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(items)));
  std::ofstream(base + "-inputs.pt", std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  std::string cmd = fmt::format("{} run {}.pt --inputs {}-inputs.pt --check", cli, base, base);
  std::ofstream txt(base + ".txt");
  txt << message << "\n\n" << r.describe() << "\n" << torchscript_source(r) << "\nreplay: " << cmd << "\n";
  if (huge) txt << "note: an input with a >2^31-element stride was saved contiguous; its layout is in the recipe above\n";
  return cmd;
}

Report run(const Options& opt, const std::function<void(const std::string&)>& log) {
  Report rep;
  const int64_t nvrtc_kernels0 = g_nvrtc_kernels, nvrtc_micros0 = g_nvrtc_micros;
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_log = 0;
  uint64_t index = 0;
  while (rep.graphs < opt.max_graphs && (opt.max_seconds <= 0 || elapsed() < opt.max_seconds)) {
    std::vector<Recipe> batch;
    if (!opt.graph_seeds.empty()) {
      if (index >= opt.graph_seeds.size()) break;
      while (index < opt.graph_seeds.size() && batch.size() < static_cast<size_t>(opt.batch))
        batch.push_back(generate(opt.graph_seeds[index++], opt.gen));
    }
    int64_t n = opt.graph_seeds.empty() ? std::min<int64_t>(opt.batch, opt.max_graphs - rep.graphs) : 0;
    for (int64_t i = 0; i < n; ++i) batch.push_back(generate(mix(opt.seed, index++), opt.gen));
    auto results = check_batch(batch, opt.check);
    // Where each failure was found: at the batch's sizes, at the second sizes with plans of their own, or
    // through one plan of the class at both (Note [The fuzzer's shape classes]).
    enum class Found { kFirst, kSecond, kClass };
    std::vector<Found> found(batch.size(), Found::kFirst);
    if (opt.second_size) {
      const int64_t compiles0 = counters().compiles();
      ClassCheck cc = check_class(batch, opt.check);
      rep.second_batches++;
      rep.class_graphs += std::count(cc.covered.begin(), cc.covered.end(), true);
      if (cc.why.empty()) {
        rep.class_batches++;
      } else if (cc.outside) {
        rep.class_outside++;
        if (rep.class_outside_example.empty()) rep.class_outside_example = cc.why;
      } else if (cc.why.rfind("no graph", 0) != 0) {
        rep.class_not_generalized++;
        if (log) log("not generalized: " + cc.why);
      }
      // The rest at the second size, with plans of their own: a failure there is the graph's, replayed at
      // those extents.
      const std::vector<Recipe> second = resized(batch);
      std::vector<size_t> rest;
      std::vector<Recipe> rest_recipes;
      for (size_t k = 0; k < batch.size(); ++k)
        if (!cc.covered[k]) rest.push_back(k), rest_recipes.push_back(second[k]);
      auto again = check_batch(rest_recipes, opt.check);
      if (counters().compiles() == compiles0) rep.second_shared++;
      for (size_t k = 0; k < batch.size(); ++k)
        if (results[k].ok && cc.covered[k] && !cc.results[k].ok) results[k] = cc.results[k], found[k] = Found::kClass;
      for (size_t j = 0; j < rest.size(); ++j) {
        const size_t k = rest[j];
        if (!results[k].ok || again[j].ok) continue;
        batch[k] = second[k];
        results[k] = {false, "at its second size: " + again[j].message};
        found[k] = Found::kSecond;
      }
    }
    // One recipe checked as its failure was found, alone.
    auto check_alone = [&](const Recipe& r, Found f) {
      if (f != Found::kClass) return check_batch({r}, opt.check).at(0);
      ClassCheck c = check_class({r}, opt.check);
      return c.covered[0] ? c.results[0] : CaseResult{};
    };
    // A batch's failure is each graph's that also fails alone (shrunk, with its repro). One that fails
    // only beside the others (a fused run that raised fails them all) is reported once, for the batch.
    std::string together;
    bool any_alone = false;
    for (size_t k = 0; k < batch.size(); ++k) {
      rep.graphs++;
      rep.ops += static_cast<int64_t>(batch[k].ops.size());
      if (results[k].ok) continue;
      auto alone = check_alone(batch[k], found[k]);
      if (alone.ok) {
        if (together.empty()) together = fmt::format("graph seed {}: {}", batch[k].seed, results[k].message);
        continue;
      }
      any_alone = true;
      CheckOptions co = opt.check;
      co.through_class = found[k] == Found::kClass;
      Recipe small = opt.shrink ? shrink(batch[k], log, co) : batch[k];
      auto small_result = check_alone(small, found[k]);
      std::string msg = fmt::format("graph seed {}: {}", batch[k].seed, small_result.ok ? alone.message : small_result.message);
      if (found[k] == Found::kClass) {
        // The repro is the recipe at its second size, whose own plan may pass: the fuzzer checks the class.
        msg += fmt::format("\n  again through its class: {} fuzz --graph-seeds {} --second-size", opt.cli, batch[k].seed);
        small = resized({small}).at(0);
      }
      if (!opt.repro_dir.empty()) msg += "\n  replay: " + write_repro(small, msg, opt.repro_dir, opt.cli);
      msg += "\n" + small.describe();
      if (log) log("FAIL " + msg);
      rep.failures.push_back(msg);
      if (opt.stop_at_first_failure) break;
    }
    if (!together.empty() && !any_alone) {
      std::string seeds;
      for (const Recipe& r : batch) seeds += (seeds.empty() ? "" : ",") + std::to_string(r.seed);
      // The message says "at its second size" where the batch failed there (--second-size).
      std::string msg = fmt::format("a batch fails where each of its graphs passes alone (--graph-seeds {}): {}", seeds, together);
      if (log) log("FAIL " + msg);
      rep.failures.push_back(msg);
    }
    if (opt.stop_at_first_failure && !rep.failures.empty()) break;
    if (log && elapsed() - last_log > 10) {
      last_log = elapsed();
      log(fmt::format("{} graphs, {} failures, {:.1f} ms per graph", rep.graphs, rep.failures.size(),
                      1e3 * elapsed() / static_cast<double>(rep.graphs)));
    }
  }
  rep.seconds = elapsed();
  rep.nvrtc_kernels = g_nvrtc_kernels - nvrtc_kernels0;
  rep.nvrtc_seconds = static_cast<double>(g_nvrtc_micros - nvrtc_micros0) / 1e6;
  return rep;
}

}  // namespace fusion_jit::fuzz
