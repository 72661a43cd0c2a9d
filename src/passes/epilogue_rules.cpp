// The rule set "epilogue" (Note [Convolution rules], passes/conv_common.h): an activation, or a residual
// add, over a frozen convolution or linear as the library call's post-op: oneDNN's on the CPU, cuBLASLt's
// and cuDNN's on CUDA.
#include <string>

#include "passes/conv_common.h"

namespace fusion_jit {
namespace conv_rules {
namespace {

// activation(conv(x, W, b)) -> mkldnn::_convolution_pointwise(x, W, b, padding, stride, dilation, groups,
// attr, scalars, algorithm): oneDNN's unary post-op `attr`, with leaky_relu's slope and hardtanh's bounds
// (relu6: [0, 6]) as its scalars and gelu's approximation as its algorithm.
Replacement conv_pointwise(const Match& m, Builder& r, const char* attr) {
  if (g_schema_probe && !g_schema_probe("mkldnn::_convolution_pointwise")) return {};
  Node* act = m.root;
  auto conv = as_conv(m.value("conv")->producer());
  if (!conv) return {};
  std::string why;
  if (!onednn_conv(*conv, act->output(), &why)) return why.empty() ? Replacement{} : r.decline(why);
  auto post = post_op_args(act, attr);
  if (!post) return {};
  return {onednn_call(r, *conv, act->output(), "mkldnn::_convolution_pointwise", nullptr, std::move(*post))};
}

// activation(linear) or activation(view(linear)) -> mkldnn::_linear_pointwise with the activation as post-op.
Replacement linear_pointwise(const Match& m, Builder& r, const char* attr) {
  if (g_schema_probe && !g_schema_probe("mkldnn::_linear_pointwise")) return {};
  Node* act = m.root;
  Value* in = nullptr;
  auto l = linear_read_by(m, r, &in);
  if (!l || !same_strides(act->output()->tensor_type(), contiguous_strides(act->output()->tensor_type().sizes)))
    return {};
  std::string why;
  if (!onednn_linear(*l, in, &why)) return why.empty() ? Replacement{} : r.decline(why);
  if (std::string(attr) == "gelu" && l->x->tensor_type().dtype == DType::kFloat32 &&
      (!g_schema_probe || g_schema_probe("mkl::_mkl_linear"))) {
    const TensorType& x = l->x->tensor_type();
    const int64_t k = x.sizes.back();
    std::string times;
    if (!onednn_gemm_chosen(rows_at_hint(x), k, in->tensor_type().sizes.back(), l->bias != nullptr, true, &times)
             .value_or(false))
      return r.decline("float32 gelu: MKL's packed GEMM (prepack.linear_mkl) and our kernel, faster than oneDNN's "
                       "gelu post-op on this project's Intel machines" +
                       (times.empty() ? std::string() : " (measured here: " + times + ")"));
  }
  auto post = post_op_args(act, attr);
  if (!post) return {};
  return {onednn_linear_call(r, *l, act->output(), std::move(*post))};
}

// add(conv(x, W, b), other) [-> relu] -> mkldnn::_convolution_pointwise.binary(x, other, W, b, padding,
// stride, dilation, groups, "add", None, "relu" | None, [], None): the residual add of a ResNet block.
// `other` has the result's sizes, dtype and contiguous layout (no broadcasting); add's alpha is 1.
Replacement conv_add(const Match& m, Builder& r, bool relu) {
  if (g_schema_probe && !g_schema_probe("mkldnn::_convolution_pointwise.binary")) return {};
  Node* root = m.root;
  Node* add = relu ? m.value("sum")->producer() : root;
  // Without the relu: declined when a relu is the add's only user, for conv_add_relu to take both.
  if (!relu) {
    const auto users = r.users(add->output());
    if (users.size() == 1 && users[0]->schema() == "aten::relu") return {};
  }
  const Arg* alpha = m.arg("alpha");
  if (alpha && !is_literal(*alpha, int64_t{1}) && !is_literal(*alpha, 1.0)) return {};
  auto conv = as_conv(m.value("conv")->producer());
  if (!conv || !onednn_conv(*conv, root->output())) return {};
  const Value* other = m.value("other");
  const TensorType& o = other->tensor_type();
  const TensorType& y = root->output()->tensor_type();
  if (o.sizes != y.sizes || o.dtype != y.dtype || o.device != y.device || !same_strides(o, y.strides)) return {};
  if (y.dtype != DType::kFloat32) return {};  // bfloat16: ATen's add_relu post-op has no bfloat16 kernel
  return {onednn_call(r, *conv, root->output(), "mkldnn::_convolution_pointwise.binary", m.value("other"),
                      {Arg::lit(std::string("add")), Arg::lit(None{}),
                       relu ? Arg::lit(std::string("relu")) : Arg::lit(None{}), Arg::lit(std::vector<int64_t>{}),
                       Arg::lit(None{})})};
}

// ---- CUDA epilogues (Note [Convolution rules], epilogue.cuda_*) ----

// The activation a CUDA epilogue takes: relu, or (for cuBLASLt) gelu with the tanh approximation; a
// reason where `act` is a gelu it cannot take.
std::string cuda_gelu_mismatch(const Node* act) {
  const auto& ga = act->args();
  const std::string approximate =
      ga.size() > 1 && !ga[1].is_value() && std::holds_alternative<std::string>(ga[1].literal)
          ? std::get<std::string>(ga[1].literal)
          : "none";
  return approximate == "tanh" ? "" : "cuBLASLt's GELU epilogue is the tanh approximation; this gelu is exact";
}

// relu or gelu(tanh) of a linear on CUDA (or of its view) -> aten::_addmm_activation(b, x2d, t(W), 1, 1,
// use_gelu), viewed back: cuBLASLt's bias + activation epilogue (ATen falls back to addmm and the
// activation where cuBLASLt cannot take the shapes).
Replacement cuda_linear_activation(const Match& m, Builder& r, bool gelu) {
  if (g_schema_probe && !g_schema_probe("aten::_addmm_activation")) return {};
  Node* act = m.root;
  Value* in = nullptr;
  auto l = linear_read_by(m, r, &in);
  if (!l) return {};
  const TensorType& x = l->x->tensor_type();
  if (x.device != Device::kCUDA) return {};
  if (gelu) {
    const std::string why = cuda_gelu_mismatch(act);
    if (!why.empty()) return r.decline(why);
  }
  const TensorType& y = act->output()->tensor_type();
  const Value* w = l->weight ? l->weight : l->weight_t;
  const TensorType& wt = w->tensor_type();
  if (!is_floating(x.dtype) || wt.dtype != x.dtype || y.dtype != x.dtype ||
      (l->bias && l->bias->tensor_type().dtype != x.dtype))
    return r.decline("the linear's input, weight, bias and result do not share one floating dtype");
  if (!l->bias) return r.decline("a linear without bias (cuBLASLt's epilogue adds one)");
  const int64_t k = x.sizes.back(), n = l->weight ? wt.sizes[0] : wt.sizes[1];
  if (x.dim() < 2 || wt.dim() != 2 || l->bias->tensor_type().sizes != std::vector<int64_t>{n}) return {};
  if (!same_strides(x, contiguous_strides(x.sizes)) || !same_strides(y, contiguous_strides(y.sizes)))
    return r.decline("a non-contiguous input or result");
  const int64_t rows = x.numel() / k;
  Value* x2 = x.dim() == 2 ? l->x : r.reshape(l->x, {rows, k});
  Value* w_t = l->weight_t;
  if (!w_t) {
    w_t = r.op("aten::t", {Arg::of(l->weight)}, wt.dtype, {k, n});
    w_t->mutable_type().tensor->strides = {1, k};  // the transposed view of a contiguous [N, K] weight
  }
  Value* out = r.op("aten::_addmm_activation", {Arg::of(l->bias), Arg::of(x2), Arg::of(w_t), Arg::lit(int64_t{1}),
                                                Arg::lit(int64_t{1}), Arg::lit(gelu)},
                    x.dtype, {rows, n});
  return {out->tensor_type().sizes == y.sizes ? out : r.reshape(out, y.sizes)};
}

// relu(conv(x, W, b)) and relu(conv(x, W, b) + z) on CUDA -> aten::cudnn_convolution_relu(x, W, b, stride,
// padding, dilation, groups) and aten::cudnn_convolution_add_relu(x, W, z, 1, b, ...): one cuDNN call
// (conv, bias, residual and relu fused). 2-d convolutions, NCHW contiguous input, weight and result, z of
// the result's sizes, dtype and layout.
Replacement cuda_conv_relu(const Match& m, Builder& r, bool add) {
  const char* schema = add ? "aten::cudnn_convolution_add_relu" : "aten::cudnn_convolution_relu";
  if (g_schema_probe && !g_schema_probe(schema)) return {};
  Node* root = m.root;
  Value* z = nullptr;
  if (add) {
    const Arg* alpha = m.arg("alpha");
    if (alpha && !is_literal(*alpha, int64_t{1}) && !is_literal(*alpha, 1.0)) return {};
    z = m.value("other");
  }
  auto conv = as_conv(m.value("conv")->producer());
  if (!conv) return {};
  const TensorType& x = conv->x->tensor_type();
  const TensorType& y = root->output()->tensor_type();
  if (x.device != Device::kCUDA) return {};
  if (x.dim() != 4 || conv->weight->tensor_type().dim() != 4) return r.decline("not a 2-d convolution");
  if (!is_floating(x.dtype) || x.dtype == DType::kFloat64 || conv->weight->tensor_type().dtype != x.dtype ||
      y.dtype != x.dtype || (conv->bias && conv->bias->tensor_type().dtype != x.dtype))
    return r.decline("cuDNN's fused convolution takes float32, float16 or bfloat16 of one dtype");
  for (const TensorType* t : {&x, &conv->weight->tensor_type(), &y})
    if (!same_strides(*t, contiguous_strides(t->sizes))) return r.decline("a non-contiguous (NCHW) tensor");
  if (z) {
    const TensorType& o = z->tensor_type();
    if (o.sizes != y.sizes || o.dtype != y.dtype || o.device != y.device || !same_strides(o, y.strides))
      return r.decline("the residual does not have the result's sizes, dtype and layout");
  }
  for (const auto* l : {&conv->stride, &conv->padding, &conv->dilation})
    if (l->size() != 2) return {};
  std::vector<Arg> args = {Arg::of(conv->x), Arg::of(conv->weight)};
  if (z) {
    args.push_back(Arg::of(z));
    args.push_back(Arg::lit(int64_t{1}));
  }
  for (Arg a : {conv->bias ? Arg::of(conv->bias) : Arg::lit(None{}), Arg::lit(conv->stride), Arg::lit(conv->padding),
                Arg::lit(conv->dilation), Arg::lit(conv->groups)})
    args.push_back(std::move(a));
  return {r.node(schema, std::move(args), {root->output()->type()})->output()};
}

RuleSet make_epilogue_rules() {
  RuleSet set{"epilogue", {}};
  for (const Act& a : kActs) {
    const char* attr = a.attr;
    set.rules.push_back({a.rule, Pattern::op({a.schema}, {conv_output()}).outputs(1),
                         [attr](const Match& m, Builder& b) { return conv_pointwise(m, b, attr); }});
  }
  // linear_<act>: the same activations over a linear's result, or over a view of it (torch.compile's
  // graphs compute a 3-d linear as a view of a 2-d addmm); linear_pointwise looks through the view.
  for (const Act& a : kActs) {
    const char* attr = a.attr;
    set.rules.push_back({std::string("linear") + (a.rule + 4),  // conv_relu -> linear_relu
                         Pattern::op({a.schema}, {Pattern::tensor().bind("in")}).outputs(1),
                         [attr](const Match& m, Builder& b) { return linear_pointwise(m, b, attr); }});
  }
  const Pattern add = Pattern::op({"aten::add.Tensor"}, {conv_output(), Pattern::tensor().bind("other"),
                                                        Pattern::any().bind("alpha")})
                          .commutative();
  set.rules.push_back({"conv_add_relu", Pattern::op({"aten::relu"}, {add.single_use().bind("sum")}),
                       [](const Match& m, Builder& b) { return conv_add(m, b, true); }});
  set.rules.push_back({"conv_add", add, [](const Match& m, Builder& b) { return conv_add(m, b, false); }});
  // CUDA: cuBLASLt and cuDNN epilogues.
  set.rules.push_back({"cuda_linear_relu", Pattern::op({"aten::relu"}, {Pattern::tensor().bind("in")}).outputs(1),
                       [](const Match& m, Builder& b) { return cuda_linear_activation(m, b, false); }});
  set.rules.push_back({"cuda_linear_gelu", Pattern::op({"aten::gelu"}, {Pattern::tensor().bind("in")}).outputs(1),
                       [](const Match& m, Builder& b) { return cuda_linear_activation(m, b, true); }});
  set.rules.push_back({"cuda_conv_relu", Pattern::op({"aten::relu"}, {conv_output()}).outputs(1),
                       [](const Match& m, Builder& b) { return cuda_conv_relu(m, b, false); }});
  set.rules.push_back({"cuda_conv_add_relu", Pattern::op({"aten::relu"}, {add.single_use().bind("sum")}),
                       [](const Match& m, Builder& b) { return cuda_conv_relu(m, b, true); }});
  return set;
}

}  // namespace
}  // namespace conv_rules

const RuleSet& epilogue_rules() {
  static const RuleSet set = conv_rules::make_epilogue_rules();
  return set;
}

}  // namespace fusion_jit
