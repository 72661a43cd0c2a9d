// The foundation's op corpus: every op of the table as a TorchScript expression, the dtypes it accepts,
// and the input layouts it is tested in (broadcast, transposed, sliced with an offset, expanded, 0-d,
// size-0, size-1, more than one chunk), with NaN, +-Inf and +-0 among float values. One module per op
// applies it to every layout at once. Shared by the CPU tests against eager and the NVRTC corpus test.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace fusion_jit::testing {

enum DTypeSet : unsigned { kF = 1, kI = 2, kB = 4, kLowF = 8 };  // kF: f32 f64; kLowF: f16 bf16

struct OpCase {
  const char* name;
  const char* expr;  // over x, y, z
  int arity;
  unsigned dtypes;
  bool specials = true;  // inject NaN, +-Inf, +-0 into float inputs
  bool nonzero_int = false;  // integer inputs never 0 (eager raises on integer division by zero)
  bool ints_via_aten = false;  // integer dtypes are not fused on purpose (division raising, pow checks)
};

inline const OpCase kCases[] = {
    {"add", "torch.add(x, y, alpha=2)", 2, kF | kLowF | kI},
    {"add_scalar", "x + 3", 1, kF | kLowF | kI},
    {"add_float_scalar", "x + 2.5", 1, kF | kLowF | kI | kB},
    {"add_bool", "x + y", 2, kB},
    {"sub", "torch.sub(x, y, alpha=3)", 2, kF | kLowF | kI},
    {"sub_scalar", "x - 1.5", 1, kF | kLowF | kI},
    {"rsub", "torch.rsub(x, y)", 2, kF | kLowF | kI},
    {"rsub_scalar", "1 - x", 1, kF | kLowF | kI},
    {"mul", "x * y", 2, kF | kLowF | kI | kB},
    {"mul_scalar", "x * 1.5", 1, kF | kLowF | kI},
    {"div", "x / y", 2, kF | kLowF | kI},
    {"div_scalar", "x / 3", 1, kF | kLowF | kI},
    {"div_trunc", "torch.div(x, y, rounding_mode='trunc')", 2, kF | kLowF | kI, true, true, true},
    {"div_floor", "torch.div(x, y, rounding_mode='floor')", 2, kF | kLowF | kI, true, true, true},
    {"div_floor_scalar", "torch.div(x, -0.75, rounding_mode='floor')", 1, kF | kLowF},
    {"remainder", "torch.remainder(x, y)", 2, kF | kLowF | kI, true, true, true},
    {"remainder_scalar", "torch.remainder(x, -1.5)", 1, kF | kLowF},
    {"fmod", "torch.fmod(x, y)", 2, kF | kLowF | kI, true, true, true},
    // Integer division by a literal that is neither 0 nor -1 cannot raise: fused.
    {"div_trunc_int_literal", "torch.div(x, -3, rounding_mode='trunc')", 1, kI},
    {"div_floor_int_literal", "torch.div(x, 7, rounding_mode='floor')", 1, kI},
    {"remainder_int_literal", "torch.remainder(x, -5)", 1, kI},
    {"fmod_int_literal", "torch.fmod(x, 3)", 1, kI},
    {"clone", "x.clone()", 1, kF | kLowF | kI | kB},
    {"clone_contiguous", "(x * 2).clone(memory_format=0)", 1, kF | kI},  // torch.contiguous_format
    // Not an op of the table: stored by the kernel of its items (Note [Concatenation in kernels]).
    {"stack", "torch.stack((x * 2, -x, x), -1)", 1, kF | kLowF | kI},
    {"pow", "torch.pow(x, y)", 2, kF | kLowF},
    {"pow_2", "x ** 2", 1, kF | kLowF | kI, true, false, true},
    {"pow_3", "x ** 3", 1, kF | kLowF},
    {"pow_half", "x ** 0.5", 1, kF | kLowF},
    {"pow_neg_half", "x ** -0.5", 1, kF | kLowF},
    {"pow_neg_1", "x ** -1", 1, kF | kLowF},
    {"pow_neg_2", "x ** -2", 1, kF | kLowF},
    {"pow_2_5", "x ** 2.5", 1, kF | kLowF},
    {"minimum", "torch.minimum(x, y)", 2, kF | kLowF | kI | kB},
    {"maximum", "torch.maximum(x, y)", 2, kF | kLowF | kI | kB},
    {"lerp", "torch.lerp(x, y, 0.3)", 2, kF | kLowF},
    {"lerp_tensor", "torch.lerp(x, y, z)", 3, kF | kLowF},
    {"addcmul", "torch.addcmul(x, y, z, value=0.5)", 3, kF | kLowF | kI},
    {"addcdiv", "torch.addcdiv(x, y, z, value=0.5)", 3, kF | kLowF},
    {"neg", "torch.neg(x)", 1, kF | kLowF | kI},
    {"abs", "torch.abs(x)", 1, kF | kLowF | kI},
    {"sign", "torch.sign(x)", 1, kF | kLowF | kI | kB},
    {"floor", "torch.floor(x)", 1, kF | kLowF | kI},
    {"ceil", "torch.ceil(x)", 1, kF | kLowF | kI},
    {"round", "torch.round(x)", 1, kF | kLowF | kI},
    {"trunc", "torch.trunc(x)", 1, kF | kLowF | kI},
    {"reciprocal", "torch.reciprocal(x)", 1, kF | kLowF | kI},
    {"exp", "torch.exp(x)", 1, kF | kLowF | kI},
    {"exp2", "torch.exp2(x)", 1, kF | kLowF | kI},
    {"log", "torch.log(x)", 1, kF | kLowF | kI},
    {"log2", "torch.log2(x)", 1, kF | kLowF},
    {"log1p", "torch.log1p(x)", 1, kF | kLowF},
    {"expm1", "torch.expm1(x)", 1, kF | kLowF},
    {"sqrt", "torch.sqrt(x)", 1, kF | kLowF | kI},
    {"rsqrt", "torch.rsqrt(x)", 1, kF | kLowF},
    {"sin", "torch.sin(x)", 1, kF | kLowF | kI},
    {"cos", "torch.cos(x)", 1, kF | kLowF},
    {"tan", "torch.tan(x)", 1, kF | kLowF},
    {"tanh", "torch.tanh(x)", 1, kF | kLowF | kI},
    {"sigmoid", "torch.sigmoid(x)", 1, kF | kLowF | kI},
    {"erf", "torch.erf(x)", 1, kF | kLowF},
    {"relu", "torch.relu(x)", 1, kF | kLowF | kI},
    {"leaky_relu", "torch.leaky_relu(x, 0.2)", 1, kF | kLowF},
    {"gelu", "torch.gelu(x)", 1, kF | kLowF},
    {"gelu_tanh", "torch.gelu(x, approximate='tanh')", 1, kF | kLowF},
    {"silu", "torch.silu(x)", 1, kF | kLowF},
    {"mish", "torch.mish(x)", 1, kF | kLowF},
    {"hardtanh", "torch.hardtanh(x, -0.5, 0.5)", 1, kF | kLowF},
    {"hardswish", "torch.hardswish(x)", 1, kF | kLowF},
    {"hardsigmoid", "torch.hardsigmoid(x)", 1, kF | kLowF},
    {"softplus", "torch.softplus(x, 2.0, 3.0)", 1, kF | kLowF},
    {"elu", "torch.elu(x, 0.7)", 1, kF | kLowF},
    {"clamp", "torch.clamp(x, -0.5, 0.5)", 1, kF | kLowF | kI},
    {"clamp_min_only", "torch.clamp(x, min=0.25)", 1, kF | kLowF},
    {"clamp_min", "torch.clamp_min(x, -1)", 1, kF | kLowF | kI},
    {"clamp_max", "torch.clamp_max(x, 1)", 1, kF | kLowF | kI},
    {"where", "torch.where(x > y, x, y)", 2, kF | kLowF | kI},
    {"where_scalar", "torch.where(x > 0, x, 0.5)", 1, kF | kLowF},
    {"where_scalars", "torch.where(x > 0, 1.0, -1.0)", 1, kF | kI},
    {"masked_fill", "x.masked_fill(y > 0, 2.0)", 2, kF | kLowF},
    {"masked_fill_tensor", "x.masked_fill(y > 0, torch.tensor(-1.0))", 2, kF},
    {"eq", "x == y", 2, kF | kLowF | kI | kB},
    {"ne_scalar", "x != 0", 1, kF | kLowF | kI},
    {"lt", "x < y", 2, kF | kLowF | kI},
    {"le_scalar", "x <= 0.5", 1, kF | kLowF | kI},
    {"gt", "x > y", 2, kF | kLowF | kI | kB},
    {"ge_scalar", "x >= -1", 1, kF | kLowF | kI},
    {"logical_and", "torch.logical_and(x, y)", 2, kF | kI | kB},
    {"logical_or", "torch.logical_or(x, y)", 2, kF | kI | kB},
    {"logical_xor", "torch.logical_xor(x, y)", 2, kF | kI | kB},
    {"logical_not", "torch.logical_not(x)", 1, kF | kI | kB},
    {"bitwise_and", "x & y", 2, kI | kB},
    {"bitwise_or", "x | y", 2, kI | kB},
    {"bitwise_xor", "x ^ y", 2, kI | kB},
    {"bitwise_and_scalar", "x & 3", 1, kI},
    {"bitwise_not", "~x", 1, kI | kB},
    {"to_f16", "x.half()", 1, kF | kLowF | kI | kB},
    {"to_bf16", "x.to(15)", 1, kF | kLowF | kI | kB},
    {"to_f32", "x.float()", 1, kF | kLowF | kI | kB},
    {"to_i32", "x.int()", 1, kF | kLowF | kI | kB, /*specials=*/false},
    {"to_bool", "x.to(11)", 1, kF | kLowF | kI},
    {"type_as", "x.type_as(y)", 2, kF | kLowF | kI},
    {"type_as_bool", "x.type_as(y > 0)", 2, kF | kLowF | kI},
    {"chain", "torch.sigmoid(x * y + 1.0) - torch.tanh(x) * 0.5", 2, kF | kLowF},
    {"mixed_promotion", "(x + y.double()) * 2", 2, kF | kLowF | kI},
    // Overloads the cases above do not reach (OpTableCoverage in ops_test.cpp names any op of the table
    // no case runs).
    {"rsub_scalar_alpha", "torch.rsub(x, 2.0, alpha=3)", 1, kF | kLowF | kI},
    {"fmod_scalar", "torch.fmod(x, -1.5)", 1, kF | kLowF},
    {"where_scalar_self", "torch.where(x > 0, 0.5, x)", 1, kF | kLowF},
    {"ne", "x != y", 2, kF | kLowF | kI | kB},
    {"lt_scalar", "x < 0.5", 1, kF | kLowF | kI},
    {"le", "x <= y", 2, kF | kLowF | kI},
    {"ge", "x >= y", 2, kF | kLowF | kI | kB},
    {"bitwise_and_fn", "torch.bitwise_and(x, y)", 2, kI | kB},
    {"bitwise_and_fn_scalar", "torch.bitwise_and(x, 3)", 1, kI},
    {"bitwise_or_fn", "torch.bitwise_or(x, y)", 2, kI | kB},
    {"bitwise_or_fn_scalar", "torch.bitwise_or(x, 3)", 1, kI},
    {"bitwise_xor_fn", "torch.bitwise_xor(x, y)", 2, kI | kB},
    {"bitwise_xor_fn_scalar", "torch.bitwise_xor(x, 3)", 1, kI},
    {"bitwise_or_scalar", "x | 3", 1, kI},
    {"bitwise_xor_scalar", "x ^ 3", 1, kI},
};

inline std::vector<at::ScalarType> dtypes_of(unsigned set) {
  std::vector<at::ScalarType> out;
  if (set & kF) out.insert(out.end(), {at::kFloat, at::kDouble});
  if (set & kLowF) out.insert(out.end(), {at::kHalf, at::kBFloat16});
  if (set & kI) out.insert(out.end(), {at::kInt, at::kLong});
  if (set & kB) out.push_back(at::kBool);
  return out;
}

// Values: random, with NaN, +-Inf, +-0 among the first elements of float tensors.
inline at::Tensor values(std::vector<int64_t> sizes, at::ScalarType t, bool specials, int salt, bool nonzero_int = false) {
  at::manual_seed(1234 + salt);
  at::Tensor v;
  if (at::isFloatingType(t)) {
    v = at::randn(sizes, at::kDouble) * 3;
    if (specials && v.numel() >= 8) {
      auto f = v.view({-1});
      double sp[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.0, -1.0, 0.5};
      for (int i = 0; i < 8; ++i) f[(i * 7 + salt) % f.numel()] = sp[i];
    }
  } else if (t == at::kBool) {
    v = at::randint(0, 2, sizes);
  } else {
    v = at::randint(-8, 9, sizes);
    if (nonzero_int) v = at::where(v.eq(0), at::ones_like(v), v);
  }
  return v.to(t);
}

// One layout: the inputs of one application of the op.
struct Layout {
  const char* name;
  std::function<std::vector<at::Tensor>(at::ScalarType, int arity, bool specials, bool nz)> make;
};

inline std::vector<Layout> layouts() {
  auto same = [](std::vector<int64_t> s) {
    return [s](at::ScalarType t, int arity, bool sp, bool nz) {
      std::vector<at::Tensor> v;
      for (int i = 0; i < arity; ++i) v.push_back(values(s, t, sp, i, nz));
      return v;
    };
  };
  return {
      {"contiguous", same({5, 7})},
      {"broadcast_row",
       [](at::ScalarType t, int a, bool sp, bool nz) {
         std::vector<at::Tensor> v{values({5, 7}, t, sp, 0, nz)};
         for (int i = 1; i < a; ++i) v.push_back(values({7}, t, sp, i, nz));
         return v;
       }},
      {"transposed",
       [](at::ScalarType t, int a, bool sp, bool nz) {
         std::vector<at::Tensor> v{values({7, 5}, t, sp, 0, nz).t()};
         for (int i = 1; i < a; ++i) v.push_back(values({1, 7}, t, sp, i, nz));
         return v;
       }},
      {"sliced_offset",
       [](at::ScalarType t, int a, bool sp, bool nz) {
         std::vector<at::Tensor> v{values({6, 9}, t, sp, 0, nz).slice(0, 1).slice(1, 2)};
         for (int i = 1; i < a; ++i) v.push_back(values({}, t, sp, i, nz));
         return v;
       }},
      {"expanded",
       [](at::ScalarType t, int a, bool sp, bool nz) {
         std::vector<at::Tensor> v{values({1, 7}, t, sp, 0, nz).expand({5, 7})};
         for (int i = 1; i < a; ++i) v.push_back(values({5, 1}, t, sp, i, nz));
         return v;
       }},
      {"size0", same({0, 7})},
      {"zero_dim", same({})},
      {"size1", same({1, 1})},
      {"large_transposed",  // more elements than one parallel chunk, inner dim not a vector multiple
       [](at::ScalarType t, int a, bool sp, bool nz) {
         std::vector<at::Tensor> v{values({300, 257}, t, sp, 0, nz)};
         for (int i = 1; i < a; ++i) v.push_back(values({257, 300}, t, sp, i, nz).t());
         return v;
       }},
  };
}

// `expr` with the one-letter variable `var` (not a letter of a longer name) replaced by `name`.
inline std::string rename_var(const std::string& expr, char var, const std::string& name) {
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  std::string out;
  for (size_t i = 0; i < expr.size(); ++i) {
    bool alone = (i == 0 || !ident(expr[i - 1])) && (i + 1 == expr.size() || !ident(expr[i + 1]));
    out += expr[i] == var && alone ? name : std::string(1, expr[i]);
  }
  return out;
}

// The module applying the op to every layout: forward(x0, y0, x1, y1, ...) returns one result per layout.
inline torch::jit::Module corpus_module(const OpCase& c) {
  auto ls = layouts();
  std::string args, body = "    return (";
  for (size_t l = 0; l < ls.size(); ++l) {
    std::string e = c.expr;
    for (int a = 0; a < c.arity; ++a) {
      std::string name = std::string(1, "xyz"[a]) + std::to_string(l);
      args += (args.empty() ? "" : ", ") + name;
      e = rename_var(e, "xyz"[a], name);
    }
    body += e + ", ";
  }
  body += ")";
  return script(args, body);
}

// The inputs of corpus_module(c) for dtype t.
inline std::vector<c10::IValue> corpus_inputs(const OpCase& c, at::ScalarType t) {
  std::vector<c10::IValue> inputs;
  for (const auto& l : layouts())
    for (auto& x : l.make(t, c.arity, c.specials, c.nonzero_int)) inputs.emplace_back(x);
  return inputs;
}

// Every op case that accepts dtype `t` in one module (the tests of sizes as kernel arguments): forward(x,
// y, z, u, v, w) over x [2, n], y [n] (broadcast) and z [n, 2]^T (transposed) with NaN, +-Inf and +-0 among
// float values; cases that take no special values read u, v, w (the same without them). `*cases`
// receives how many cases it holds.
inline torch::jit::Module all_cases_module(at::ScalarType t, int* cases) {
  std::string body = "    return (";
  *cases = 0;
  for (const OpCase& c : kCases) {
    auto ds = dtypes_of(c.dtypes);
    if (std::find(ds.begin(), ds.end(), t) == ds.end()) continue;
    std::string e = c.expr;
    for (int a = 0; a < c.arity; ++a) e = rename_var(e, "xyz"[a], std::string(1, (c.specials ? "xyz" : "uvw")[a]));
    body += e + ", ";
    ++*cases;
  }
  return script("x, y, z, u, v, w", body + ")");
}

// The inputs of all_cases_module(t) at size n.
inline std::vector<c10::IValue> all_cases_inputs(at::ScalarType t, int64_t n) {
  const bool nz = at::isIntegralType(t, false);  // integer division by 0 raises in eager
  std::vector<c10::IValue> in;
  for (int sp = 1; sp >= 0; --sp) {
    in.emplace_back(values({2, n}, t, sp, 3 * sp, nz));
    in.emplace_back(values({n}, t, sp, 3 * sp + 1, nz));
    in.emplace_back(values({n, 2}, t, sp, 3 * sp + 2, nz).t());
  }
  return in;
}

}  // namespace fusion_jit::testing
