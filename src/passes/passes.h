// Graph passes. Each runs in place, returns whether it changed the graph, and keeps the graph valid.
//
// decompose      the rule set "decompose" (passes/rewrite.h, Note [Decompositions]): composite ops
//                (softmax, log_softmax, logsumexp, layer_norm, rms_norm, group_norm, std, max.dim without
//                indices) rewritten into reductions and elementwise ops, one named rule each.
// fold           the rule set "fold" (Note [Convolution rules]): batch_norm folded into a frozen conv.
// epilogue       the rule set "epilogue": conv + activation as one oneDNN call with a post-op. Opt-in
//                (FUSION_JIT_ENABLE=epilogue): slower today, see Note [Convolution rules].
// prepack        the rule set "prepack": the other frozen convs and linears as oneDNN calls on a reordered
//                weight (float32 linears: MKL's packed GEMM). Opt-in, as epilogue.
// gemm           the rule set "gemm" (Note [GEMM backend measured on this machine]): a float32 CPU linear whose
//                weight comes with each call as oneDNN's GEMM (and its activation as a post-op) where that was
//                measured faster than ATen's on this machine.
// views          the rule set "views" (Note [Views through pointwise ops]): a view between pointwise ops
//                moved to the first op's inputs, so that both ops join one kernel.
// dce            removes nodes whose outputs are unused and that have no side effects.
// cse            merges nodes with the same schema and arguments (pure ops only), keeping the first;
//                two results the graph returns stay two (eager's are distinct tensors).
// constant_fold  evaluates pure nodes whose tensor arguments are all fj::constant (and small factories of
//                literals only: arange, scalar_tensor, zeros, ones, full, eye up to 64 KiB), through an evaluator
//                supplied by the caller (the torch adapter runs ATen); the result becomes a new constant.
//                Its rule "constant_fold.prepacked" folds the prepacking steps (Note [Prepacked weights]).
//
// run_pipeline runs them in order, times each, verifies the graph after each, and leaves out those named
// in FUSION_JIT_DISABLE (a pass, a rule set, or one rule as "set.rule"). With FUSION_JIT_DUMP=ir it prints
// the graph after each pass that changed it, with the rules that fired and the nodes they replaced. The
// count of each rule's applications is left in the graph's notes, which explain shows.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/rewrite.h"

namespace fusion_jit {

// The decompositions as a rule set, and the whole set applied to a fixed point (no rule disabled).
const RuleSet& decompositions();
// The rules around convolutions (Note [Convolution rules], conv_common.h; a file per rule set): "fold"
// (fold_rules.cpp) folds a frozen batch_norm into the convolution before it; "epilogue"
// (epilogue_rules.cpp) turns a convolution and its activation into one oneDNN call with the activation as a
// post-op.
const RuleSet& fold_rules();
const RuleSet& epilogue_rules();
// "prepack" (prepack_rules.cpp): a convolution with a frozen weight that no epilogue took, as the same
// oneDNN call without a post-op, for the weight reordered once.
const RuleSet& prepack_rules();
// "layout": a channels-last plan's oneDNN convolution on an NCHW input of a few channels takes it through
// our channels-last copy (Note [A convolution's NCHW input copied by our kernel], layout_rules.cpp).
const RuleSet& layout_rules();
// "attention": softmax(q @ k^T * scale [+ mask]) @ v as aten::scaled_dot_product_attention (Note
// [Attention rule], attention_rules.cpp).
const RuleSet& attention_rules();
// "views": a view of a pointwise op's result moved to the op's inputs (Note [Views through pointwise ops],
// view_rules.cpp).
const RuleSet& view_rules();
// Tells the rules which ATen schemas this build of torch has ("mkldnn::_convolution_pointwise"); the
// torch adapter sets it when the library loads. Unset (tests of the IR alone), every schema is taken as
// present.
void set_schema_probe(bool (*probe)(const std::string& schema));
// Tells the oneDNN rules whether oneDNN takes bfloat16 on this CPU (ATen's mkldnn_bf16_device_check:
// AVX512BW, VL and DQ, or AVX-NE-CONVERT; its bfloat16 ops throw on other CPUs); the torch adapter sets it
// when the library loads. Unset, bfloat16 is taken as supported.
void set_onednn_bf16_probe(bool (*probe)());
// "gemm": linears whose weight is given at each call (not frozen) as oneDNN's GEMM where it is faster here
// (Note [GEMM backend measured on this machine], gemm_rules.cpp).
const RuleSet& gemm_rules();
// Median times of one float32 linear [rows, k] x [k, n] (+ bias [n] where `bias`) on this machine, in
// microseconds, by MKL and by oneDNN. On a plain weight (`prepacked` false): ATen's GEMM (addmm, MKL's
// sgemm) against mkldnn::_linear_pointwise on the weight as it is. On a frozen weight (`prepacked` true):
// MKL's packed GEMM (mkl::_mkl_linear) against mkldnn::_linear_pointwise on oneDNN's reordered weight, each
// weight prepared once, outside the timing.
struct GemmTiming {
  double mkl_us = 0;
  double onednn_us = 0;
};
using GemmProbe = std::optional<GemmTiming> (*)(int64_t rows, int64_t k, int64_t n, bool bias, bool prepacked);
// Tells the gemm and prepack rules how to time a linear on this machine; the torch adapter sets it when the
// library loads (nullopt: not measured; the rules keep their defaults, ATen's GEMM for a plain weight and
// MKL's packed one for a frozen float32 weight). Returns the probe set before (tests set their own).
GemmProbe set_gemm_probe(GemmProbe probe);
// A 2-d convolution as the conv probe times it: input [N, C, H, W], weight [O, C / groups, kh, kw], literal
// stride, padding, dilation and groups, float32 or bfloat16, with or without a bias.
struct ConvShape {
  std::vector<int64_t> x, w, stride, padding, dilation;
  int64_t groups = 1;
  DType dtype = DType::kFloat32;
  bool bias = false;
};
// Median times of one convolution on this machine, in microseconds, for each implementation a plan may
// give it (Note [Convolutions timed on this machine], passes/conv_common.h): ATen's convolution on an NCHW
// input (eager's: oneDNN on its blocked layout, the result reordered to NCHW), oneDNN's call on the weight
// reordered once with a channels-last input and result (a channels-last plan's), the same call on the plain
// weight with an NCHW input and result (prepack.nchw_result's), and the copy of a channels-last result to
// NCHW.
struct ConvTiming {
  double aten_us = 0;
  double onednn_cl_us = 0;
  double onednn_nchw_us = 0;
  double copy_us = 0;
};
using ConvProbe = std::optional<ConvTiming> (*)(const ConvShape& shape);
// Tells the layout decision and the prepack rules how to time a convolution here; the torch adapter sets it
// when the library loads. Returns the probe set before (tests set their own).
ConvProbe set_conv_probe(ConvProbe probe);
// The probe's times for `shape`; nullopt where nothing was measured (no probe, oneDNN absent, or
// FUSION_JIT_DISABLE=conv_timing): the decisions then take the cost model's estimates.
std::optional<ConvTiming> conv_timing(const ConvShape& shape);
// The next power of two from `n` (n >= 1): the row count a linear is timed at, and the batch-size hint of
// the oneDNN weight reorders. One decision and one reordered weight per octave, so that the sizes of a
// dynamic dimension share the measurement, the rewrite and the folded weight.
int64_t size_octave(int64_t n);
bool decompose(Graph& g);
bool dce(Graph& g);
bool cse(Graph& g);

// Evaluates node `n` whose value arguments are all constants; returns the constants-table index of each
// output, or nullopt when it cannot (the node is then left as it is).
using ConstantEvaluator = std::function<std::optional<std::vector<int64_t>>(const Node& n)>;
// `fold_prepacked` false: steps that prepack a weight (is_prepack) are left as they are.
bool constant_fold(Graph& g, const ConstantEvaluator& eval, bool fold_prepacked = true);

// Note [Prepacked weights]
// The oneDNN and MKL rules (Note [Convolution rules]) read a frozen weight through a step that reorders it
// into the library's layout for this machine: mkldnn::_reorder_convolution_weight and
// mkldnn::_reorder_linear_weight (oneDNN's blocked layout, chosen by the CPU's instruction set) and
// mkl::_mkl_reorder_linear_weight (MKL's packed GEMM buffer, opaque bytes). The JIT folds them at plan build
// like any other step of constants. A package must not store their result, which another CPU may not read
// the same way: it is built with the rule "constant_fold.prepacked" left out, stores the plain weight, and
// evaluates each such step once when it loads, on the machine that runs it (prepack_at_load,
// torch/executor.h). Leaving the rule out of the JIT (FUSION_JIT_DISABLE=constant_fold.prepacked) reorders
// at every call instead.
bool is_prepack(const std::string& schema);

struct PassTiming {
  std::string name;
  double ms;
  bool changed;
  std::vector<RuleApplication> rewrites;  // a rule set's applications, in order
};
// `skip`: passes, rule sets or rules left out of this run besides FUSION_JIT_DISABLE's.
std::vector<PassTiming> run_pipeline(Graph& g, const ConstantEvaluator& eval, const std::set<std::string>& skip = {});

// The names FUSION_JIT_DISABLE may give for the pipeline: its passes, its rule sets and their rules
// ("decompose.softmax"). The pipeline registers them with the option table when the library loads.
std::vector<std::string> pipeline_names();

}  // namespace fusion_jit
