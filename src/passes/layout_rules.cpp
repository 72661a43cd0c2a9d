// The rule set "layout" (Note [A convolution's NCHW input copied by our kernel], below; Note [Convolution
// rules], passes/conv_common.h): a channels-last plan's oneDNN convolution on an NCHW input of a few
// channels takes it through our kernel's channels-last copy.
#include "passes/conv_common.h"

namespace fusion_jit {
namespace conv_rules {
namespace {

// Note [A convolution's NCHW input copied by our kernel]
// In a channels-last plan (Note [Channels-last plans], torch/capture.h) the model's image comes NCHW, and
// the oneDNN call on a reordered weight copies it to channels-last itself (ATen's clone: 37 us for a
// [1,3,224,224] image alone, 90-107 us inside resnet18's stem convolution under torch.profiler). The rule
// layout.conv_input gives the call that copy as aten::clone(x, channels_last), a kernel of the plan (Note
// [Short rows] in targets/cpu/cpu_printer.cpp: 9-20 us for that image, 74 against ATen's 459 us at
// batch 8), or part of the kernel that computes x (a normalization before the stem then writes the
// channels-last copy itself). Only up to kShortChannels channels: with more, the kernel walks long rows
// read a plane apart, and ATen's copy was faster (16 channels over 112x112: 58 against 87 us; 64 over
// 56x56: 39 against 50). Runs after prepack, so that prepack.nchw_result has made a call whose result is
// copied back to NCHW one NCHW call, which copies nothing.
constexpr int64_t kShortChannels = 8;

Replacement conv_input(const Match& m, Builder& r) {
  Node* call = m.root;
  if (call->args().empty() || !call->args()[0].is_value() || call->outputs().size() != 1) return {};
  Value* x = call->args()[0].value;
  const TensorType& xt = x->tensor_type();
  if (!is_channels_last(call->output()->tensor_type()) || xt.device != Device::kCPU || xt.dim() != 4) return {};
  if (!same_strides(xt, contiguous_strides(xt.sizes)) || is_channels_last(xt)) return {};
  const SymInt& channels = xt.sizes[1];
  if (channels.is_symbolic() || channels < 2 || channels > kShortChannels || xt.sym_extent() == 0) return {};
  ValueType t = x->type();
  t.tensor->strides = channels_last_strides(xt.sizes);
  Value* copy = r.node("aten::clone", {Arg::of(x), Arg::lit(int64_t{2})}, {t})->output();  // 2: channels_last
  std::vector<Arg> args = call->args();
  args[0] = Arg::of(copy);
  return {r.node(call->schema(), std::move(args), {call->output()->type()})->output()};
}

RuleSet make_layout_rules() {
  return RuleSet{"layout",
                 {{"conv_input", Pattern::op({"mkldnn::_convolution_pointwise", "mkldnn::_convolution_pointwise.binary"}),
                   conv_input}}};
}

}  // namespace
}  // namespace conv_rules

const RuleSet& layout_rules() {
  static const RuleSet set = conv_rules::make_layout_rules();
  return set;
}

}  // namespace fusion_jit
