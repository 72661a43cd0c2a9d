// The rule set "prepack" (Note [Convolution rules], passes/conv_common.h): the frozen convolutions and
// linears no epilogue took, as the same library call on a weight prepared once (oneDNN's reordered one,
// or MKL's packed GEMM for float32 linears), and NCHW results that oneDNN writes itself.
#include <string>

#include <fmt/format.h>

#include "passes/conv_common.h"

namespace fusion_jit {
namespace conv_rules {
namespace {

// For the prepack rules, which decline silently where only the cost rule would: declined with the reason
// when oneDNN cannot take `x`'s dtype here (`why`, from onednn_conv or onednn_linear), else no match.
Replacement refused(Builder& r, const Value* x, const std::string& why) {
  const std::string no = onednn_refuses(x->tensor_type().dtype);
  return !no.empty() && why == no ? r.decline(no) : Replacement{};
}

// A linear left without post-ops: the same call with none, for the reordered weight alone.
Replacement linear_prepacked(const Match& m, Builder& r) {
  if (g_schema_probe && !g_schema_probe("mkldnn::_linear_pointwise")) return {};
  auto l = as_linear(m.root);
  if (!l) return {};
  std::string why;
  if (!onednn_linear(*l, m.root->output(), &why)) return refused(r, l->x, why);
  return {onednn_linear_call(r, *l, m.root->output(),
                             {Arg::lit(std::string("none")), Arg::lit(std::vector<int64_t>{}), Arg::lit(None{})})};
}

// prepack.linear_mkl: a float32 linear left without post-ops as MKL's packed sgemm,
// mkl::_mkl_linear(x, mkl::_mkl_reorder_linear_weight(W, rows), W, b, rows), any size (Note [Convolution
// rules]). The packed weight is MKL's opaque buffer (its size is MKL's choice); its type here is W's, and
// only the call reads it.
Replacement linear_mkl(const Match& m, Builder& r) {
  if (g_schema_probe && !g_schema_probe("mkl::_mkl_linear")) return {};
  auto l = as_linear(m.root);
  const Value* y = m.root->output();
  if (!l || !packable_linear(*l, y) || l->x->tensor_type().dtype != DType::kFloat32) return {};
  const TensorType& x = l->x->tensor_type();
  const int64_t rows = x.extent() / x.sizes.back();
  std::string times;
  if (onednn_gemm_chosen(rows, x.sizes.back(), y->tensor_type().sizes.back(), l->bias != nullptr, true, &times)
          .value_or(false) &&
      onednn_linear(*l, y))
    return r.decline(times.empty() ? std::string("FUSION_JIT_GEMM=onednn: oneDNN's reordered weight (prepack.linear)")
                                   : times + ": oneDNN's reordered weight (prepack.linear)");
  Value* w = linear_weight(r, *l);
  Value* packed = r.node("mkl::_mkl_reorder_linear_weight", {Arg::of(w), Arg::lit(rows)}, {w->type()})->output();
  const TensorType& yt = y->tensor_type();
  return {r.op("mkl::_mkl_linear",
               {Arg::of(l->x), Arg::of(packed), Arg::of(w), l->bias ? Arg::of(l->bias) : Arg::lit(None{}), Arg::lit(rows)},
               yt.dtype, yt.sizes)};
}

// A convolution left without post-ops: the same call with none, for the reordered weight alone.
Replacement conv_prepacked(const Match& m, Builder& r) {
  if (g_schema_probe && !g_schema_probe("mkldnn::_convolution_pointwise")) return {};
  auto conv = as_conv(m.root);
  if (!conv) return {};
  std::string why;
  if (!onednn_conv(*conv, m.root->output(), &why)) return refused(r, conv->x, why);
  return {onednn_call(r, *conv, m.root->output(), "mkldnn::_convolution_pointwise", nullptr,
                      {Arg::lit(std::string("none")), Arg::lit(std::vector<int64_t>{}), Arg::lit(None{})})};
}

// The convolution of a oneDNN call (its weight argument at `w`, the plain weight `weight`) as the conv
// probe times it.
std::optional<ConvShape> call_shape(const Node& call, size_t w, const Value* weight) {
  const auto& a = call.args();
  if (a.size() < w + 6 || !a[0].is_value() || !weight->is_tensor()) return std::nullopt;
  Conv c;
  c.x = a[0].value;
  c.weight = const_cast<Value*>(weight);
  c.bias = a[w + 1].is_value() ? a[w + 1].value : nullptr;
  auto ints = [&](size_t i) -> std::optional<std::vector<int64_t>> {
    if (a[i].is_value() || !std::holds_alternative<SymSizes>(a[i].literal)) return std::nullopt;
    return std::get<SymSizes>(a[i].literal);
  };
  auto padding = ints(w + 2), stride = ints(w + 3), dilation = ints(w + 4);
  const Arg& groups = a[w + 5];
  if (!padding || !stride || !dilation || groups.is_value() || !std::holds_alternative<SymInt>(groups.literal))
    return std::nullopt;
  c.padding = *padding;
  c.stride = *stride;
  c.dilation = *dilation;
  c.groups = std::get<SymInt>(groups.literal);
  return conv_shape(c);
}

// contiguous(call(x, reorder(W), ...)) where x (and the binary post-op's operand) are NCHW: the call on W
// itself, made NCHW (constant_fold evaluates that once): oneDNN then writes NCHW, eager's layout, and the
// copy goes (oneDNN reorders a plain weight at each call, as eager's convolution does).
Replacement nchw_result(const Match& m, Builder& r) {
  Node* call = m.value("call")->producer();
  const bool binary = call->schema() == "mkldnn::_convolution_pointwise.binary";
  const size_t w = binary ? 2 : 1;
  const auto& args = call->args();
  if (args.size() <= w || !args[w].is_value() || !args[w].value->producer()) return {};
  Node* reorder = args[w].value->producer();
  if (reorder->schema() != "mkldnn::_reorder_convolution_weight" || !reorder->args()[0].is_value()) return {};
  const Value* out = m.root->output();
  const TensorType& x = call->args()[0].value->tensor_type();
  const TensorType& y = out->tensor_type();
  if (x.strides != contiguous_strides(x.sizes) || y.strides != contiguous_strides(y.sizes)) return {};
  if (binary) {
    const TensorType& o = call->args()[1].value->tensor_type();
    if (o.strides != contiguous_strides(o.sizes)) return {};
  }
  // Timed here (Note [Convolutions timed on this machine]): the call on the plain weight only where it is
  // faster than the call on the reordered weight plus the copy to NCHW that it saves.
  if (auto shape = call_shape(*call, w, reorder->args()[0].value))
    if (const std::optional<ConvTiming> t = conv_timing(*shape); t && !(t->onednn_nchw_us < t->onednn_cl_us + t->copy_us))
      return r.decline(fmt::format("timed here: oneDNN on the plain weight {:.0f} us, on the reordered weight {:.0f} us "
                                   "and the copy to NCHW {:.0f} us",
                                   t->onednn_nchw_us, t->onednn_cl_us, t->copy_us));
  // Always through contiguous(): in a channels-last plan the weight is channels-last, and so is one folded
  // from it, whatever its type says (a constant's strides are what ATen gave when it was evaluated).
  Value* weight = reorder->args()[0].value;
  const TensorType& wt = weight->tensor_type();
  weight = r.op("aten::contiguous", {Arg::of(weight), Arg::lit(int64_t{0})}, wt.dtype, wt.sizes);
  std::vector<Arg> new_args = args;
  new_args[w] = Arg::of(weight);
  return {r.node(call->schema(), std::move(new_args), {out->type()})->output()};
}

RuleSet make_prepack_rules() {
  const Pattern call = Pattern::op({"mkldnn::_convolution_pointwise", "mkldnn::_convolution_pointwise.binary"})
                           .single_use()
                           .bind("call");
  return RuleSet{"prepack",
                 {{"conv", Pattern::op({"aten::conv2d", "aten::convolution"}), conv_prepacked},
                  {"linear_mkl", Pattern::op({"aten::linear", "aten::addmm"}), linear_mkl},
                  {"linear", Pattern::op({"aten::linear", "aten::addmm"}), linear_prepacked},
                  {"nchw_result", Pattern::op({"aten::contiguous"}, {call, Pattern::literal(int64_t{0})}),
                   nchw_result}}};
}

}  // namespace
}  // namespace conv_rules

const RuleSet& prepack_rules() {
  static const RuleSet set = conv_rules::make_prepack_rules();
  return set;
}

}  // namespace fusion_jit
