// What the rule sets around convolutions and linears share (Note [Convolution rules], below): the
// convolutions and linears they recognize, the checks and the oneDNN calls several of them make. One rule
// set per file:
//   fold_rules.cpp      "fold": a frozen batch_norm, or a product, quotient, sum or difference with a frozen
//                       constant, folded into the convolution's or linear's weight and bias
//   epilogue_rules.cpp  "epilogue": an activation or residual add as the library call's post-op (oneDNN;
//                       on CUDA cuBLASLt and cuDNN)
//   prepack_rules.cpp   "prepack": the other frozen convolutions and linears on a prepared weight, and
//                       NCHW results written by oneDNN itself
//   layout_rules.cpp    "layout": a convolution's NCHW input copied channels-last by our kernel
//   gemm_rules.cpp      "gemm": linears on a weight given at each call as oneDNN's GEMM where measured
//                       faster, and that measurement (onednn_gemm_chosen)
//   conv_common.cpp     what is declared here, the probes and size_octave
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
//   convolution when its result is an output, and every call of NCHW plans with the opt-in. Only where
//   the convolution, timed (Note [Convolutions timed on this machine]), is faster so than the call on the
//   reordered weight plus the copy: ATen gives that call's result through oneDNN's own buffer, copied
//   twice (to_public, then contiguous), and for the demo's conv_bn_relu it was the slower of the two.
//
// Note [Convolutions timed on this machine]
// Which implementation and layout a convolution runs in is decided by its times on this machine, once
// per shape (input and weight sizes, stride, padding, dilation, groups, dtype, bias) and thread count,
// kept in the kernel cache (torch/gemm_choice.cpp, the conv probe): ATen's convolution on NCHW (eager's),
// oneDNN's call on the reordered weight on channels-last, the same call on the plain weight on NCHW, and
// the copy of a channels-last result to NCHW. oneDNN picks its kernel by layout (on this machine a
// 16 -> 32 channel 3x3 convolution over 56x56 ran its blocked jit kernel from NCHW, 0.68 ms plus a 0.1 ms
// reorder, and its brgemm kernel on channels-last, 0.75 ms), so no per-element constant says which layout
// is faster; the times do. They decide:
// - the plan's layout (decide_channels_last, torch/capture.h; the Python backend's the same): the gain of
//   channels-last is the sum over the convolutions of ATen's time less the channels-last call's, against
//   the cost model's price of the copies at the plan's edges;
// - prepack.nchw_result (above).
// Each shape costs a few calls of each form at plan build (about 3 each, fewer for long ones); a
// restarted process reads the times back. Where nothing was timed (no oneDNN, no probe in tests of the
// IR alone, FUSION_JIT_DISABLE=conv_timing) the cost model's per-element estimate decides.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "passes/passes.h"

namespace fusion_jit::conv_rules {

// The schema probe (set_schema_probe); null: every schema is taken as present.
extern bool (*g_schema_probe)(const std::string&);

// Why oneDNN cannot take `t` on this CPU, or "" (set_onednn_bf16_probe).
std::string onednn_refuses(DType t);

// Whether `v` is a frozen constant (fj::constant).
bool is_constant(const Value* v);

// Whether `a` is the literal `l`.
bool is_literal(const Arg& a, const Literal& l);

// Whether `v` is a frozen constant or computed from frozen constants only by pure nodes (constant_fold
// will make it one), looking `depth` producers back.
bool frozen(const Value* v, int depth = 8);

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

// The convolution `n` is, or nullopt where it is not one (literal stride, padding, dilation, groups).
std::optional<Conv> as_conv(Node* n);

// The shape the conv probe times for `conv` (a shape class's at its hint), or nullopt (not 2-d, a
// symbolic weight).
std::optional<ConvShape> conv_shape(const Conv& conv);

// Whether `t` is 4-d and channels-last (NHWC).
bool is_channels_last(const TensorType& t);

// The checks conv_pointwise and conv_add share: a 2-d convolution on the CPU in float32 or bfloat16, with a
// contiguous input and a contiguous result `y` of the same dtype, and stride, padding and dilation pairs.
// `why`: set where only the cost rule declines (an NCHW result without the opt-in), for explain.
bool onednn_conv(const Conv& conv, const Value* result, std::string* why = nullptr);

// The oneDNN call for `conv` and its post-ops (`post`: the arguments after groups; `other`: the binary
// post-op's operand or nullptr), giving the value that replaces `out`. The weight is reordered once into
// oneDNN's blocked layout for this input shape (mkldnn::_reorder_convolution_weight on a frozen weight:
// constant_fold evaluates it at plan build, the plan keeps the result); with such a weight oneDNN writes
// its result channels-last, and aten::contiguous gives eager's layout back.
Value* onednn_call(Builder& r, const Conv& conv, const Value* out, const std::string& schema, Value* other,
                   std::vector<Arg> post);

// The post-op arguments (attr, scalars, algorithm) of oneDNN's unary post-op `attr` for the activation
// node `act`: leaky_relu's slope and hardtanh's bounds (relu6: [0, 6]) as its scalars, gelu's
// approximation as its algorithm; nullopt where an argument is not a literal oneDNN takes.
std::optional<std::vector<Arg>> post_op_args(const Node* act, const char* attr);

// A convolution's output used there only, bound as "conv": what the fold and epilogue rules match.
Pattern conv_output();

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

// The linear `n` is, or nullopt where it is not one.
std::optional<Linear> as_linear(Node* n);

// Below this many multiply-adds oneDNN's call costs more than eager's GEMM plus our kernel: measured on this
// project's 2-core machine (bench/RESULTS.md), [8,128]x[128,128] took 17-22 us through oneDNN against
// 7-17 us; from [32,128]x[128,512] (2^21) on it was as fast or faster (1.1-1.5x).
inline constexpr double kLinearMinMacs = 2097152;

// The checks of the linear rules but the cost rule: CPU tensors of float32 or bfloat16, a frozen 2-d weight
// (and bias), and a contiguous, non-empty result `y`.
bool packable_linear(const Linear& l, const Value* y);

// The checks of the oneDNN linear rules: packable_linear, and enough work (kLinearMinMacs).
// `why`: set where only the cost rule declines (too little work), for explain.
bool onednn_linear(const Linear& l, const Value* y, std::string* why = nullptr);

// Which library FUSION_JIT_GEMM and the probe choose for a float32 linear [rows, k] x [k, n] (Note [GEMM
// backend measured on this machine]): true for oneDNN's GEMM, false for MKL's (ATen's on a plain weight,
// the packed one on a frozen weight), nullopt where nothing decides (outside the timed sizes, no probe,
// nothing measured): the rule's default. `why`: the measured times, where measured.
// Defined in gemm_rules.cpp, with the measurement.
std::optional<bool> onednn_gemm_chosen(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked,
                                       std::string* why);

// The rows of a linear's input [..., k] at its hint, with no guard: the rules take a GEMM library and a
// weight layout on it, choices of speed that compute the same for any rows, so a shape class keeps its
// batch and sequence length symbolic through them (Note [Symbolic sizes]).
int64_t rows_at_hint(const TensorType& x);

// The frozen weight W [N, K] of a linear (t(Wt) made when only its transpose is given: folded once).
Value* linear_weight(Builder& r, const Linear& l);

// mkldnn::_linear_pointwise(x, reorder(W), b, post...) giving the value of `out` (a view of the linear's
// result when the activation reads one: the call is made on the linear's own shape, then viewed).
Value* onednn_linear_call(Builder& r, const Linear& l, const Value* out, std::vector<Arg> post);

// The value an activation reads (the pattern's "in"), directly or through a view or reshape, where it (and
// the view) is used by the activation only; nullptr otherwise.
Value* read_alone_by(const Match& m, const Builder& r);

// The linear an activation reads (read_alone_by). `*result`: the linear's own result.
std::optional<Linear> linear_read_by(const Match& m, const Builder& r, Value** result);

// The activations oneDNN applies as post-ops: the conv rule's name, the op, oneDNN's attr.
struct Act {
  const char* rule;
  const char* schema;
  const char* attr;
};

inline constexpr Act kActs[] = {{"conv_relu", "aten::relu", "relu"},
                                {"conv_sigmoid", "aten::sigmoid", "sigmoid"},
                                {"conv_tanh", "aten::tanh", "tanh"},
                                {"conv_hardswish", "aten::hardswish", "hardswish"},
                                {"conv_silu", "aten::silu", "swish"},
                                {"conv_hardsigmoid", "aten::hardsigmoid", "hardsigmoid"},
                                {"conv_gelu", "aten::gelu", "gelu"},
                                {"conv_leaky_relu", "aten::leaky_relu", "leaky_relu"},
                                {"conv_hardtanh", "aten::hardtanh", "hardtanh"},
                                {"conv_relu6", "aten::relu6", "hardtanh"}};

}  // namespace fusion_jit::conv_rules
