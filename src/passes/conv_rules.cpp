// Rules around convolutions and linears (Note [Convolution rules]).
//
// Note [Convolution rules]
// - fold.conv_bn: batch_norm in inference mode over a convolution's output (used by the batch_norm only),
//   with the convolution's weight and bias (frozen constants, or computed from them by an earlier fold)
//   and the batch_norm's statistics, weight and bias all frozen constants, becomes one convolution with
//   weight W * s and bias (b - mean) * s + beta, where s = gamma / sqrt(var + eps) per output channel.
//   The new weight and bias are built as ops on the constants; constant_fold, later in the pipeline,
//   evaluates them once (through ATen, in the constants' dtype). float32 and float64 only: in float16
//   and bfloat16 the folded weight would be rounded once more than eager's conv and batch_norm round.
//   Folding changes the rounding, not the result beyond the tolerance rule: eager computes
//   (conv(x, W) + b - mean) * s + beta, the folded conv sums x * (W * s).
// - fold.conv_mul, conv_div, conv_add, conv_sub (binary folding): the convolution's output (used there
//   only) times, divided by, plus or minus a frozen constant of the result's dtype holding one value per
//   output channel or one value ([C,1,1], [1,C,1,1], [1], ...), or a finite number: mul and div scale W
//   and b, add and sub shift b. float32 and float64, as conv_bn. Declined: division by a tensor (a zero
//   in it makes eager's result inf or nan element by element, while W / 0 inside the sum does not give
//   the same), division by the number 0, non-finite numbers, alpha other than 1. A non-finite value
//   inside a constant tensor is not seen at rule time (a scale of inf: eager's 0 * inf is one nan, the
//   folded weights' inf terms can make more); models do not carry such scales.
// - epilogue.conv_<act>: an activation (relu, sigmoid, tanh, hardswish, silu, hardsigmoid, gelu with
//   either approximation, leaky_relu, hardtanh, relu6 as hardtanh(0, 6)) over a 2-d convolution's output
//   (used by the activation only) becomes mkldnn::_convolution_pointwise with the activation as oneDNN's
//   post-op (its slope or bounds as the post-op's scalars): one pass over the output instead of a
//   convolution and a kernel that reads the output again.
// - epilogue.conv_add, epilogue.conv_add_relu: a convolution's output plus a tensor of the result's shape,
//   dtype and layout (either operand order; add's alpha 1), then optionally relu, becomes
//   mkldnn::_convolution_pointwise.binary with an "add" post-op (and relu): the residual block's tail.
//   float32 only (ATen's add_relu post-op has no bfloat16 kernel). Where the residual dies there, the
//   executor calls the op's in-place form, which adds into the residual's storage (torch/executor.cpp,
//   Note [Results written into a dying argument]).
// - prepack.conv (a set of its own, after the epilogues): any other such convolution, as the same call
//   without a post-op.
// - fold.linear_bn: as conv_bn, over a frozen linear (or addmm on t(W)) whose result is 2-d, where
//   BatchNorm1d's channels are the linear's output features (over a 3-d result they are not: declined).
// - fold.linear_mul, linear_div, linear_add, linear_sub: as the conv folds, with one value per output
//   feature (the last dim) of a frozen linear (or addmm on t(W), or a view of either used there only):
//   mul and div scale W's rows (t(W)'s columns) and b, add and sub shift b.
// - epilogue.linear_<act> (the same activations) over a frozen linear: aten::linear(x, W, b), or
//   torch.compile's aten::addmm(b, x, t(W)) (beta and alpha 1, b of [N]) with its result viewed back to
//   x's rank; the linear (and view) used by the activation only: mkldnn::_linear_pointwise(x,
//   _reorder_linear_weight(W, rows), b, post-op) (the reorder folded at plan build), viewed as the
//   activation's input was. prepack.linear: any other such linear, with no post-op. CPU, float32 or
//   bfloat16, a contiguous result, and from 2^21 multiply-adds on (kLinearMinMacs): below that oneDNN's
//   call cost more than eager's GEMM plus our kernel on this project's machine. Every post-op was checked
//   against eager (float32: at most 2.4e-6 absolute difference on values of order 1). One exception, as
//   Inductor's freezing makes it: a float32 gelu declines, so that its linear is MKL's packed GEMM
//   (prepack.linear_mkl) and the gelu our kernel. Measured in one process against the post-op
//   (bench/RESULTS.md): timm_deit_tiny 17.4 against 18.7 ms per call, vit_b_16 158 against 165 ms,
//   convnext_tiny 75.2 against 75.2 ms.
// - prepack.linear_mkl (before prepack.linear): a float32 linear left without post-op, of any size, is
//   MKL's packed GEMM, mkl::_mkl_linear(x, mkl::_mkl_reorder_linear_weight(W, rows), W, b, rows), as
//   Inductor's freezing does for float32. Measured on this project's machine (bench/RESULTS.md), on the
//   shapes of ViT, DeiT and the tiny transformers: 0.68-0.94x oneDNN's time on a reordered weight and
//   0.72-0.95x ATen's linear, small ones included (oneDNN's call overhead is why kLinearMinMacs exists;
//   MKL's is below ATen's). The epilogue rules keep oneDNN: its post-op costs no pass, MKL's call has none.
//   Cost: MKL's packed buffer is 2-5x the weight (at least about 8 MB), kept with the plan's constants.
//   Results: MKL's sgemm, as eager's linear, in another blocking (bit-identical on most shapes measured,
//   3e-5 apart on sums of 3072 terms of order 50).
// All of them only where the weight (and bias) is frozen, or computed from frozen constants (a folded
//   batch_norm): the weight is reordered once into oneDNN's blocked layout for the input's shape
//   (mkldnn::_reorder_convolution_weight, which constant_fold evaluates at plan build); a weight given at
//   each call would be reordered at each call, slower than eager's convolution. With the reordered weight
//   oneDNN writes its result channels-last whatever the input's layout. Only CPU tensors of float32 or
//   bfloat16, 4-d, contiguous or channels-last, groups, stride, padding and dilation as literals.
//   mkldnn::_convolution_pointwise exists only in builds of torch with oneDNN: the torch adapter says so
//   through set_schema_probe, and without it the rules decline. Every post-op was checked against eager
//   (float32: at most 4.8e-7 absolute difference on values of order 1; bit-identical for relu and gelu).
// - Layout. Where the convolution's result is channels-last (plans captured with channels-last weights,
//   Note [Channels-last plans] in torch/capture.h, or a channels-last input) the call's result is the
//   plan's value as it is. Where it is NCHW, the call's channels-last result would need a copy back
//   (aten::contiguous): measured on this project's 2-core machine, that made the rules slower than eager's
//   convolution plus our fused kernel (conv_bn_relu 1.51 ms against 1.20 ms with fold alone, a 3-block
//   CNN 9.95 against 7.46 ms; bench/RESULTS.md), so there they are opt-in (FUSION_JIT_ENABLE=onednn_nchw).
// - epilogue.cuda_linear_relu, cuda_linear_gelu (CUDA): relu or gelu with the tanh approximation over a
//   linear with bias (aten::linear, or torch.compile's addmm on t(W), optionally viewed; used there only)
//   becomes aten::_addmm_activation(b, x as [rows, K], t(W), 1, 1, use_gelu): cuBLASLt's bias and
//   activation epilogue, one pass over the result (ATen falls back to addmm plus the activation where
//   cuBLASLt does not take the case). The exact gelu declines: on CUDA both ATen paths apply the tanh
//   approximation (cuBLASLt's GELU epilogue, and gelu_(result, "tanh") after its fallback GEMM); on the
//   CPU the same op applies the exact gelu (measured: 4.7e-4 from tanh's on values of order 5), which is
//   why the rule is CUDA's only. Relu commutes
//   with the result's rounding; the tanh gelu is applied before it (within the tolerance rule). Any weight
//   (frozen or not): nothing is prepared ahead.
// - epilogue.cuda_conv_relu, cuda_conv_add_relu (CUDA): relu(conv2d(x, W, b)) and relu(conv2d(x, W, b) + z)
//   (add's alpha 1, z of the result's sizes, dtype and layout) become aten::cudnn_convolution_relu and
//   aten::cudnn_convolution_add_relu: one cuDNN call with the bias, residual and relu fused, as
//   TorchScript's frozen_conv_add_relu_fusion does. float32, float16, bfloat16; NCHW contiguous input,
//   weight and result. Checked here on printed IR; against eager on the GPU (tests/gpu).
// - prepack.nchw_result: contiguous(call(x, reordered W, ...)) with an NCHW x (and NCHW binary operand)
//   becomes the call on W made NCHW: oneDNN then writes NCHW, eager's layout, itself (reordering the
//   plain weight at each call, as eager's convolution does). This is a channels-last plan's last
//   convolution when its result is an output (the demo's conv_bn_relu: one step), and every call of NCHW
//   plans with the opt-in.
//
// Note [GEMM backend measured on this machine]
// A float32 CPU linear whose weight comes with each call (torch.compile's graphs without freezing, where
// the weight is a graph input; frozen weights are the rules above) runs either through ATen's GEMM (addmm:
// MKL's sgemm in torch's builds) or through oneDNN's matmul on the plain weight
// (mkldnn::_linear_pointwise, which also applies an activation as a post-op). Which is faster depends on
// the machine: on this project's Intel Xeon VMs MKL's sgemm beat oneDNN (prepack.linear_mkl above), while
// on its AMD EPYC VMs (AVX-512) it took 1.05-1.4x oneDNN's time on most of convnext_tiny's and ViT's
// linear shapes and 0.85x on one (bench/gemm_shapes.py, bench/RESULTS.md), and DeiT's small ones were even.
// So the rule set "gemm" measures: the torch adapter times both calls
// on random tensors of the linear's shape, alternating (gemm_choice.cpp), and a linear becomes oneDNN's
// where its median is under kGemmMargin of ATen's (FUSION_JIT_GEMM=measure, the default), once per shape and
// thread count per process; `aten` never, `onednn` always (tests, comparisons). The rows are timed at the
// next power of two (size_octave), and the bounds below apply to that count: one decision per octave
// of rows. A served model sees new row counts (batch x sequence length) in nearly every request; timed at
// its exact rows, each new length cost a measurement (about 40 ms for a 512-1024-512 MLP) and could
// take the other library where the two were near a tie, which changes the plan's kernels (an activation
// as oneDNN's post-op or in our kernel) and compiles them again. On the suite's linear shapes the ratio at
// the next power of two was within 0.08 of the ratio at the exact rows (bench/RESULTS.md).
// - gemm.linear: aten::linear(x, W, b), or torch.compile's addmm(b, x, t(W)) with beta and alpha 1, as
//   mkldnn::_linear_pointwise(x, W, b, "none"). CPU, float32, x, W [N, K] and the result contiguous, bias
//   [N] or none, from 2^21 (kLinearMinMacs) to 2^33 (kGemmMaxMacs) multiply-adds: larger ones are not
//   timed at plan build (the measurement would take seconds), and stay ATen's.
// - gemm.linear_<act> (the activations of epilogue.linear_<act>): an activation over such a call with no
//   post-op (or over a view of it), the call used there only, becomes the call with the activation as its
//   post-op: one pass over the result instead of the GEMM's and our kernel's. The measurement is of the
//   GEMM alone; the post-op only takes a pass away. Checked against eager in every activation.
// - Frozen weights (the rules above) take the same measurement between their two prepared forms: MKL's
//   packed GEMM (prepack.linear_mkl, the default for a float32 linear without post-op) against oneDNN's
//   reordered weight (prepack.linear), each weight prepared once outside the timing. prepack.linear_mkl
//   declines, with the times, where oneDNN's was faster by the same margin, and epilogue.linear_gelu then
//   takes a float32 gelu as oneDNN's post-op instead of declining for MKL's GEMM and our kernel.
//   FUSION_JIT_GEMM=aten keeps MKL's, onednn takes oneDNN's (in the timed sizes).
// The results are oneDNN's sums in another blocking than MKL's (float32 accumulation in both), within the
// tolerance rule.
#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "passes/passes.h"
#include "support/options.h"

namespace fusion_jit {
namespace {

bool (*g_schema_probe)(const std::string&) = nullptr;
bool (*g_onednn_bf16_probe)() = nullptr;

// Why oneDNN cannot take `t` on this CPU, or "" (set_onednn_bf16_probe).
std::string onednn_refuses(DType t) {
  if (t != DType::kBFloat16 || !g_onednn_bf16_probe || g_onednn_bf16_probe()) return "";
  return "oneDNN takes no bfloat16 on this CPU (it needs AVX512BW, AVX512VL and AVX512DQ, or AVX-NE-CONVERT)";
}

// For the prepack rules, which decline silently where only the cost rule would: declined with the reason
// when oneDNN cannot take `x`'s dtype here (`why`, from onednn_conv or onednn_linear), else no match.
Replacement refused(Builder& r, const Value* x, const std::string& why) {
  const std::string no = onednn_refuses(x->tensor_type().dtype);
  return !no.empty() && why == no ? r.decline(no) : Replacement{};
}

// FUSION_JIT_ENABLE=onednn_nchw (Note [Convolution rules], "Layout").
[[maybe_unused]] const bool kOnednnNchwName = (Options::register_enable_names({"onednn_nchw"}), true);

bool is_constant(const Value* v) { return v && v->producer() && v->producer()->is_constant(); }

// Whether `a` is the literal `l`.
bool is_literal(const Arg& a, const Literal& l) { return !a.is_value() && a.literal == l; }

// Whether `v` is a frozen constant or computed from frozen constants only by pure nodes (constant_fold
// will make it one), looking `depth` producers back.
bool frozen(const Value* v, int depth = 8) {
  if (is_constant(v)) return true;
  const Node* n = v ? v->producer() : nullptr;
  if (!n || depth == 0 || n->side_effects()) return false;
  for (const Value* in : n->value_inputs())
    if (!frozen(in, depth - 1)) return false;
  return true;
}

// The convolution a rule may rewrite: aten::conv2d(x, W, b, stride, padding, dilation, groups) or
// aten::convolution(x, W, b, stride, padding, dilation, transposed = false, output_padding, groups).
struct Conv {
  Node* node = nullptr;
  Value* x = nullptr;
  Value* weight = nullptr;
  Value* bias = nullptr;  // nullptr: none
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
};

std::optional<std::vector<int64_t>> int_list(const Arg& a) {
  if (a.is_value() || !std::holds_alternative<SymSizes>(a.literal)) return std::nullopt;
  return std::get<SymSizes>(a.literal);
}

std::optional<Conv> as_conv(Node* n) {
  const auto& a = n->args();
  const bool conv2d = n->schema() == "aten::conv2d";
  if (a.size() != (conv2d ? 7u : 9u)) return std::nullopt;
  Conv c;
  c.node = n;
  if (!a[0].is_value() || !a[0].value->is_tensor() || !a[1].is_value() || !a[1].value->is_tensor()) return std::nullopt;
  c.x = a[0].value;
  c.weight = a[1].value;
  if (a[2].is_value()) {
    if (!a[2].value->is_tensor()) return std::nullopt;
    c.bias = a[2].value;
  } else if (!std::holds_alternative<None>(a[2].literal)) {
    return std::nullopt;
  }
  auto stride = int_list(a[3]), padding = int_list(a[4]), dilation = int_list(a[5]);
  if (!stride || !padding || !dilation) return std::nullopt;
  c.stride = *stride;
  c.padding = *padding;
  c.dilation = *dilation;
  const Arg& groups = a[conv2d ? 6 : 8];
  if (!conv2d && !is_literal(a[6], false)) return std::nullopt;  // transposed
  if (groups.is_value() || !std::holds_alternative<SymInt>(groups.literal)) return std::nullopt;
  c.groups = std::get<SymInt>(groups.literal);
  return c;
}

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

bool is_channels_last(const TensorType& t) { return t.dim() == 4 && same_strides(t, channels_last_strides(t.sizes)); }

// Contiguous (NCHW) or channels-last (NHWC), the strides of size-1 dims aside.
bool contiguous_or_channels_last(const TensorType& t) {
  return t.dim() == 4 && (same_strides(t, contiguous_strides(t.sizes)) || is_channels_last(t));
}

// The checks conv_pointwise and conv_add share: a 2-d convolution on the CPU in float32 or bfloat16, with a
// contiguous input and a contiguous result `y` of the same dtype, and stride, padding and dilation pairs.
// `why`: set where only the cost rule declines (an NCHW result without the opt-in), for explain.
bool onednn_conv(const Conv& conv, const Value* result, std::string* why = nullptr) {
  const TensorType& x = conv.x->tensor_type();
  const TensorType& y = result->tensor_type();
  if (x.device != Device::kCPU || x.dim() != 4 || conv.weight->tensor_type().dim() != 4) return false;
  if (x.dtype != DType::kFloat32 && x.dtype != DType::kBFloat16) return false;
  if (conv.weight->tensor_type().dtype != x.dtype || y.dtype != x.dtype) return false;
  if (const std::string no = onednn_refuses(x.dtype); !no.empty()) {
    if (why) *why = no;
    return false;
  }
  if (conv.bias && conv.bias->tensor_type().dtype != x.dtype) return false;
  if (!contiguous_or_channels_last(x) || !contiguous_or_channels_last(y)) return false;
  if (x.sym_extent() == 0 || y.sym_extent() == 0) return false;
  for (const auto* l : {&conv.stride, &conv.padding, &conv.dilation})
    if (l->size() != 2) return false;
  // A weight given at each call would be reordered at each call: slower than eager's convolution.
  if (!frozen(conv.weight) || (conv.bias && !frozen(conv.bias))) return false;
  // An NCHW result would be copied back from oneDNN's channels-last one: only when asked for.
  if (!is_channels_last(y) && !Options::get().is_enabled("onednn_nchw")) {
    if (why)
      *why = "the result is NCHW: oneDNN's channels-last result copied back was slower here than eager's "
             "convolution and our kernel (FUSION_JIT_ENABLE=onednn_nchw takes it)";
    return false;
  }
  return true;
}

// The oneDNN call for `conv` and its post-ops (`post`: the arguments after groups; `other`: the binary
// post-op's operand or nullptr), giving the value that replaces `out`. The weight is reordered once into
// oneDNN's blocked layout for this input shape (mkldnn::_reorder_convolution_weight on a frozen weight:
// constant_fold evaluates it at plan build, the plan keeps the result); with such a weight oneDNN writes
// its result channels-last, and aten::contiguous gives eager's layout back.
Value* onednn_call(Builder& r, const Conv& conv, const Value* out, const std::string& schema, Value* other,
                   std::vector<Arg> post) {
  // The input size hint with the batch by octave (oneDNN's layout and times did not change within one on
  // the shapes measured): the batch sizes of a served model share the folded weight (Note [Folded
  // constants shared across signatures], torch/executor.h).
  // (At a shape class's hint for the batch: a choice of layout, which computes the same for any batch.)
  const SymSizes& xs = conv.x->tensor_type().sizes;
  std::vector<int64_t> hint;
  for (size_t d = 0; d < xs.size(); ++d) hint.push_back(d == 0 ? size_octave(xs[0].hint()) : int64_t{xs[d]});
  Value* packed = r.node("mkldnn::_reorder_convolution_weight",
                         {Arg::of(conv.weight), Arg::lit(conv.padding), Arg::lit(conv.stride), Arg::lit(conv.dilation),
                          Arg::lit(conv.groups), Arg::lit(hint)},
                         {conv.weight->type()})
                      ->output();
  std::vector<Arg> args = {Arg::of(conv.x)};
  if (other) args.push_back(Arg::of(other));
  for (Arg a : {Arg::of(packed), conv.bias ? Arg::of(conv.bias) : Arg::lit(None{}), Arg::lit(conv.padding),
                Arg::lit(conv.stride), Arg::lit(conv.dilation), Arg::lit(conv.groups)})
    args.push_back(std::move(a));
  for (Arg& a : post) args.push_back(std::move(a));
  if (is_channels_last(out->tensor_type())) return r.node(schema, std::move(args), {out->type()})->output();
  ValueType channels_last = out->type();
  const auto& sz = out->tensor_type().sizes;  // [N, C, H, W]
  channels_last.tensor->strides = channels_last_strides(sz);
  Value* y = r.node(schema, std::move(args), {channels_last})->output();
  return r.op("aten::contiguous", {Arg::of(y), Arg::lit(int64_t{0})}, out->tensor_type().dtype, sz);
}

// A literal number argument of `n` (absent: `fallback`), or nullopt for a value.
std::optional<double> number_arg(const Node* n, size_t i, double fallback) {
  return as_double(literal_arg(i < n->args().size() ? &n->args()[i] : nullptr, fallback));
}

// activation(conv(x, W, b)) -> mkldnn::_convolution_pointwise(x, W, b, padding, stride, dilation, groups,
// attr, scalars, algorithm): oneDNN's unary post-op `attr`, with leaky_relu's slope and hardtanh's bounds
// (relu6: [0, 6]) as its scalars and gelu's approximation as its algorithm.
// The post-op arguments (attr, scalars, algorithm) of oneDNN's unary post-op `attr` for the activation
// node `act`: leaky_relu's slope and hardtanh's bounds (relu6: [0, 6]) as its scalars, gelu's
// approximation as its algorithm; nullopt where an argument is not a literal oneDNN takes.
std::optional<std::vector<Arg>> post_op_args(const Node* act, const char* attr) {
  Arg algorithm = Arg::lit(None{});
  std::vector<double> scalars;
  const std::string a = attr;
  if (a == "gelu") {
    const auto& ga = act->args();
    std::string approximate = "none";
    if (ga.size() > 1) {
      if (ga[1].is_value() || !std::holds_alternative<std::string>(ga[1].literal)) return std::nullopt;
      approximate = std::get<std::string>(ga[1].literal);
    }
    if (approximate != "none" && approximate != "tanh") return std::nullopt;
    algorithm = Arg::lit(approximate);
  } else if (a == "leaky_relu") {
    auto slope = number_arg(act, 1, 0.01);
    if (!slope) return std::nullopt;
    scalars = {*slope};
  } else if (a == "hardtanh" && act->schema() == "aten::relu6") {
    scalars = {0.0, 6.0};
  } else if (a == "hardtanh") {
    auto lo = number_arg(act, 1, -1.0), hi = number_arg(act, 2, 1.0);
    if (!lo || !hi || *lo > *hi) return std::nullopt;
    scalars = {*lo, *hi};
  }
  Arg scalar_list = scalars.empty() ? Arg::lit(std::vector<int64_t>{}) : Arg::lit(scalars);
  return std::vector<Arg>{Arg::lit(std::string(attr)), scalar_list, algorithm};
}

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

// ---- Linear (Note [Convolution rules], epilogue.linear_<act> and prepack.linear) ----

// aten::linear(x, W, b) (TorchScript), or aten::addmm(b, x, Wt, beta = 1, alpha = 1) with a [N] bias
// (torch.compile's graphs, where W = t(Wt)).
struct Linear {
  Node* node = nullptr;
  Value* x = nullptr;       // [..., K]
  Value* weight = nullptr;  // [N, K]; nullptr when only its transpose is given
  Value* weight_t = nullptr;
  Value* bias = nullptr;  // [N] or nullptr
};

std::optional<Linear> as_linear(Node* n) {
  const auto& a = n->args();
  auto tensor = [](const Arg& x) { return x.is_value() && x.value->is_tensor() ? x.value : nullptr; };
  Linear l;
  l.node = n;
  if (n->schema() == "aten::linear" && a.size() == 3) {
    l.x = tensor(a[0]);
    l.weight = tensor(a[1]);
    if (a[2].is_value()) {
      if (!(l.bias = tensor(a[2]))) return std::nullopt;
    } else if (!std::holds_alternative<None>(a[2].literal)) {
      return std::nullopt;
    }
  } else if (n->schema() == "aten::addmm" && a.size() == 5) {
    for (size_t i : {3u, 4u})
      if (!is_literal(a[i], int64_t{1}) && !is_literal(a[i], 1.0)) return std::nullopt;
    l.bias = tensor(a[0]);
    l.x = tensor(a[1]);
    l.weight_t = tensor(a[2]);
    // t(W) of a frozen W (the lowering's form): W itself.
    if (l.weight_t && l.weight_t->producer() && l.weight_t->producer()->schema() == "aten::t")
      l.weight = l.weight_t->producer()->value_inputs().at(0);
    if (!l.bias || l.bias->tensor_type().dim() != 1) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (!l.x || (!l.weight && !l.weight_t)) return std::nullopt;
  return l;
}

// Below this many multiply-adds oneDNN's call costs more than eager's GEMM plus our kernel: measured on this
// project's 2-core machine (bench/RESULTS.md), [8,128]x[128,128] took 17-22 us through oneDNN against
// 7-17 us; from [32,128]x[128,512] (2^21) on it was as fast or faster (1.1-1.5x).
constexpr double kLinearMinMacs = 2097152;

// The checks of the linear rules but the cost rule: CPU tensors of float32 or bfloat16, a frozen 2-d weight
// (and bias), and a contiguous, non-empty result `y`.
bool packable_linear(const Linear& l, const Value* y) {
  const TensorType& x = l.x->tensor_type();
  const Value* w = l.weight ? l.weight : l.weight_t;
  const TensorType& wt = w->tensor_type();
  const TensorType& yt = y->tensor_type();
  if (x.device != Device::kCPU || x.dim() < 2 || wt.dim() != 2) return false;
  if (x.dtype != DType::kFloat32 && x.dtype != DType::kBFloat16) return false;
  if (wt.dtype != x.dtype || yt.dtype != x.dtype || (l.bias && l.bias->tensor_type().dtype != x.dtype)) return false;
  if (!same_strides(yt, contiguous_strides(yt.sizes)) || yt.sym_extent() == 0) return false;
  const int64_t k = x.sizes.back(), n = l.weight ? wt.sizes[0] : wt.sizes[1];
  if ((l.weight ? wt.sizes[1] : wt.sizes[0]) != k || (l.bias && l.bias->tensor_type().sizes != std::vector<int64_t>{n}))
    return false;
  return frozen(w) && (!l.bias || frozen(l.bias));
}

// The checks of the oneDNN linear rules: packable_linear, and enough work (kLinearMinMacs).
// `why`: set where only the cost rule declines (too little work), for explain.
bool onednn_linear(const Linear& l, const Value* y, std::string* why = nullptr) {
  if (!packable_linear(l, y)) return false;
  if (const std::string no = onednn_refuses(l.x->tensor_type().dtype); !no.empty()) {
    if (why) *why = no;
    return false;
  }
  const TensorType& x = l.x->tensor_type();
  const int64_t n = y->tensor_type().sizes.back();
  // (At a shape class's hint: a choice of speed.)
  const double macs = static_cast<double>(x.sym_extent().hint()) * static_cast<double>(n);
  if (macs < kLinearMinMacs) {
    if (why)
      *why = fmt::format("{:.0f} multiply-adds, under the 2^21 from which oneDNN's call beats ATen's GEMM and our "
                         "kernel",
                         macs);
    return false;
  }
  return true;
}

GemmProbe g_gemm_probe = nullptr;
// Larger linears are not timed at plan build: their measurement would take seconds.
constexpr double kGemmMaxMacs = 8589934592.0;  // 2^33
// oneDNN's median time must be under this share of MKL's: near ties keep the rule's default.
constexpr double kGemmMargin = 0.95;

// Which library FUSION_JIT_GEMM and the probe choose for a float32 linear [rows, k] x [k, n] (Note [GEMM
// backend measured on this machine]): true for oneDNN's GEMM, false for MKL's (ATen's on a plain weight,
// the packed one on a frozen weight), nullopt where nothing decides (outside the timed sizes, no probe,
// nothing measured): the rule's default. `why`: the measured times, where measured.
std::optional<bool> onednn_gemm_chosen(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked,
                                       std::string* why) {
  // Decided for the octave of rows (Note [GEMM backend measured on this machine]).
  const int64_t timed = size_octave(rows);
  const double macs = static_cast<double>(timed) * static_cast<double>(k) * static_cast<double>(n);
  if (macs < kLinearMinMacs || macs > kGemmMaxMacs) return std::nullopt;
  switch (Options::get().gemm) {
    case GemmChoice::kAten:
      return false;
    case GemmChoice::kOneDnn:
      return true;
    case GemmChoice::kMeasure:
      break;
  }
  const std::optional<GemmTiming> t = g_gemm_probe ? g_gemm_probe(timed, k, n, bias, prepacked) : std::nullopt;
  if (!t) return std::nullopt;
  *why = fmt::format("[{}, {}] x [{}, {}]{}: {} {:.0f} us, oneDNN's {:.0f} us on this machine", rows, k, k, n,
                     timed == rows ? std::string() : fmt::format(" (timed at [{}, {}])", timed, k),
                     prepacked ? "MKL's packed GEMM" : "ATen's GEMM", t->mkl_us, t->onednn_us);
  return t->onednn_us < kGemmMargin * t->mkl_us;
}

// The rows of a linear's input [..., k] at its hint, with no guard: the rules take a GEMM library and a
// weight layout on it, choices of speed that compute the same for any rows, so a shape class keeps its
// batch and sequence length symbolic through them (Note [Symbolic sizes]).
int64_t rows_at_hint(const TensorType& x) {
  return x.sym_extent().hint() / std::max<int64_t>(1, x.sizes.back().hint());
}

// The frozen weight W [N, K] of a linear (t(Wt) made when only its transpose is given: folded once).
Value* linear_weight(Builder& r, const Linear& l) {
  if (l.weight) return l.weight;
  const TensorType& t = l.weight_t->tensor_type();
  return r.op("aten::t", {Arg::of(l.weight_t)}, t.dtype, {t.sizes[1], t.sizes[0]});
}

// mkldnn::_linear_pointwise(x, reorder(W), b, post...) giving the value of `out` (a view of the linear's
// result when the activation reads one: the call is made on the linear's own shape, then viewed).
Value* onednn_linear_call(Builder& r, const Linear& l, const Value* out, std::vector<Arg> post) {
  const TensorType& x = l.x->tensor_type();
  Value* w = linear_weight(r, l);
  // The batch-size hint by octave (the layout oneDNN picks did not change within one on the suite's shapes):
  // the signatures of a dynamic dimension fold the same step and share its result (Note [Folded constants
  // shared across signatures], torch/executor.h).
  const int64_t rows = size_octave(rows_at_hint(x));
  Value* packed = r.node("mkldnn::_reorder_linear_weight", {Arg::of(w), Arg::lit(rows)}, {w->type()})->output();
  std::vector<Arg> args = {Arg::of(l.x), Arg::of(packed), l.bias ? Arg::of(l.bias) : Arg::lit(None{})};
  for (Arg& a : post) args.push_back(std::move(a));
  const TensorType& lt = l.node->output()->tensor_type();
  Value* y = r.op("mkldnn::_linear_pointwise", std::move(args), lt.dtype, lt.sizes);
  return lt.sizes == out->tensor_type().sizes ? y : r.reshape(y, out->tensor_type().sizes);
}

// The value an activation reads (the pattern's "in"), directly or through a view or reshape, where it (and
// the view) is used by the activation only; nullptr otherwise.
Value* read_alone_by(const Match& m, const Builder& r) {
  auto only_use = [&r](const Value* v) { return v->producer() && r.users(v).size() == 1 && !r.returned(v); };
  Value* in = m.value("in");
  if (only_use(in) && (in->producer()->schema() == "aten::view" || in->producer()->schema() == "aten::reshape"))
    in = in->producer()->value_inputs().at(0);
  return only_use(in) ? in : nullptr;
}

// The linear an activation reads (read_alone_by). `*result`: the linear's own result.
std::optional<Linear> linear_read_by(const Match& m, const Builder& r, Value** result) {
  Value* in = read_alone_by(m, r);
  if (!in) return std::nullopt;
  *result = in;
  return as_linear(in->producer());
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

// ---- Linears whose weight comes with each call (Note [GEMM backend measured on this machine]) ----

bool dense(const TensorType& t) { return same_strides(t, contiguous_strides(t.sizes)); }

// gemm.linear: a float32 CPU linear on a plain weight -> mkldnn::_linear_pointwise(x, W, b, "none") where
// oneDNN's GEMM is faster on this machine.
Replacement gemm_linear(const Match& m, Builder& r) {
  if (g_schema_probe && !g_schema_probe("mkldnn::_linear_pointwise")) return {};
  auto l = as_linear(m.root);
  if (!l || !l->weight) return {};
  const TensorType& x = l->x->tensor_type();
  const TensorType& w = l->weight->tensor_type();
  const TensorType& y = m.root->output()->tensor_type();
  if (x.device != Device::kCPU || x.dtype != DType::kFloat32 || w.dtype != x.dtype || y.dtype != x.dtype) return {};
  if (x.dim() < 2 || w.dim() != 2 || y.sym_extent() == 0 || !dense(x) || !dense(w) || !dense(y)) return {};
  const int64_t k = x.sizes.back(), n = w.sizes[0];
  if (w.sizes[1] != k || y.sizes.back() != n) return {};
  if (l->bias) {
    const TensorType& b = l->bias->tensor_type();
    if (b.dtype != x.dtype || b.sizes != std::vector<int64_t>{n} || !dense(b)) return {};
  }
  std::string why;
  const std::optional<bool> onednn = onednn_gemm_chosen(rows_at_hint(x), k, n, l->bias != nullptr, false, &why);
  if (!onednn) return {};
  if (!*onednn) return why.empty() ? Replacement{} : r.decline(why);
  return {r.op("mkldnn::_linear_pointwise",
               {Arg::of(l->x), Arg::of(l->weight), l->bias ? Arg::of(l->bias) : Arg::lit(None{}),
                Arg::lit(std::string("none")), Arg::lit(std::vector<int64_t>{}), Arg::lit(None{})},
               y.dtype, y.sizes)};
}

// gemm.linear_<act>: act(call) or act(view(call)), where call is gemm.linear's (a plain weight, no post-op)
// used there only -> the call with the activation as its post-op, viewed as the activation's input was.
Replacement gemm_linear_activation(const Match& m, Builder& r, const char* attr) {
  Node* act = m.root;
  Value* in = read_alone_by(m, r);
  if (!in || in->producer()->schema() != "mkldnn::_linear_pointwise") return {};
  const Node* call = in->producer();
  const auto& a = call->args();
  if (a.size() != 6 || !is_literal(a[3], std::string("none")) || !a[1].is_value()) return {};
  // The plain weight: a reordered one is prepack.linear's, whose activation epilogue.linear_<act> decided.
  if (const Node* w = a[1].value->producer(); w && is_prepack(w->schema())) return {};
  const TensorType& out = act->output()->tensor_type();
  if (!dense(out) || out.dtype != in->tensor_type().dtype) return {};
  auto post = post_op_args(act, attr);
  if (!post) return {};
  std::vector<Arg> args = {a[0], a[1], a[2]};
  for (Arg& p : *post) args.push_back(std::move(p));
  const TensorType& lt = in->tensor_type();
  Value* y = r.op("mkldnn::_linear_pointwise", std::move(args), lt.dtype, lt.sizes);
  return {lt.sizes == out.sizes ? y : r.reshape(y, out.sizes)};
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

Pattern conv_output() {
  return Pattern::op({"aten::conv2d", "aten::convolution"}).single_use().bind("conv");
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
  // Always through contiguous(): in a channels-last plan the weight is channels-last, and so is one folded
  // from it, whatever its type says (a constant's strides are what ATen gave when it was evaluated).
  Value* weight = reorder->args()[0].value;
  const TensorType& wt = weight->tensor_type();
  weight = r.op("aten::contiguous", {Arg::of(weight), Arg::lit(int64_t{0})}, wt.dtype, wt.sizes);
  std::vector<Arg> new_args = args;
  new_args[w] = Arg::of(weight);
  return {r.node(call->schema(), std::move(new_args), {out->type()})->output()};
}

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

// conv(x, W, b) OP c -> conv(x, W', b') (fold.conv_mul, conv_div, conv_add, conv_sub; Note [Convolution// conv(x, W, b) OP c -> conv(x, W', b') (fold.conv_mul, conv_div, conv_add, conv_sub; Note [Convolution
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

// The activations oneDNN applies as post-ops: the conv rule's name, the op, oneDNN's attr.
struct Act {
  const char* rule;
  const char* schema;
  const char* attr;
};

const Act kActs[] = {{"conv_relu", "aten::relu", "relu"},
                     {"conv_sigmoid", "aten::sigmoid", "sigmoid"},
                     {"conv_tanh", "aten::tanh", "tanh"},
                     {"conv_hardswish", "aten::hardswish", "hardswish"},
                     {"conv_silu", "aten::silu", "swish"},
                     {"conv_hardsigmoid", "aten::hardsigmoid", "hardsigmoid"},
                     {"conv_gelu", "aten::gelu", "gelu"},
                     {"conv_leaky_relu", "aten::leaky_relu", "leaky_relu"},
                     {"conv_hardtanh", "aten::hardtanh", "hardtanh"},
                     {"conv_relu6", "aten::relu6", "hardtanh"}};

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

RuleSet make_gemm_rules() {
  RuleSet set{"gemm", {{"linear", Pattern::op({"aten::linear", "aten::addmm"}), gemm_linear}}};
  for (const Act& a : kActs) {
    const char* attr = a.attr;
    set.rules.push_back({std::string("linear") + (a.rule + 4),  // conv_relu -> linear_relu
                         Pattern::op({a.schema}, {Pattern::tensor().bind("in")}).outputs(1),
                         [attr](const Match& m, Builder& b) { return gemm_linear_activation(m, b, attr); }});
  }
  return set;
}

}  // namespace

GemmProbe set_gemm_probe(GemmProbe probe) { return std::exchange(g_gemm_probe, probe); }

int64_t size_octave(int64_t n) {
  int64_t octave = 1;
  while (octave < n && octave <= (int64_t{1} << 61)) octave *= 2;
  return octave;
}

const RuleSet& gemm_rules() {
  static const RuleSet set = make_gemm_rules();
  return set;
}

void set_schema_probe(bool (*probe)(const std::string& schema)) { g_schema_probe = probe; }
void set_onednn_bf16_probe(bool (*probe)()) { g_onednn_bf16_probe = probe; }

const RuleSet& fold_rules() {
  static const RuleSet set = make_fold_rules();
  return set;
}

const RuleSet& prepack_rules() {
  static const RuleSet set = make_prepack_rules();
  return set;
}

const RuleSet& layout_rules() {
  static const RuleSet set = make_layout_rules();
  return set;
}

const RuleSet& epilogue_rules() {
  static const RuleSet set = make_epilogue_rules();
  return set;
}

}  // namespace fusion_jit
