// The rule set "fold" (Note [Convolution rules], passes/conv_common.h): batch_norm, and a product,
// quotient, sum or difference with a frozen constant, folded into a frozen convolution's or linear's
// weight and bias.
#include <cmath>
#include <utility>

#include "passes/conv_common.h"

namespace fusion_jit {
namespace conv_rules {
namespace {

// W OP by, typed as W is, strides included: in a channels-last plan the weight is channels-last, the product
// (TensorIterator follows W's layout) is too, and the convolution's result keeps the layout the plan was
// captured with. (A folded constant takes the strides of its type: typed contiguous, the weight would
// make the convolution write NCHW where the plan expects NHWC.)
Value* scaled_weight(Builder& r, const std::string& schema, Value* weight, Arg by) {
  return r.node(schema, {Arg::of(weight), std::move(by)}, {weight->type()})->output();
}

bool floating32_or_64(const Value* v) {
  const DType d = v->tensor_type().dtype;
  return d == DType::kFloat32 || d == DType::kFloat64;
}

// A binary or batch_norm fold's new weight and bias (Note [Convolution rules]): one value per output channel
// (the weight's dim 0: a conv's output channels, a linear's rows).
struct Folded {
  Value* weight;
  Value* bias;  // a new bias where there was none and the fold shifts
};

// batch_norm(y, gamma, beta, mean, var, training = false, momentum, eps, cudnn) over the result y of a
// layer with `weight` (output channels in dim 0) and `bias` (nullptr: none), all frozen: W * s and
// (b - mean) * s + beta, s = gamma * rsqrt(var + eps); nullopt where bn is not in inference mode or its
// statistics, weight and bias are not frozen constants of [channels] in the result's dtype.
std::optional<Folded> batch_norm_fold(Builder& r, const Node* bn, Value* weight, Value* bias) {
  const auto& a = bn->args();
  if (a.size() != 9 || !is_literal(a[5], false) || a[7].is_value()) return std::nullopt;  // inference mode
  const Value* out = bn->output();
  if (!floating32_or_64(weight) || !floating32_or_64(out)) return std::nullopt;
  if (weight->tensor_type().dtype != out->tensor_type().dtype) return std::nullopt;
  const std::optional<double> eps = as_double(a[7].literal);
  if (!eps) return std::nullopt;
  // gamma and beta may be absent (None); the statistics may not.
  auto constant_or_none = [](const Arg& x, Value** v) {
    if (x.is_value()) {
      *v = x.value;
      return is_constant(x.value) && x.value->is_tensor();
    }
    *v = nullptr;
    return std::holds_alternative<None>(x.literal);
  };
  Value *gamma, *beta, *mean, *var;
  if (!constant_or_none(a[1], &gamma) || !constant_or_none(a[2], &beta) || !constant_or_none(a[3], &mean) ||
      !constant_or_none(a[4], &var) || !mean || !var)
    return std::nullopt;
  const int64_t channels = weight->tensor_type().sizes.at(0);
  for (const Value* p : std::initializer_list<const Value*>{gamma, beta, mean, var, bias})
    if (p && (p->tensor_type().sizes != std::vector<int64_t>{channels} ||
              p->tensor_type().dtype != out->tensor_type().dtype))
      return std::nullopt;
  Value* scale = r.unary("aten::rsqrt", r.add_scalar(var, *eps));
  if (gamma) scale = r.mul(scale, gamma);
  std::vector<int64_t> per_channel(weight->tensor_type().dim(), 1);
  per_channel[0] = channels;
  Value* shift = r.mul(bias ? r.sub(bias, mean) : r.unary("aten::neg", mean), scale);
  return Folded{scaled_weight(r, "aten::mul.Tensor", weight, Arg::of(r.reshape(scale, per_channel))),
                beta ? r.add(shift, beta) : shift};
}

// batch_norm(conv(x, W, b), ...) with frozen parameters -> conv(x, W * s, (b - mean) * s + beta).
Replacement conv_bn(const Match& m, Builder& r) {
  auto conv = as_conv(m.value("conv")->producer());
  if (!conv || !frozen(conv->weight) || (conv->bias && !frozen(conv->bias)) || !floating32_or_64(conv->x)) return {};
  auto f = batch_norm_fold(r, m.root, conv->weight, conv->bias);
  if (!f) return {};
  std::vector<Arg> args = conv->node->args();
  args[1] = Arg::of(f->weight);
  args[2] = Arg::of(f->bias);
  return {r.node(conv->node->schema(), std::move(args), {m.root->output()->type()})->output()};
}

// A [channels] tensor of `value` made from the weight (a node on a constant: folded once).
Value* filled(Builder& r, Value* weight, int64_t channels, double value) {
  return r.op("aten::new_full", {Arg::of(weight), Arg::lit(std::vector<int64_t>{channels}), Arg::lit(value),
                                 Arg::lit(None{}), Arg::lit(None{}), Arg::lit(None{}), Arg::lit(None{})},
              weight->tensor_type().dtype, {channels});
}

// With a frozen tensor `c` of [k] (k: 1 or `channels`), viewed as `c_shape` to scale the weight.
Folded fold_tensor(Builder& r, const std::string& op, Value* weight, Value* bias, int64_t channels, Value* c,
                   const std::vector<int64_t>& c_shape) {
  if (op == "mul") return {scaled_weight(r, "aten::mul.Tensor", weight, Arg::of(r.reshape(c, c_shape))),
                           bias ? r.mul(bias, c) : nullptr};
  Value* shift = c->tensor_type().sizes == std::vector<int64_t>{channels} ? c : r.mul(filled(r, weight, channels, 1.0), c);
  if (op == "sub") shift = r.unary("aten::neg", shift);
  return {weight, bias ? r.add(bias, shift) : shift};
}

// With a number literal: nullopt where it is not a finite number, or is a divisor of 0.
std::optional<Folded> fold_number(Builder& r, const std::string& op, Value* weight, Value* bias, int64_t channels,
                                  const Literal& literal) {
  const std::optional<double> number = as_double(literal);
  if (!number || !std::isfinite(*number) || (op == "div" && *number == 0.0)) return std::nullopt;
  if (op == "add" || op == "sub") {
    Value* shift = filled(r, weight, channels, op == "sub" ? -*number : *number);
    return Folded{weight, bias ? r.add(bias, shift) : shift};
  }
  const std::string schema = op == "mul" ? "aten::mul.Scalar" : "aten::div.Scalar";
  return Folded{scaled_weight(r, schema, weight, Arg::lit(*number)),
                bias ? r.op(schema, {Arg::of(bias), Arg::lit(*number)}, weight->tensor_type().dtype, {channels}) : nullptr};
}

// conv(x, W, b) OP c -> conv(x, W', b') (fold.conv_mul, conv_div, conv_add, conv_sub; Note [Convolution
// rules]). `c`: a frozen tensor of the result's dtype holding one value per output channel or one value
// (after right alignment every dim is 1 but the channel dim, which may be C), or a finite number (Scalar
// overloads). mul and div scale W and b; add and sub shift b (a zero bias where there was none).
Replacement conv_binary(const Match& m, Builder& r, const std::string& op) {
  Node* n = m.root;
  Value* y = m.value("conv");
  auto conv = as_conv(y->producer());
  // frozen(): a weight another fold computed from constants (constant_fold evaluates the chain once).
  if (!conv || !frozen(conv->weight) || (conv->bias && !frozen(conv->bias))) return {};
  const TensorType& ty = y->tensor_type();
  const TensorType& to = n->output()->tensor_type();
  if (!floating32_or_64(y) || to.dtype != ty.dtype || to.sizes != ty.sizes || ty.dim() < 3) return {};
  if (conv->weight->tensor_type().dtype != ty.dtype) return {};
  if (op == "add" || op == "sub") {
    const Arg* alpha = m.arg("alpha");
    if (alpha && !is_literal(*alpha, int64_t{1}) && !is_literal(*alpha, 1.0)) return {};
  }
  const int64_t channels = conv->weight->tensor_type().sizes.at(0);
  const Arg* operand = m.arg("c");
  if (!operand) return {};
  std::optional<Folded> f;
  if (operand->is_value()) {
    Value* v = operand->value;
    if (!v->is_tensor() || !frozen(v) || v->tensor_type().dtype != ty.dtype) return {};
    if (op == "div") return {};  // a zero in c: eager's y / 0 is inf or nan per element, W / 0 inside the sum differs
    const TensorType& tc = v->tensor_type();
    if (tc.dim() > ty.dim()) return {};
    int64_t k = 1;
    for (int64_t i = 1; i <= tc.dim(); ++i) {
      const int64_t size = tc.sizes[tc.dim() - i];
      const bool channel_dim = ty.dim() - i == 1;
      if (size != 1 && !(channel_dim && size == channels)) return {};
      if (size == channels && channel_dim) k = channels;
    }
    std::vector<int64_t> per_channel(conv->weight->tensor_type().dim(), 1);
    per_channel[0] = k;
    f = fold_tensor(r, op, conv->weight, conv->bias, channels, r.reshape(v, {k}), per_channel);
  } else {
    f = fold_number(r, op, conv->weight, conv->bias, channels, operand->literal);
  }
  if (!f) return {};
  Value *weight = f->weight, *bias = f->bias;
  std::vector<Arg> args = conv->node->args();
  args[1] = Arg::of(weight);
  args[2] = bias ? Arg::of(bias) : Arg::lit(None{});
  return {r.node(conv->node->schema(), std::move(args), {n->output()->type()})->output()};
}

// The linear `l` on a new weight and bias: `weight` in W's form ([N, K]) where `l` was given W or t(W) of a
// frozen W (addmm then gets t(weight)), in t(W)'s form otherwise.
Value* relinear(Builder& r, const Linear& l, Value* weight, Value* bias) {
  std::vector<Arg> args = l.node->args();
  if (l.node->schema() == "aten::linear") {
    args[1] = Arg::of(weight);
    args[2] = bias ? Arg::of(bias) : Arg::lit(None{});
  } else {  // addmm(b, x, t(W))
    const TensorType& wt = weight->tensor_type();
    args[0] = Arg::of(bias);
    args[2] = Arg::of(l.weight ? r.op("aten::t", {Arg::of(weight)}, wt.dtype, {wt.sizes[1], wt.sizes[0]}) : weight);
  }
  return r.node(l.node->schema(), std::move(args), {l.node->output()->type()})->output();
}

// linear(x, W, b) OP c, or OP of the linear's view -> the linear on W', b' (fold.linear_mul, linear_div,
// linear_add, linear_sub): `c` a frozen tensor of the result's dtype holding one value per output feature
// (every dim 1 but the last, which may be N) or one value, or a finite number; as conv_binary, with the
// feature dim last. torch.compile's addmm holds t(W): its columns are scaled.
Replacement linear_binary(const Match& m, Builder& r, const std::string& op) {
  Node* n = m.root;
  Value* in = m.value("lin");
  if (in->producer()->schema() == "aten::view" || in->producer()->schema() == "aten::reshape") {
    in = in->producer()->value_inputs().at(0);
    if (!in->producer() || r.users(in).size() != 1 || r.returned(in)) return {};
  }
  auto l = as_linear(in->producer());
  if (!l) return {};
  const Value* w = l->weight ? l->weight : l->weight_t;
  if (!frozen(w) || (l->bias && !frozen(l->bias))) return {};
  const TensorType& ty = in->tensor_type();
  const TensorType& to = n->output()->tensor_type();
  if (!floating32_or_64(in) || to.dtype != ty.dtype || w->tensor_type().dtype != ty.dtype) return {};
  if (to.sym_extent() != ty.sym_extent() || to.sizes.empty() || to.sizes.back() != ty.sizes.back()) return {};
  if (op == "add" || op == "sub") {
    const Arg* alpha = m.arg("alpha");
    if (alpha && !is_literal(*alpha, int64_t{1}) && !is_literal(*alpha, 1.0)) return {};
  }
  const int64_t features = ty.sizes.back();
  const Arg* operand = m.arg("c");
  if (!operand) return {};
  std::optional<Folded> f;
  Value* w0 = l->weight ? l->weight : l->weight_t;
  if (operand->is_value()) {
    Value* v = operand->value;
    if (!v->is_tensor() || !frozen(v) || v->tensor_type().dtype != ty.dtype || op == "div") return {};
    const TensorType& tc = v->tensor_type();
    if (tc.dim() > to.dim()) return {};
    for (int64_t i = 0; i + 1 < tc.dim(); ++i)
      if (tc.sizes[i] != 1) return {};
    const int64_t k = tc.dim() ? static_cast<int64_t>(tc.sizes.back()) : 1;
    if (k != 1 && k != features) return {};
    // W [N, K] scaled by row, t(W) [K, N] by column.
    f = fold_tensor(r, op, w0, l->bias, features, r.reshape(v, {k}),
                    l->weight ? std::vector<int64_t>{k, 1} : std::vector<int64_t>{1, k});
  } else {
    f = fold_number(r, op, w0, l->bias, features, operand->literal);
  }
  if (!f) return {};
  Value *weight = f->weight, *bias = f->bias;
  Value* y = relinear(r, *l, weight, bias);
  return {to.sizes == ty.sizes ? y : r.reshape(y, to.sizes)};
}

// batch_norm(linear(x, W, b), ...) with frozen parameters and a 2-d result (BatchNorm1d's channels are then
// the linear's output features) -> linear(x, W * s, (b - mean) * s + beta) (fold.linear_bn).
Replacement linear_bn(const Match& m, Builder& r) {
  auto l = as_linear(m.value("lin")->producer());
  if (!l || !l->weight || m.root->output()->tensor_type().dim() != 2) return {};
  if (!frozen(l->weight) || (l->bias && !frozen(l->bias)) || !floating32_or_64(l->x)) return {};
  auto f = batch_norm_fold(r, m.root, l->weight, l->bias);
  if (!f) return {};
  return {relinear(r, *l, f->weight, f->bias)};
}

RuleSet make_fold_rules() {
  RuleSet set{"fold", {{"conv_bn", Pattern::op({"aten::batch_norm"}, {conv_output()}).outputs(1), conv_bn}}};
  const Pattern c = Pattern::any().bind("c");
  const Pattern alpha = Pattern::any().bind("alpha");
  auto binary = [](const char* op) {
    return [op](const Match& m, Builder& b) { return conv_binary(m, b, op); };
  };
  set.rules.push_back(
      {"conv_mul", Pattern::op({"aten::mul.Tensor", "aten::mul.Scalar"}, {conv_output(), c}).commutative(), binary("mul")});
  set.rules.push_back(
      {"conv_div", Pattern::op({"aten::div.Tensor", "aten::div.Scalar"}, {conv_output(), c}), binary("div")});
  set.rules.push_back({"conv_add",
                       Pattern::op({"aten::add.Tensor", "aten::add.Scalar"}, {conv_output(), c, alpha}).commutative(),
                       binary("add")});
  set.rules.push_back({"conv_sub", Pattern::op({"aten::sub.Tensor", "aten::sub.Scalar"}, {conv_output(), c, alpha}),
                       binary("sub")});
  set.rules.push_back({"linear_bn",
                       Pattern::op({"aten::batch_norm"},
                                   {Pattern::op({"aten::linear", "aten::addmm"}).single_use().bind("lin")})
                           .outputs(1),
                       linear_bn});
  const Pattern lin =
      Pattern::op({"aten::linear", "aten::addmm", "aten::view", "aten::reshape"}).single_use().bind("lin");
  auto linear = [](const char* op) {
    return [op](const Match& m, Builder& b) { return linear_binary(m, b, op); };
  };
  set.rules.push_back(
      {"linear_mul", Pattern::op({"aten::mul.Tensor", "aten::mul.Scalar"}, {lin, c}).commutative(), linear("mul")});
  set.rules.push_back({"linear_div", Pattern::op({"aten::div.Tensor", "aten::div.Scalar"}, {lin, c}), linear("div")});
  set.rules.push_back(
      {"linear_add", Pattern::op({"aten::add.Tensor", "aten::add.Scalar"}, {lin, c, alpha}).commutative(), linear("add")});
  set.rules.push_back({"linear_sub", Pattern::op({"aten::sub.Tensor", "aten::sub.Scalar"}, {lin, c, alpha}),
                       linear("sub")});
  return set;
}

}  // namespace
}  // namespace conv_rules

const RuleSet& fold_rules() {
  static const RuleSet set = conv_rules::make_fold_rules();
  return set;
}

}  // namespace fusion_jit
